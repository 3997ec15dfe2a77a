#!/usr/bin/env python3
"""Issue 39's energy and regime bars, read from what `scripts/gpu-check.sh energy` wrote.

  energy-check.py counter OUT.json       NVML's energy counter polled in a tight loop (libnvidia-ml
                                         through ctypes) while torch runs a matmul loop (a python3
                                         with torch: on the H200s put /opt/torch/.venv/bin first on
                                         PATH): how often it publishes, how windows of 0.1-1.5 s agree
  energy-check.py repeat A B LONG        records (JSON lines) of the same configs in two runs and at
                                         twice the K: energies within 5%? 2K reads 1.9-2.1x?
  energy-check.py configs RECORDS... N   "key<TAB>template<TAB>config" of the N fastest ok configs, the
                                         workloads taken in turn (ENERGY_REGIME_WORKLOADS: only those whose
                                         key contains one of its words)
  energy-check.py regimes RECORDS... -- SELFTEST_JSON...
                                         each burst record against the cool-start selftest of its
                                         config, each sustained one against its 30-second hold
  energy-check.py winners BURST SUSTAINED OUT.json
                                         records of the same random configs (same seed) tuned in each
                                         regime: per workload each regime's winner and its time in
                                         the other regime; the picks of the time objective, the energy
                                         objective and --max-slowdown 3% (as the tracker's
                                         finalists.rs ranks), time and joules each, in both regimes
  energy-check.py finalists BENCH.json K [WORDS...]
                                         "key<TAB>template<TAB>config" of each workload's K first
                                         finalists (its winner first; only workloads whose key
                                         contains one of WORDS): the list `selftest --list` times
  energy-check.py tuned DIR NAME         scripts/energy-tuned.sh's tables: burst records against
                                         cool-start shots, sustained times against 30 s holds,
                                         each regime's winner in the other, the time, energy, edp
                                         and 3% picks among the finalists in each regime
  energy-check.py export GEMM_CHECK_LOG...
                                         each kernel's ours/vendor against its record's ("vs-rec")
                                         in every run of examples/bundle/gemm_check.c: how many
                                         within 3%, and its check
  energy-check.py picks DIR NAME         the picks of the jobs themselves: DIR/NAME-REGIME-bench.json
                                         (time) and NAME-REGIME-OBJ-bench.json (energy, edp, slow3) of
                                         the same trials, time and joules each, and each pick's record
                                         in the other regime (DIR/NAME-OTHER.jsonl)
"""
import json
import os
import statistics as st
import subprocess
import sys
import time


def load(path):
    out = []
    for line in open(path):
        if line.strip():
            out.append(json.loads(line))
    return out


def cfg(r):
    return json.dumps(r["config"], sort_keys=True, separators=(",", ":"))


def counter(out_path):
    import ctypes

    nv = ctypes.CDLL("libnvidia-ml.so.1")
    assert nv.nvmlInit_v2() == 0
    dev = ctypes.c_void_p()
    assert nv.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(dev)) == 0
    e = ctypes.c_ulonglong()

    def energy():
        nv.nvmlDeviceGetTotalEnergyConsumption(dev, ctypes.byref(e))
        return e.value

    t0 = time.perf_counter()
    for _ in range(200):
        energy()
    call_ms = (time.perf_counter() - t0) / 200 * 1e3
    load_src = (
        "import torch,time,sys\n"
        "a=torch.randn(8192,8192,device='cuda',dtype=torch.float16);b=torch.randn_like(a)\n"
        "torch.cuda.synchronize();print('go',flush=True);t=time.time()\n"
        "while time.time()-t<6.0:\n"
        "  [torch.mm(a,b) for _ in range(20)];torch.cuda.synchronize()\n"
    )
    pr = subprocess.Popen([sys.executable, "-c", load_src], stdout=subprocess.PIPE, text=True)
    pr.stdout.readline()
    time.sleep(0.5)
    trace, last, end = [], None, time.perf_counter() + 5.0
    while time.perf_counter() < end:
        v = energy()
        t = time.perf_counter()
        if v != last:
            trace.append((t * 1e3, v))
            last = v
    pr.wait()
    trace = trace[1:]
    gaps = [b[0] - a[0] for a, b in zip(trace, trace[1:])]
    res = {"energy_call_ms": round(call_ms, 2), "publications": len(trace), "gap_ms_median": round(st.median(gaps), 2),
           "gap_ms_min_max": [round(min(gaps), 2), round(max(gaps), 2)], "windows": {}}
    for n in (1, 5, 10, 15):
        ws = [(trace[i + n][1] - trace[i][1]) / (trace[i + n][0] - trace[i][0]) for i in range(0, len(trace) - n, n)]
        if len(ws) >= 2:
            res["windows"][f"{n * 100}ms"] = {"n": len(ws), "median_w": round(st.median(ws), 1),
                                             "spread_pct": round(100 * (max(ws) - min(ws)) / st.median(ws), 2)}
    json.dump({"summary": res, "trace": trace}, open(out_path, "w"))
    print("nvml counter:", json.dumps(res))


def repeat(a_path, b_path, long_path):
    def by_cfg(p):
        return {cfg(r): r for r in load(p) if r.get("energy_mj")}

    a, b, long = by_cfg(a_path), by_cfg(b_path), by_cfg(long_path)
    rows = []
    for c in a:
        row = {"config": c, "us_a": a[c]["median_us"], "mj_a": a[c]["energy_mj"], "w_a": a[c]["power_w"]}
        if c in b:
            row.update(us_b=b[c]["median_us"], mj_b=b[c]["energy_mj"], w_b=b[c]["power_w"],
                       diff=abs(a[c]["energy_mj"] - b[c]["energy_mj"]) / min(a[c]["energy_mj"], b[c]["energy_mj"]))
        if c in long:
            row.update(us_2k=long[c]["median_us"], mj_2k=long[c]["energy_mj"],
                       e_ratio=long[c]["energy_mj"] / a[c]["energy_mj"], t_ratio=long[c]["median_us"] / a[c]["median_us"])
        rows.append(row)
    print(f"{'config':>4} {'us a':>8} {'mJ a':>8} {'W a':>5} {'mJ b':>8} {'W b':>5} {'diff':>6} {'us 2K':>8} "
          f"{'mJ 2K':>8} {'E x':>6} {'t x':>6}")
    for i, r in enumerate(rows):
        print(f"{i:>4} {r['us_a']:8.1f} {r['mj_a']:8.2f} {r['w_a']:5.0f} {r.get('mj_b', 0):8.2f} {r.get('w_b', 0):5.0f} "
              f"{100 * r.get('diff', 0):5.1f}% {r.get('us_2k', 0):8.1f} {r.get('mj_2k', 0):8.2f} "
              f"{r.get('e_ratio', 0):6.3f} {r.get('t_ratio', 0):6.3f}")
    diff = [r["diff"] for r in rows if "diff" in r]
    if diff:
        print(f"energy repeat: {len(diff)} configs in both runs, {sum(d <= 0.05 for d in diff)} within 5%, "
              f"median {100 * st.median(diff):.2f}%, worst {100 * max(diff):.2f}%")
    two = [r for r in rows if "e_ratio" in r]
    if two:
        doubled = [r for r in two if 1.9 <= r["t_ratio"] <= 2.1]
        pw = [r["e_ratio"] / r["t_ratio"] for r in two]
        print(f"2K vs K: {len(two)} configs, {sum(1.9 <= r['e_ratio'] <= 2.1 for r in two)} read 1.9-2.1x the energy "
              f"(range {min(r['e_ratio'] for r in two):.3f}-{max(r['e_ratio'] for r in two):.3f}); of the "
              f"{len(doubled)} whose time doubled (1.9-2.1x), {sum(1.9 <= r['e_ratio'] <= 2.1 for r in doubled)}; "
              f"energy ratio over time ratio {min(pw):.3f}-{max(pw):.3f}")
    unknown = sum(1 for r in load(a_path) if r.get("energy_mj") is None)
    print(f"records without an energy in run a: {unknown}")
    return rows


def configs(paths, n):
    """The fastest ok configs of each workload, taken in turn until n: the fast ones reach the
    power cap, where the regimes differ."""
    by_workload, only = {}, os.environ.get("ENERGY_REGIME_WORKLOADS", "").split()
    for p in paths:
        for r in load(p):
            if r.get("status") == "ok" and (not only or any(o in r["workload"] for o in only)):
                by_workload.setdefault(r["workload"], {}).setdefault((r["template"], cfg(r)), r["median_us"])
    queues = [sorted(v.items(), key=lambda kv: kv[1]) for v in by_workload.values()]
    picked = []
    while len(picked) < n and any(queues):
        for key, q in zip(by_workload, queues):
            if q and len(picked) < n:
                (template, c), _ = q.pop(0)
                picked.append((key, template, c))
    for key, template, c in picked:
        print(f"{key}\t{template}\t{c}")


def regimes(records, selftests):
    refs = {}
    for p in selftests:
        try:
            rep = json.load(open(p))
        except (OSError, ValueError):
            continue
        kind = "hold" if "hold" in os.path.basename(p) else "cool"
        for c in rep.get("checks", []):
            if c.get("status") == "ok":
                refs[(kind, c["workload"], json.dumps(json.loads(c["config"]), sort_keys=True, separators=(",", ":")))] = c
    rows = []
    for p in records:
        for r in load(p):
            if r.get("status") != "ok":
                continue
            kind = "hold" if r["regime"] == "sustained" else "cool"
            ref = refs.get((kind, r["workload"], cfg(r)))
            if ref is None:
                continue
            rows.append({"workload": r["workload"], "config": r["config"], "regime": r["regime"], "us": r["median_us"],
                         "mhz": r.get("mean_clock_mhz"), "w": r.get("power_w"), "mj": r.get("energy_mj"),
                         "steady": r.get("steady"), "settle_ms": r.get("settle_ms"), "vendor_us": r.get("baseline_us"),
                         "ref": kind, "ref_us": ref["median_us"], "ref_clock": ref.get("sm_clock_mhz"),
                         "ref_mhz": ref.get("mean_clock_mhz"), "ref_w": ref.get("power_w"),
                         "ref_trace": ref.get("trace", [])})
    print(f"{'workload':<34} {'regime':<9} {'record us':>9} {'MHz':>5} {'W':>4} {'settle':>7} {'ref':<4} {'ref us':>9} "
          f"{'MHz':>5} {'W':>4} {'diff':>6}")
    for r in rows:
        d = r["us"] / r["ref_us"] - 1
        r["diff"] = d
        print(f"{r['workload'].split('/')[1] + '/' + r['workload'].split('/')[3]:<34} {r['regime']:<9} {r['us']:9.2f} "
              f"{r['mhz'] or 0:5.0f} {r['w'] or 0:4.0f} {(r['settle_ms'] or 0) / 1e3:6.1f}s {r['ref']:<4} {r['ref_us']:9.2f} "
              f"{r['ref_mhz'] or r['ref_clock'] or 0:5.0f} {r['ref_w'] or 0:4.0f} {100 * d:+5.1f}%")
    for regime, ref in (("burst", "cool-start samples"), ("sustained", "its 30-second hold")):
        sel = [r for r in rows if r["regime"] == regime]
        if sel:
            print(f"{regime}: {sum(abs(r['diff']) <= 0.03 for r in sel)} of {len(sel)} records within 3% of {ref}")
    return rows


def winners(burst_path, sustained_path):
    """Each regime's pick per workload (the fastest; the least energy; the least energy within 3%
    of the fastest) among ok records with an energy, and the same config's record in the other
    regime."""
    recs = {}
    for regime, p in (("burst", burst_path), ("sustained", sustained_path)):
        for r in load(p):
            if r.get("status") == "ok" and r.get("energy_mj"):
                recs.setdefault(r["workload"], {}).setdefault(regime, {})[(r["template"], cfg(r))] = r
    rows = []
    for w, by in recs.items():
        if set(by) != {"burst", "sustained"}:
            continue
        row = {"workload": w, "configs": {g: len(v) for g, v in by.items()}}
        for regime, other in (("burst", "sustained"), ("sustained", "burst")):
            mine = by[regime]
            fastest = min(mine, key=lambda c: mine[c]["median_us"])
            least = min(mine, key=lambda c: mine[c]["energy_mj"])
            bound = mine[fastest]["median_us"] * 1.03
            near = min((c for c in mine if mine[c]["median_us"] <= bound), key=lambda c: mine[c]["energy_mj"])
            picks = {}
            for name, c in (("time", fastest), ("energy", least), ("slowdown3", near)):
                r, o = mine[c], by[other].get(c)
                picks[name] = {"config": c, "template": c[0], "us": r["median_us"], "mj": r["energy_mj"],
                               "w": r.get("power_w"), "mhz": r.get("mean_clock_mhz"), "vendor_us": r.get("baseline_us"),
                               "other_us": o["median_us"] if o else None, "other_mj": o["energy_mj"] if o else None}
            row[regime] = picks
        b, t = row["burst"]["time"], row["sustained"]["time"]
        row["same_winner"] = b["config"] == t["config"]
        # Where the winners differ: how much each regime loses with the other's winner.
        row["burst_loss"] = b["other_us"] and t["other_us"] and t["other_us"] / b["us"] - 1
        row["sustained_loss"] = t["other_us"] and b["other_us"] and b["other_us"] / t["us"] - 1
        rows.append(row)
    short = lambda w: w.split("/")[1] + "/" + w.split("/")[2] + "/" + w.split("/")[3].split(",")[0]
    print(f"{'workload':<28} {'n':>3} {'burst win us':>12} {'in sust':>8} {'sust win us':>11} {'in burst':>8} "
          f"{'same':>5} {'loss b/s':>12}")
    for r in rows:
        b, t = r["burst"]["time"], r["sustained"]["time"]
        loss = "-" if r["same_winner"] else f"{100 * (r['burst_loss'] or 0):+.1f}/{100 * (r['sustained_loss'] or 0):+.1f}%"
        print(f"{short(r['workload']):<28} {r['configs']['burst']:>3} {b['us']:12.2f} {b['other_us'] or 0:8.2f} "
              f"{t['us']:11.2f} {t['other_us'] or 0:8.2f} {'yes' if r['same_winner'] else 'no':>5} {loss:>12}")
    print(f"winners: {sum(r['same_winner'] for r in rows)} of {len(rows)} workloads pick the same config in both regimes")
    print(f"{'workload':<28} {'regime':<9} {'time pick us/mJ':>17} {'energy pick us/mJ':>19} {'3% pick us/mJ':>17} "
          f"{'same':>5}")
    for r in rows:
        for regime in ("burst", "sustained"):
            p = r[regime]
            cell = lambda k: f"{p[k]['us']:8.2f}/{p[k]['mj']:8.3f}"
            print(f"{short(r['workload']):<28} {regime:<9} {cell('time'):>17} {cell('energy'):>19} {cell('slowdown3'):>17} "
                  f"{'yes' if p['time']['config'] == p['energy']['config'] else 'no':>5}")
    for regime in ("burst", "sustained"):
        diff = [r for r in rows if r[regime]["time"]["config"] != r[regime]["energy"]["config"]]
        gain = [1 - r[regime]["energy"]["mj"] / r[regime]["time"]["mj"] for r in diff]
        cost = [r[regime]["energy"]["us"] / r[regime]["time"]["us"] - 1 for r in diff]
        print(f"{regime}: the energy objective picks another config on {len(diff)} of {len(rows)} workloads"
              + (f" (energy -{100 * min(gain):.1f}..-{100 * max(gain):.1f}%, time +{100 * min(cost):.1f}..+{100 * max(cost):.1f}%)"
                 if diff else ""))
    for r in rows:  # JSON keys must be strings
        for regime in ("burst", "sustained"):
            for p in r[regime].values():
                p["config"] = p["config"][1]
    return rows


def picks(out_dir, name):
    """Per workload and regime, the pick of each objective's bench job (its best record) and the
    same config's record in the other regime."""
    objectives = ("time", "energy", "edp", "slow3")
    short = lambda w: "/".join(w.split("/")[1:3]) + "/" + w.split("/")[3].split(",")[0]
    rows = []
    for regime, other in (("burst", "sustained"), ("sustained", "burst")):
        try:
            others = {(r["workload"], cfg(r)): r for r in load(os.path.join(out_dir, f"{name}-{other}.jsonl"))}
        except OSError:
            others = {}
        best = {}
        for o in objectives:
            path = os.path.join(out_dir, f"{name}-{regime}-bench.json" if o == "time" else f"{name}-{regime}-{o}-bench.json")
            try:
                bench = json.load(open(path))
            except (OSError, ValueError):
                continue
            for row in bench.get("rows", []):
                for w in row.get("job", {}).get("workloads", []):
                    if w.get("best"):
                        best.setdefault(w["workload"], {})[o] = w["best"]
        for w, by in best.items():
            if "time" not in by:
                continue
            row = {"workload": w, "regime": regime}
            for o, r in by.items():
                c = json.dumps(r["config"], sort_keys=True, separators=(",", ":"))
                twin = others.get((w, c))
                row[o] = {"config": r["config"], "us": r["median_us"], "mj": r.get("energy_mj"),
                          "other_us": twin and twin["median_us"], "other_mj": twin and twin.get("energy_mj"),
                          "same_as_time": o == "time" or r["id"] == by["time"]["id"]}
            rows.append(row)
    cell = lambda p: "-" if not p else f"{p['us']:9.2f}/{p['mj'] or 0:8.2f}" + ("" if p["same_as_time"] else "*")
    print(f"{name}: each job's pick, us/mJ (* another config than the time pick); in the other regime: the time pick's us")
    print(f"{'workload':<26} {'regime':<9} {'time':>18} {'energy':>19} {'edp':>19} {'3% slower':>19} {'other':>9}")
    for r in rows:
        t = r["time"]
        print(f"{short(r['workload']):<26} {r['regime']:<9} {cell(t):>18} {cell(r.get('energy')):>19} "
              f"{cell(r.get('edp')):>19} {cell(r.get('slow3')):>19} {t['other_us'] or 0:9.2f}")
    for regime in ("burst", "sustained"):
        sel = [r for r in rows if r["regime"] == regime]
        for o in objectives[1:]:
            diff = [r for r in sel if o in r and not r[o]["same_as_time"]]
            gain = [1 - r[o]["mj"] / r["time"]["mj"] for r in diff if r[o]["mj"] and r["time"]["mj"]]
            cost = [r[o]["us"] / r["time"]["us"] - 1 for r in diff]
            print(f"{name} {regime} {o}: another pick than time on {len(diff)} of {len(sel)} workloads"
                  + (f" (energy {-100 * max(gain):+.1f}..{-100 * min(gain):+.1f}%, time {100 * min(cost):+.1f}..{100 * max(cost):+.1f}%)"
                     if gain and cost else ""))
    json.dump(rows, open(os.path.join(out_dir, f"{name}-picks.json"), "w"), indent=1)
    return rows


def canon(c):
    """A config (dict or JSON text) as canonical JSON."""
    return json.dumps(json.loads(c) if isinstance(c, str) else c, sort_keys=True, separators=(",", ":"))


def bench_workloads(path):
    out = []
    for row in json.load(open(path)).get("rows", []):
        out.extend(row.get("job", {}).get("workloads", []))
    return out


def finalists(bench_path, k, words):
    for w in bench_workloads(bench_path):
        if words and not any(o in w["workload"] for o in words):
            continue
        best, picked = w.get("best"), []
        if best:
            picked.append((best["template"], canon(best["config"])))
        for f in w.get("finalists", []):
            c = (f["template"].split(" ")[0], canon(f["config"]))
            if c not in picked:
                picked.append(c)
        for template, c in picked[:k]:
            print(f"{w['workload']}\t{template}\t{c}")


def checks(path):
    try:
        return [c for c in json.load(open(path)).get("checks", []) if c.get("status") == "ok"]
    except (OSError, ValueError):
        return []


def tuned(d, name):
    """Tables of scripts/energy-tuned.sh (see the module's notes); writes d/NAME-tuned.json."""
    short = lambda w: "/".join(w.split("/")[1:3]) + "/" + w.split("/")[3].split(",")[0]
    bench = {w["workload"]: w for w in bench_workloads(os.path.join(d, f"{name}-bench.json"))}
    records = {}
    try:
        for r in load(os.path.join(d, f"{name}-records.jsonl")):
            if r.get("status") == "ok":
                records.setdefault((r["workload"], r["template"], cfg(r)), []).append(r)
    except OSError:
        pass
    import glob
    reg = {g: {(c["workload"], c["template"], canon(c["config"])): c
               for p in sorted(glob.glob(os.path.join(d, f"{name}-{g}-*.json"))) for c in checks(p)}
           for g in ("burst", "sustained")}
    out = {"suite": name, "regimes": [], "workloads": []}
    # The regimes bar: the burst record (the job's winner: its finalist record; its trial beside it)
    # against cool-start shots; the sustained time against the 30 s hold.
    print(f"{name}: regimes (us; record = the job's best, a finalist re-measurement, MHz read before its measurement; trial = "
          f"its tuning trial; cool = cool-start shots, MHz before the samples, W over the energy window after them)")
    print(f"{'workload':<24} {'record':>9} {'MHz':>5} {'trial':>9} {'cool':>9} {'MHz':>5} {'W':>4} {'rec/cool':>8} "
          f"{'trial/cool':>10} {'cool samples':>19} | {'sustained':>9} {'MHz':>5} {'W':>4} {'hold':>9} {'MHz':>5} {'W':>4} {'diff':>6}")
    n = 1
    while os.path.exists(os.path.join(d, f"{name}-cool-{n}.json")) or os.path.exists(os.path.join(d, f"{name}-hold-{n}.json")):
        cool = (checks(os.path.join(d, f"{name}-cool-{n}.json")) or [None])[0]
        hold = (checks(os.path.join(d, f"{name}-hold-{n}.json")) or [None])[0]
        n += 1
        ref = cool or hold
        if ref is None:
            continue
        key = (ref["workload"], ref["template"], canon(ref["config"]))
        w = bench.get(ref["workload"], {})
        best = w.get("best") or {}
        trial = [r for r in records.get(key, []) if not r.get("remeasure")]
        row = {"workload": ref["workload"], "template": ref["template"], "config": key[2],
               "record_us": best.get("median_us"), "record_clock": (best.get("provenance") or {}).get("sm_clock_mhz"),
               "trial_us": trial[0]["median_us"] if trial else None,
               "vendor_record_us": best.get("baseline_us")}
        if cool:
            row.update(cool_us=cool["median_us"], cool_samples=cool.get("samples_us", []), cool_mhz=cool.get("mean_clock_mhz"),
                       cool_clock=cool.get("sm_clock_mhz"), cool_w=cool.get("power_w"))
        s = reg["sustained"].get(key)
        if s:
            row.update(sustained_us=s["median_us"], sustained_mhz=s.get("mean_clock_mhz"), sustained_w=s.get("power_w"),
                       sustained_settle_ms=s.get("settle_ms"), sustained_samples=s.get("samples_us", []))
        if hold:
            row.update(hold_us=hold["median_us"], hold_mhz=hold.get("mean_clock_mhz"), hold_w=hold.get("power_w"))
        ratio = lambda a, b: row.get(a) / row[b] - 1 if row.get(a) and row.get(b) else None
        row.update(record_vs_cool=ratio("record_us", "cool_us"), trial_vs_cool=ratio("trial_us", "cool_us"),
                   sustained_vs_hold=ratio("sustained_us", "hold_us"))
        out["regimes"].append(row)
        f = lambda v, p=".2f": "-" if v is None else format(v, p)
        pct = lambda v: "-" if v is None else f"{100 * v:+.1f}%"
        cs = row.get("cool_samples") or []
        print(f"{short(row['workload']):<24} {f(row['record_us']):>9} {f(row['record_clock'], '.0f'):>5} {f(row['trial_us']):>9} "
              f"{f(row.get('cool_us')):>9} {f(row.get('cool_clock'), '.0f'):>5} {f(row.get('cool_w'), '.0f'):>4} "
              f"{pct(row['record_vs_cool']):>8} {pct(row['trial_vs_cool']):>10} "
              f"{(f(min(cs)) + '..' + f(max(cs))) if cs else '-':>19} | {f(row.get('sustained_us')):>9} "
              f"{f(row.get('sustained_mhz'), '.0f'):>5} {f(row.get('sustained_w'), '.0f'):>4} {f(row.get('hold_us')):>9} "
              f"{f(row.get('hold_mhz'), '.0f'):>5} {f(row.get('hold_w'), '.0f'):>4} {pct(row['sustained_vs_hold']):>6}")
    for k, what in (("record_vs_cool", "burst records within 3% of cool-start shots"),
                    ("trial_vs_cool", "trial records within 3% of cool-start shots"),
                    ("sustained_vs_hold", "sustained times within 3% of the 30 s hold")):
        v = [r[k] for r in out["regimes"] if r.get(k) is not None]
        if v:
            print(f"{name}: {sum(abs(x) <= 0.03 for x in v)} of {len(v)} {what} ({100 * min(v):+.1f}..{100 * max(v):+.1f}%)")
    # Winners and picks among each workload's finalists, timed in both regimes.
    print(f"{name}: per workload, the finalists timed in each regime (us/mJ); vendor us per regime")
    print(f"{'workload':<24} {'n':>2} {'burst win':>16} {'in sust':>9} {'sust win':>16} {'in burst':>9} {'same':>4} "
          f"{'loss b/s':>13} {'vendor b/s':>17} {'e-pick b':>5} {'e-pick s':>5}")
    for wkey, w in bench.items():
        cands = {}
        for g in ("burst", "sustained"):
            for (wk, t, c), ch in reg[g].items():
                if wk == wkey:
                    cands.setdefault((t, c), {})[g] = ch
        both = {c: v for c, v in cands.items() if len(v) == 2}
        if not both:
            continue
        row = {"workload": wkey, "candidates": len(both), "vendor": {}}
        for g in ("burst", "sustained"):
            vend = [v[g].get("baseline_us") for v in cands.values() if g in v and v[g].get("baseline_us")]
            row["vendor"][g] = vend[0] if vend else None
        for g, o in (("burst", "sustained"), ("sustained", "burst")):
            us = lambda c: both[c][g]["median_us"]
            mj = lambda c: both[c][g].get("energy_mj") or float("inf")
            fastest = min(both, key=us)
            picks = {"time": fastest, "energy": min(both, key=mj), "edp": min(both, key=lambda c: mj(c) * us(c)),
                     "slow3": min((c for c in both if us(c) <= 1.03 * us(fastest)), key=mj)}
            row[g] = {p: {"template": c[0], "config": c[1], "us": us(c), "mj": both[c][g].get("energy_mj"),
                          "w": both[c][g].get("power_w"), "mhz": both[c][g].get("mean_clock_mhz"),
                          "other_us": both[c][o]["median_us"], "other_mj": both[c][o].get("energy_mj"),
                          "same_as_time": c == fastest} for p, c in picks.items()}
        b, s = row["burst"]["time"], row["sustained"]["time"]
        row["same_winner"] = b["config"] == s["config"] and b["template"] == s["template"]
        row["burst_loss"] = s["other_us"] / b["us"] - 1  # the sustained winner, timed in bursts
        row["sustained_loss"] = b["other_us"] / s["us"] - 1
        out["workloads"].append(row)
        vb, vs = row["vendor"]["burst"], row["vendor"]["sustained"]
        loss = "-" if row["same_winner"] else f"{100 * row['burst_loss']:+.1f}/{100 * row['sustained_loss']:+.1f}%"
        ep = lambda g: "same" if row[g]["energy"]["same_as_time"] else f"{100 * (row[g]['energy']['mj'] / row[g]['time']['mj'] - 1):+.1f}%"
        print(f"{short(wkey):<24} {len(both):>2} {b['us']:8.2f}/{b['mj'] or 0:7.2f} {b['other_us']:9.2f} "
              f"{s['us']:8.2f}/{s['mj'] or 0:7.2f} {s['other_us']:9.2f} {'yes' if row['same_winner'] else 'no':>4} "
              f"{loss:>13} "
              f"{(f'{vb:.2f}' if vb else '-') + '/' + (f'{vs:.2f}' if vs else '-'):>17} {ep('burst'):>5} {ep('sustained'):>5}")
    rows = out["workloads"]
    if rows:
        print(f"{name}: the same winner in both regimes on {sum(r['same_winner'] for r in rows)} of {len(rows)} workloads")
        for g in ("burst", "sustained"):
            for p in ("energy", "edp", "slow3"):
                diff = [r for r in rows if not r[g][p]["same_as_time"]]
                gain = [r[g][p]["mj"] / r[g]["time"]["mj"] - 1 for r in diff if r[g][p]["mj"] and r[g]["time"]["mj"]]
                cost = [r[g][p]["us"] / r[g]["time"]["us"] - 1 for r in diff]
                print(f"{name} {g} {p}: another pick than time on {len(diff)} of {len(rows)}"
                      + (f" (energy {100 * min(gain):+.1f}..{100 * max(gain):+.1f}%, time {100 * min(cost):+.1f}..{100 * max(cost):+.1f}%)"
                         if gain and cost else ""))
    json.dump(out, open(os.path.join(d, f"{name}-tuned.json"), "w"), indent=1)


def export(logs):
    import re
    rows = {}
    row_re = re.compile(r"^(\d+x\d+x\d+ \w+ \S+)\s+(\w+)\s+([\d.]+) us\s+([\d.]+) us\s+([\d.]+)\s+([\d.]+) us\s+"
                        r"([\d.]+) us\s+([\d.]+)\s+(\d+)\s+(.*?)\s+((?:ok|FAIL|mismatch).*)$")
    for path in logs:
        for line in open(path):
            m = row_re.match(line)
            if m:
                rows.setdefault(m.group(1), []).append({"us": float(m.group(3)), "record_us": float(m.group(4)),
                                                        "vendor_us": float(m.group(6)), "record_vendor_us": float(m.group(7)),
                                                        "vs_rec": float(m.group(8)), "check": m.group(11)[:2]})
    every = [r["vs_rec"] for v in rows.values() for r in v]
    for k, v in rows.items():
        col = lambda f, p: " ".join(format(r[f], p) for r in v)
        ok = "all checked ok" if all(r["check"] == "ok" for r in v) else "CHECK FAILED"
        print(f"{k:<28} vs-rec {col('vs_rec', '.3f')}  ours {col('us', '.2f')} (record {v[0]['record_us']:.2f})  "
              f"vendor {col('vendor_us', '.2f')} (record {v[0]['record_vendor_us']:.2f})  {ok}")
    if every:
        print(f"export: {len(rows)} kernels x {len(logs)} runs: {sum(abs(x - 1) <= 0.03 for x in every)} of {len(every)} within 3% "
              f"of the record's ours/vendor ({min(every):.3f}..{max(every):.3f})")


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "counter":
        counter(args[0])
    elif cmd == "repeat":
        rows = repeat(*args[:3])
        if len(args) > 3:
            json.dump(rows, open(args[3], "w"), indent=1)
    elif cmd == "configs":
        configs(args[:-1], int(args[-1]))
    elif cmd == "regimes":
        cut = args.index("--")
        out = args[-1] if args[-1].endswith("regimes.json") else None
        rows = regimes(args[:cut], [a for a in args[cut + 1:] if a != out])
        if out:
            json.dump(rows, open(out, "w"), indent=1)
    elif cmd == "winners":
        json.dump(winners(args[0], args[1]), open(args[2], "w"), indent=1)
    elif cmd == "picks":
        picks(args[0], args[1])
    elif cmd == "export":
        export(args)
    elif cmd == "finalists":
        finalists(args[0], int(args[1]), args[2:])
    elif cmd == "tuned":
        tuned(args[0], args[1])
    else:
        sys.exit(f"unknown command {cmd!r}: counter, repeat, configs, regimes, winners, picks, export, finalists or tuned")


if __name__ == "__main__":
    main()
