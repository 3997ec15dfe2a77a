import json, re, sys
rows = [r for f in sys.argv[1:] for r in json.load(open(f))["rows"]]
print(f"{'layer':<52} {'ours us':>8} {'cuDNN us':>8} {'x':>6} {'TB/s':>6}  config")
for r in rows:
    w = r["workload"]
    m = re.match(r"conv2d/n(\d+)h(\d+)w(\d+)c(\d+)/k(\d+)r(\d+)s(\d+)/pad(\d+)x(\d+),stride(\d+)x", w)
    n, h, wd, c, k, R, S, ph, pw, st = map(int, m.groups())
    p, q = (h + 2 * ph - R) // st + 1, (wd + 2 * pw - S) // st + 1
    io = 2 if "beta=1" in w else 1
    by = 2 * (n * h * wd * c + k * c * R * S + io * n * p * q * k)
    b, v = r.get("best_us"), r.get("vendor_us")
    name = w.split("/")[1] + "/" + w.split("/")[2] + "/s" + str(st) + "/" + w.split("/")[-1]
    tbs = by / (b * 1e-6) / 1e12 if b else float("nan")
    cfg = r["job"]["workloads"][0]["best"]["config"]
    print(f"{name:<52} {b or float('nan'):8.2f} {v or float('nan'):8.2f} {(v / b) if b and v else float('nan'):6.3f} {tbs:6.2f}  {cfg.get('epilogue')}/{cfg.get('schedule')} {cfg.get('block_m')}x{cfg.get('block_n')}")
