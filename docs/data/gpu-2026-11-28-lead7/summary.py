import csv, collections, sys
rows = list(csv.DictReader(open(sys.argv[1])))
for db in sorted({r["db"] for r in rows}):
    rs = [r for r in rows if r["db"] == db]
    trials = [r for r in rs if r["remeasure"] == "0"]
    t = sorted(float(r["record_s"]) for r in trials)
    fin = [float(r["record_s"]) for r in rs if r["remeasure"] == "1"]
    end = max(t + fin)
    mid = [x for x in t if t[len(t)//10] <= x <= t[9*len(t)//10]]
    rate = (len(mid) - 1) / (mid[-1] - mid[0]) if len(mid) > 1 and mid[-1] > mid[0] else 0
    print(f"{db}: trials {len(trials)} first {t[0]:.1f} s last {t[-1]:.1f} s, 10-90% of trials at {rate:.1f}/s; finalist records {len(fin)} until {max(fin or [0]):.1f} s; {len(rs)} records / {end:.1f} s = {len(rs)/end:.2f} configs/s over the job")
    by = collections.defaultdict(list)
    for r in trials: by[r["worker"]].append(r)
    for w, ws in sorted(by.items()):
        cm = sorted(float(r["compile_ms"]) for r in ws); mm = sorted(float(r["measure_ms"]) for r in ws)
        lat = sorted(float(r["record_s"]) - float(r["task_created_s"]) for r in ws)
        print(f"  worker {w}: {len(ws)} trials, {len({r['idx'] for r in ws})} workloads, compile ms median {cm[len(cm)//2]:.0f} p90 {cm[9*len(cm)//10]:.0f}, measure ms median {mm[len(mm)//2]:.0f} sum {sum(mm)/1e3:.1f} s, task->record s median {lat[len(lat)//2]:.2f}")
    bins = collections.Counter(int(float(r["record_s"]) // 5) * 5 for r in trials)
    fb = collections.Counter(int(float(r["record_s"]) // 5) * 5 for r in rs if r["remeasure"] == "1")
    print("  trials per 5 s:", " ".join(f"{k}:{v}" for k, v in sorted(bins.items())), "| finalist records:", " ".join(f"{k}:{v}" for k, v in sorted(fb.items())))
