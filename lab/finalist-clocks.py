#!/usr/bin/env python3
"""Sets a bench database's records beside the clock samples of `CLOCKS=1 lab/gpu-lab.sh STEP`:
per workload, the SM clock, board power, temperature and clock-event reasons (0x4: software power
cap) over its trials and over its finalist task, then each finalist record (median of its round
medians, its vendor time, the first 12 of its samples, the vendor's kind).

  lab/finalist-clocks.py logs/large.db logs/clocks.csv

Made docs/data/large-finalist-rounds-h200-2026-11-26.txt.
"""
import datetime
import json
import sqlite3
import statistics
import sys


def samples(path):
    """(unix ms, clock MHz, power W, temperature C, reasons) of each line nvidia-smi wrote."""
    out = []
    for line in open(path):
        f = [x.strip() for x in line.split(",")]
        try:
            when = datetime.datetime.strptime(f[0], "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=datetime.timezone.utc)
            out.append((when.timestamp() * 1000, float(f[1].split()[0]), float(f[2].split()[0]), int(f[3]),
                        f[4] if len(f) > 4 else ""))
        except (ValueError, IndexError):
            pass
    return out


def window(clocks, start_ms, end_ms):
    """The clock, power, temperature and reasons sampled between two times, in one line."""
    s = [c for c in clocks if start_ms <= c[0] <= end_ms]
    if not s:
        return "n/a"
    reasons = {}
    for c in s:
        reasons[c[4]] = reasons.get(c[4], 0) + 1
    top = dict(sorted(reasons.items(), key=lambda r: -r[1])[:3])
    return "clk %4.0f MHz (min %4.0f) pow %3.0f W (max %3.0f) T %2d-%2d  n=%d reasons %s" % (
        statistics.mean(c[1] for c in s), min(c[1] for c in s), statistics.mean(c[2] for c in s),
        max(c[2] for c in s), min(c[3] for c in s), max(c[3] for c in s), len(s), top)


def main(db_path, csv_path):
    clocks = samples(csv_path)
    db = sqlite3.connect(db_path)
    for job, key in db.execute("select job_id, workload_key from job_workloads order by job_id"):
        count = "select min(created_ms), max(created_ms), count(*) from records where job_id = ? and remeasure = ?"
        trials = db.execute(count, (job, 0)).fetchone()
        finals = db.execute(count, (job, 1)).fetchone()
        print(key[:45])
        # A trial record is written when its measurement ends: the first began up to 3 s earlier.
        print("   trials   ", window(clocks, trials[0] - 3000, trials[1]))
        if finals[0]:
            print("   finalists", window(clocks, trials[1], finals[1]), "records", finals[2])
        rows = db.execute("select median_us, baseline_us, baseline_kind, samples, spread from records"
                          " where job_id = ? and remeasure = 1 order by id", (job,))
        for median, vendor, kind, times, spread in rows:
            first = [round(x, 1) for x in json.loads(times)][:12]
            print("     fin %8.2f vendor %8.2f spread %.3f samples %s | %s" % (median, vendor or 0, spread, first, kind[:40]))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
