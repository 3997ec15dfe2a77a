import glob, json, os, re, statistics, sys
W = sys.argv[1]
def load(f):
    try: return json.load(open(f))
    except Exception: return None
print("== self-tests (every element checked)")
for f in sorted(glob.glob(f"{W}/selftest-list-*.json")):
    d = load(f)
    if d: c = d["checks"]; print(f"{os.path.basename(f)}: {sum(x['status']=='ok' for x in c)} ok of {len(c)}; uuid {d['device']['uuid']}")
print("== fixed configs, 28x28 128->512 residual (median of 20 samples, us; cuDNN as the self-test's baseline)")
rows = {}
for f in sorted(glob.glob(f"{W}/fixed28-*.json"), key=os.path.getmtime):
    d = load(f)
    if not d: continue
    v = os.path.basename(f).split("-")[1]
    for x in d["checks"]:
        cfg = json.loads(x["config"]); k = f"{cfg['schedule'][:4]} {cfg['block_m']}x{cfg['block_n']} s{cfg['stages']} r{cfg['raster']}"
        rows.setdefault(k, {}).setdefault(v, []).append((x["median_us"], x["status"], x.get("baseline_us")))
for k, r in rows.items():
    print(f"{k:<24} " + "  ".join(f"{v}: " + " ".join(f"{t:.2f}{'' if s=='ok' else '!'+s}" for t, s, _ in r[v]) for v in ("18", "19", "19d") if v in r)
          + "  cuDNN: " + " ".join(f"{b:.2f}" for v in r for _, _, b in r[v] if b))
print("== bench (best_us / vendor_us, x), per run in run order")
def name(w):
    m = re.match(r"conv2d/n\d+h(\d+)w\d+c(\d+)/k(\d+)r\d+s\d+/pad\d+x\d+,stride(\d)", w); return f"{m[1]}x{m[1]} {m[2]}->{m[3]} s{m[4]}" + (" C" if "beta=1" in w else "")
for f in sorted(glob.glob(f"{W}/bench*.json"), key=os.path.getmtime):
    d = load(f)
    if not d: print(os.path.basename(f), "unreadable"); continue
    for r in d["rows"]:
        b, vv = r.get("best_us"), r.get("vendor_us"); cfg = r["job"]["workloads"][0]["best"]["config"]
        print(f"{os.path.basename(f):<24} {name(r['workload']):<22} {b or 0:7.2f} {vv or 0:7.2f} {(vv / b) if b and vv else 0:6.3f}  {cfg.get('epilogue')}/{cfg.get('schedule')} {cfg.get('block_m')}x{cfg.get('block_n')} s{cfg.get('stages')} {cfg.get('raster')}")
