# Per job of a tracker database: trials, first record, last trial, last record (s after the job was created), finalists' share of the job's wall, configs/s.
import sqlite3, sys
for db in sys.argv[1:]:
    c = sqlite3.connect(db)
    for jid, created in c.execute("select id, created_ms from jobs order by id").fetchall():
        rows = c.execute("select r.created_ms, r.remeasure from records r where r.job_id = ?", (jid,)).fetchall()
        trials = sorted(t for t, rem in rows if rem == 0); allr = sorted(t for t, _ in rows)
        if not trials: continue
        wl = c.execute("select workload_key from job_workloads where job_id = ? limit 1", (jid,)).fetchone()[0]
        first, tend, end = (trials[0] - created) / 1e3, (trials[-1] - created) / 1e3, (allr[-1] - created) / 1e3
        print(f"{db} job {jid} {wl[:60]:60s} trials {len(trials):4d} first {first:6.2f} trials-end {tend:6.2f} end {end:6.2f} s finalists {100 * (end - tend) / end:5.1f}% cfg/s {len(trials) / end:6.1f}")
