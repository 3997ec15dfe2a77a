#!/usr/bin/env python3
"""Where a model job's wall went, from its tune.db (SQLite): per worker (one per GPU) the trials
and finalist re-measurements it recorded, when, and how busy its compile pool and GPU were; the
job's phases (created -> first record -> last trial -> last re-measurement -> done) and its rates.

Usage: model-timeline.py tune.db [job id]   (default: the last job)
"""

import sqlite3
import sys


def main():
    db = sqlite3.connect(sys.argv[1])
    q = lambda sql, *a: db.execute(sql, a).fetchall()  # noqa: E731
    job = int(sys.argv[2]) if len(sys.argv) > 2 else q("SELECT max(id) FROM jobs")[0][0]
    (created, finished), = q("SELECT created_ms, coalesce(finished_ms, updated_ms) FROM jobs WHERE id = ?", job)
    s = lambda ms: (ms - created) / 1000.0  # noqa: E731
    rows = q("SELECT worker_id, remeasure, created_ms, compile_ms, measure_ms FROM records WHERE job_id = ? "
             "AND task_id IN (SELECT id FROM tasks WHERE job_id = ?)", job, job)
    trials = [r for r in rows if not r[1]]
    remeasures = [r for r in rows if r[1]]
    if not trials:
        print(f"job {job}: no trial records")
        return
    first, last = min(r[2] for r in trials), max(r[2] for r in trials)
    fin_last = max((r[2] for r in remeasures), default=last)
    print(f"job {job}: created -> done {s(finished):.1f} s; first record {s(first):.1f} s, last trial {s(last):.1f} s, "
          f"last re-measurement {s(fin_last):.1f} s")
    n = len(trials)
    print(f"trials {n}: {n / s(finished):.1f}/s over the whole wall, {n / max(s(last), 1e-3):.1f}/s up to the last "
          f"trial (finalists outside), {n / max((last - first) / 1000.0, 1e-3):.1f}/s between the first and last trial")
    print("worker  trials  first    last  remeasures  fin.first  fin.last  compile s  measure s  measure/trial-phase")
    phase = max((last - first) / 1000.0, 1e-3)
    for wid in sorted({r[0] for r in rows}, key=lambda w: (w is None, w)):
        t = [r for r in trials if r[0] == wid]
        f = [r for r in remeasures if r[0] == wid]
        tf = (min(r[2] for r in t), max(r[2] for r in t)) if t else (created, created)
        ff = (min(r[2] for r in f), max(r[2] for r in f)) if f else (created, created)
        comp = sum(r[3] for r in t) / 1000.0
        meas = sum(r[4] for r in t) / 1000.0
        print(f"{wid!s:>6} {len(t):7d} {s(tf[0]):6.1f} {s(tf[1]):7.1f} {len(f):11d} {s(ff[0]):10.1f} {s(ff[1]):9.1f} "
              f"{comp:10.1f} {meas:10.1f} {meas / phase:20.2f}")
    fins = q("SELECT t.id, t.worker_id, t.created_ms, (SELECT min(r.created_ms) FROM records r WHERE r.task_id = t.id), "
             "t.attempts FROM tasks t WHERE t.job_id = ? AND t.kind = 'finalist' ORDER BY t.id", job)
    if fins:
        per = {}
        for _, wid, _, _, _ in fins:
            per[wid] = per.get(wid, 0) + 1
        made = sorted(s(c) for _, _, c, _, _ in fins)
        print(f"finalist tasks {len(fins)}: created {made[0]:.1f}-{made[-1]:.1f} s; per worker "
              + ", ".join(f"{w}: {c}" for w, c in sorted(per.items(), key=lambda x: (x[0] is None, x[0]))))
    per_s = {}
    for r in rows:
        k = int(s(r[2]))
        per_s[k] = per_s.get(k, 0) + 1
    print("records per second of the job: " + " ".join(f"{k}:{v}" for k, v in sorted(per_s.items())))


if __name__ == "__main__":
    main()
