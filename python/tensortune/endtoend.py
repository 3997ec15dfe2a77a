"""The whole path for one model, as `examples/resnet50.py` and `examples/bert.py` run it: capture,
tune as one job through the CLI, export, apply, and time eager against tuned by CUDA-graph replay
of the whole forward, interleaved, in one process.

Timing: each forward (eager PyTorch, and the same model with the bundle applied) is captured once
in a CUDA graph; rounds alternate between them, each round replaying a graph `iters` times between
two CUDA events; the table shows the median round per launch. Output agreement: the max relative
error of the tuned output against eager's, over all elements, relative to eager's largest
magnitude (so near-zero elements do not dominate).
"""

import argparse
import json
import os
import statistics
import subprocess
import time

import torch

from .torch import apply, capture


def arguments(description, batch):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--batch", type=int, default=batch)
    p.add_argument("--total-trials", type=int, default=400, help="the tuning job's trials, shared by expected gain")
    p.add_argument("--trials", type=int, default=100, help="at most this many per workload")
    p.add_argument("--device", default="cuda:0", help="the embedded worker's device (cuda:all for every GPU)")
    p.add_argument("--tensortune", default=os.environ.get("TENSORTUNE", "tensortune"), help="the CLI binary")
    p.add_argument("--workdir", default="tensortune-e2e", help="suite, database, bundle and JSON go here")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--skip-tune", action="store_true", help="reuse the bundle in --workdir")
    args = p.parse_args()
    if args.batch < 1 or args.total_trials < 1 or args.trials < 1:
        p.error("--batch, --total-trials and --trials must be at least 1")
    return args


def _cli(args, *rest):
    cmd = [args.tensortune, "--db", os.path.join(args.workdir, "tune.db"), *rest]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def tune(args, suite_path):
    """Tunes the suite as one job and exports the bundle; returns (bundle dir, tuning wall s, the
    CLI's model report)."""
    report_path = os.path.join(args.workdir, "tune.json")
    bundle = os.path.join(args.workdir, "bundle")
    if args.skip_tune:
        return bundle, None, json.load(open(report_path))
    started = time.perf_counter()
    _cli(args, "tune", "--suite", suite_path, "--total-trials", str(args.total_trials), "--trials", str(args.trials),
         "--device", args.device, "--json", report_path)
    wall = time.perf_counter() - started
    _cli(args, "export", "--suite", suite_path, "-o", bundle, "--skip-untuned")
    return bundle, wall, json.load(open(report_path))


def graphed(fn):
    """`fn` captured in a CUDA graph (after a warm-up on a side stream); returns (replay, output)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    g.replay()
    torch.cuda.synchronize()
    return g.replay, out


def launched(fn):
    """`fn` run from the host each time (when a forward cannot be captured in a CUDA graph)."""
    out = fn()
    torch.cuda.synchronize()
    return fn, out


def interleaved(replays, rounds, iters):
    """Median microseconds per replay of each graph, alternating between them every round."""
    times = {name: [] for name in replays}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for r in range(rounds):
        order = list(replays.items()) if r % 2 == 0 else list(reversed(replays.items()))
        for name, replay in order:
            start.record()
            for _ in range(iters):
                replay()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) * 1e3 / iters)
    return {name: statistics.median(t) for name, t in times.items()}


def max_rel_error(got, want):
    got, want = got.float(), want.float()
    return ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()


def run(name, model, inputs, args, call=None):
    """Captures, tunes, exports, applies and times `model` on `inputs` (a tuple, or a dict of
    keyword inputs); prints the table and writes `<workdir>/<name>-e2e.json`."""
    os.makedirs(args.workdir, exist_ok=True)
    call = call or ((lambda m: m(**inputs)) if isinstance(inputs, dict) else (lambda m: m(*inputs)))
    suite_path = os.path.join(args.workdir, f"{name}.json")
    suite = capture(model, inputs, suite_path, name=name)
    occurrences = sum(e["count"] * e.get("batch", 1) for e in suite["workloads"])
    print(f"captured {len(suite['workloads'])} distinct workloads ({occurrences} ops) of {name}; "
          f"{len(suite.get('skipped', []))} ops not tunable", flush=True)
    bundle, wall, report = tune(args, suite_path)

    method = "CUDA-graph replay"
    with torch.no_grad():
        try:
            eager_replay, eager_out = graphed(lambda: call(model))
        except RuntimeError as e:
            print(f"the forward cannot be captured in a CUDA graph ({e}); timing host launches instead")
            method = "host launches"
        if method != "CUDA-graph replay":
            eager_replay, eager_out = launched(lambda: call(model))
        applied = apply(model, bundle)
        tuned_replay, tuned_out = (graphed if method == "CUDA-graph replay" else launched)(lambda: call(model))
        times = interleaved({"eager": eager_replay, "tuned": tuned_replay}, args.rounds, args.iters)
    first = lambda o: o if torch.is_tensor(o) else (o[0] if isinstance(o, (tuple, list)) else o.last_hidden_state)
    err = max_rel_error(first(tuned_out), first(eager_out))
    r = applied.report()
    result = {
        "model": name,
        "batch": args.batch,
        "method": method,
        "gpu": torch.cuda.get_device_name(),
        "eager_us": times["eager"],
        "tuned_us": times["tuned"],
        "speedup": times["eager"] / times["tuned"],
        "max_rel_error": err,
        "tuning_wall_s": wall,
        "total_trials": args.total_trials,
        "ours_launches": r["ours"],
        "fused_launches": r.get("fused", {}),
        "kept": r["kept"],
        "predicted": report.get("model"),
    }
    print(f"\n{name} batch {args.batch} on {result['gpu']} ({method}, interleaved, median of {args.rounds} rounds x {args.iters})")
    print(f"  eager   {times['eager']:10.1f} us")
    print(f"  tuned   {times['tuned']:10.1f} us   {result['speedup']:.3f}x eager")
    print(f"  max relative error of the output {err:.2e}")
    print(f"  ops on our kernels {r['ours']} ({sum(r.get('fused', {}).values())} fused conv chains); PyTorch's kept: {r['kept']}")
    if wall is not None:
        m = report.get("model", {})
        print(f"  tuning {wall:.1f} s for {args.total_trials} trials; predicted GEMM/conv time "
              f"{m.get('tuned_us', 0):.1f} us vs vendor {m.get('vendor_us', 0):.1f} us")
    with open(os.path.join(args.workdir, f"{name}-e2e.json"), "w") as f:
        json.dump(result, f, indent=2)
    return result
