# Per-record timeline of tracker databases: db, worker, workload, task created / record stored (s after the job's creation), compile/measure ms, remeasure, status, median.
import sqlite3, sys, csv
w = csv.writer(sys.stdout)
w.writerow(["db", "worker", "idx", "task_created_s", "record_s", "compile_ms", "measure_ms", "remeasure", "cache_hit", "status", "median_us"])
for db in sys.argv[1:]:
    c = sqlite3.connect(db)
    t0 = c.execute("select min(created_ms) from jobs").fetchone()[0]
    for row in c.execute("select r.worker_id, t.workload_idx, t.created_ms, r.created_ms, r.compile_ms, r.measure_ms, r.remeasure, r.cache_hit, r.status, r.median_us from records r join tasks t on t.id = r.task_id order by r.created_ms"):
        wk, idx, tc, rc, cm, mm, rem, ch, st, med = row
        w.writerow([db, wk, idx, f"{(tc - t0) / 1e3:.3f}", f"{(rc - t0) / 1e3:.3f}", f"{cm:.1f}", f"{mm:.1f}", rem, ch, st, f"{med:.2f}"])
