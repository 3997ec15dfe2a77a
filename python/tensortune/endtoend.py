"""The whole path for one model, as `examples/resnet50.py` and `examples/bert.py` run it: capture,
tune as one job through the CLI, export, apply, and time eager against tuned by CUDA-graph replay
of the whole forward, interleaved, in one process.

Timing: each forward (eager PyTorch, and the same model with the bundle applied) is captured once
in a CUDA graph; rounds alternate between them, each round replaying a graph `iters` times between
two CUDA events; the table shows the median round per launch. Output agreement: the max relative
error of the tuned output against eager's, over all elements, relative to eager's largest
magnitude (so near-zero elements do not dominate).

`--compare-compile` adds `torch.compile(model, mode=--compile-mode)` to the same rounds: compiled
before the bundle is applied, its first call (compilation and autotuning) timed as the compile
wall, then captured in a CUDA graph like the other two. The default mode is
`max-autotune-no-cudagraphs`: max-autotune's kernel choices (Triton templates and the vendor's,
benchmarked) without Inductor's own CUDA graphs, since every forward here is replayed from a
graph of ours. `--compile-only` times eager against compiled alone (no capture, tuning or apply).
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
    p.add_argument("--compare-compile", action="store_true", help="time torch.compile in the same rounds")
    p.add_argument("--compile-mode", default="max-autotune-no-cudagraphs", help="torch.compile's mode")
    p.add_argument("--compile-only", action="store_true", help="eager against torch.compile only: no tuning")
    p.add_argument("--profile", action="store_true",
                   help="print where the GPU time of one eager forward and of one replay of each graph goes")
    p.add_argument("--variant", action="append", default=[], metavar="ATTR=VALUE",
                   help="also time the tuned forward with this `Applied` setting (e.g. cudnn_fused=0); repeatable")
    p.add_argument("--reference", action="store_true",
                   help="also compare each output with the model's in float32 (TF32 off)")
    args = p.parse_args()
    if args.batch < 1 or args.total_trials < 1 or args.trials < 1:
        p.error("--batch, --total-trials and --trials must be at least 1")
    for v in args.variant:
        attr, _, value = v.partition("=")
        if not attr.isidentifier() or value not in ("0", "1"):
            p.error(f"--variant {v!r}: expected ATTR=0 or ATTR=1 (an `Applied` flag, e.g. cudnn_fused=0)")
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


def compiled(model, call, mode):
    """`torch.compile(model, mode=mode)`, called once to compile it; returns (the compiled module,
    the first call's wall seconds, the settings that decide what it is)."""
    import torch._inductor.config as inductor

    fn = torch.compile(model, mode=mode)
    torch.cuda.synchronize()
    started = time.perf_counter()
    call(fn)
    torch.cuda.synchronize()
    wall = time.perf_counter() - started
    settings = {
        "mode": mode,
        "torch": torch.__version__,
        "triton": _version("triton"),
        "cudnn": torch.backends.cudnn.version(),
        "compile_threads": inductor.compile_threads,
        "max_autotune_gemm_backends": inductor.max_autotune_gemm_backends,
        "max_autotune_conv_backends": getattr(inductor, "max_autotune_conv_backends", None),
        "freezing": inductor.freezing,
        "fx_graph_cache": inductor.fx_graph_cache,
        "cache_dir": os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
    }
    return fn, wall, settings


def _version(package):
    try:
        import importlib.metadata

        return importlib.metadata.version(package)
    except Exception:  # noqa: BLE001 (a version is information, never a reason to stop)
        return None


#: Kernel name fragments -> the kind of work, for `profile`'s shares (first match wins; a tuned
#: forward's own kernels are `ours` before any of these). cuDNN's convolutions are named
#: `..._fprop_implicit_gemm_...`, so `conv` comes before `gemm`.
_KINDS = (
    ("attention", ("flash", "fmha", "attention", "softmax", "sdpa")),
    ("conv", ("conv", "fprop", "implicit", "dgrad", "wgrad")),
    ("gemm", ("gemm", "xmma", "nvjet", "cutlass", "sm90_", "sm80_", "cublas", "wgmma")),
    ("norm", ("norm",)),
    ("pool", ("pool",)),
    ("copy", ("copy", "memcpy", "memset")),
    ("fused pointwise (Triton)", ("triton_",)),
    ("elementwise", ("elementwise", "relu", "add", "gelu")),
)


def profile(label, fn, rows=15, ours=()):
    """`fn()` once (after a warm-up) under torch.profiler: prints the kernels that took the most
    GPU time and each kind's share (ours, conv, GEMM, attention, norm, pool, copy, elementwise,
    other); returns the shares and every kernel's row (name, launches, microseconds, kind)."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    with torch.no_grad():
        fn()
        torch.cuda.synchronize()
        with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
    kernels = {}
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            n, us = kernels.get(ev.name, (0, 0.0))
            kernels[ev.name] = (n + 1, us + ev.time_range.elapsed_us())
    total = sum(us for _, us in kernels.values()) or 1.0
    ours = set(ours)
    shares, table = {}, []
    for name, (n, us) in sorted(kernels.items(), key=lambda kv: -kv[1][1]):
        low = name.lower()
        kind = "ours" if name in ours else next((k for k, frags in _KINDS if any(f in low for f in frags)), "other")
        shares[kind] = shares.get(kind, 0.0) + us
        table.append({"kernel": name, "launches": n, "us": us, "kind": kind})
    print(f"{label}: {total:.0f} us of GPU kernels, {sum(n for n, _ in kernels.values())} launches")
    print("  " + ", ".join(f"{k} {us:.0f} us ({100 * us / total:.1f}%)" for k, us in sorted(shares.items(), key=lambda kv: -kv[1])))
    for row in table[:rows]:
        print(f"  {row['us']:9.1f} us {100 * row['us'] / total:5.1f}% x{row['launches']:<4} {row['kind'][:10]:10} {row['kernel'][:100]}")
    return {"total_us": total, "shares_us": shares, "kernels": table}


def max_rel_error(got, want):
    got, want = got.float(), want.float()
    return ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()


def _float32(inputs):
    """The inputs with every floating tensor in float32."""
    cast = lambda t: t.float() if torch.is_tensor(t) and t.is_floating_point() else t
    return {k: cast(v) for k, v in inputs.items()} if isinstance(inputs, dict) else tuple(cast(t) for t in inputs)


def reference_output(model, inputs):
    """The model's output in float32 with TF32 off and SDPA's math backend (a copy of the model;
    the original is untouched)."""
    import contextlib
    import copy

    ref = copy.deepcopy(model).float()
    x = _float32(inputs)
    flags = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        math = sdpa_kernel([SDPBackend.MATH])
    except ImportError:
        math = contextlib.nullcontext()
    try:
        with torch.no_grad(), math:
            out = ref(**x) if isinstance(x, dict) else ref(*x)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags
    del ref
    return out


def _first(o):
    return o if torch.is_tensor(o) else (o[0] if isinstance(o, (tuple, list)) else o.last_hidden_state)


def run(name, model, inputs, args, call=None):
    """Captures, tunes, exports, applies and times `model` on `inputs` (a tuple, or a dict of
    keyword inputs); prints the table and writes `<workdir>/<name>-e2e.json` (and, with
    `--profile`, every graph's kernel table to `<workdir>/<name>-profile.json`)."""
    os.makedirs(args.workdir, exist_ok=True)
    custom_call = call is not None
    call = call or ((lambda m: m(**inputs)) if isinstance(inputs, dict) else (lambda m: m(*inputs)))
    shares = profile("one eager forward (host launches)", lambda: call(model)) if args.profile else None
    tuning = not args.compile_only
    reference = None
    if args.reference and not custom_call:
        reference = _first(reference_output(model, inputs))
    if tuning:
        suite_path = os.path.join(args.workdir, f"{name}.json")
        suite = capture(model, inputs, suite_path, name=name)
        occurrences = sum(e["count"] * e.get("batch", 1) for e in suite["workloads"])
        print(f"captured {len(suite['workloads'])} distinct workloads ({occurrences} ops) of {name}; "
              f"{len(suite.get('skipped', []))} ops not tunable", flush=True)
        bundle, wall, report = tune(args, suite_path)
    else:
        wall, report = None, {}

    method = "CUDA-graph replay"
    replays, outs = {}, {}
    compile_info = None
    applied = None
    with torch.no_grad():
        try:
            replays["eager"], outs["eager"] = graphed(lambda: call(model))
        except RuntimeError as e:
            print(f"the forward cannot be captured in a CUDA graph ({e}); timing host launches instead")
            method = "host launches"
        if method != "CUDA-graph replay":
            replays["eager"], outs["eager"] = launched(lambda: call(model))
        timer = graphed if method == "CUDA-graph replay" else launched
        host = {}
        if args.profile and method == "CUDA-graph replay":
            host.update(interleaved({"eager": lambda: call(model)}, 5, 10))
        if args.compare_compile or args.compile_only:
            try:
                fn, compile_wall, settings = compiled(model, call, args.compile_mode)
                print(f"torch.compile: first call {compile_wall:.1f} s; {json.dumps(settings)}", flush=True)
                replays["compiled"], outs["compiled"] = timer(lambda: call(fn))
                compile_info = dict(settings, first_call_s=compile_wall)
            except Exception as e:  # noqa: BLE001 (a failed comparison must not lose the tuned figures)
                if args.compile_only:
                    raise
                print(f"torch.compile failed, compared without it: {type(e).__name__}: {e}", flush=True)
        if tuning:
            applied = apply(model, bundle)
            replays["tuned"], outs["tuned"] = timer(lambda: call(model))
            # The launch counts of each graph's forwards alone (warm-ups and capture).
            reports = {"tuned": applied.report()}
            for v in args.variant:
                attr, _, value = v.partition("=")
                before = getattr(applied, attr)
                setattr(applied, attr, value == "1")
                applied.reset_counts()
                try:
                    replays[f"tuned[{v}]"], outs[f"tuned[{v}]"] = timer(lambda: call(model))
                    reports[f"tuned[{v}]"] = applied.report()
                finally:
                    setattr(applied, attr, before)
        profiles = {}
        if args.profile:
            ours = {k.entry["entry"] for k in applied.kernels.values()} if applied is not None else ()
            for label, replay in replays.items():
                profiles[label] = profile(f"one {'replay of' if timer is graphed else 'call of'} {label}'s forward",
                                          replay, rows=25, ours=ours)
            with open(os.path.join(args.workdir, f"{name}-profile.json"), "w") as f:
                json.dump(profiles, f, indent=1)
        times = interleaved(replays, args.rounds, args.iters)
    if host and tuning:
        with torch.no_grad():
            host.update(interleaved({"tuned": lambda: call(model)}, 5, 10))
            host["tuned_max_rel_error"] = max_rel_error(_first(call(model)), _first(outs["eager"]))
        print(f"host launches (a diagnostic, not interleaved): {json.dumps(host)}", flush=True)
    errors = {k: max_rel_error(_first(o), _first(outs["eager"])) for k, o in outs.items() if k != "eager"}
    vs_f32 = {k: max_rel_error(_first(o), reference) for k, o in outs.items()} if reference is not None else None
    if vs_f32 is not None:
        print("max relative error against the float32 model (TF32 off): "
              + ", ".join(f"{k} {e:.2e}" for k, e in vs_f32.items()), flush=True)
    if not tuning:
        return _report_compiled(name, args, method, times, errors, compile_info)
    err = errors["tuned"]
    r = reports["tuned"]
    result = {
        "model": name,
        "batch": args.batch,
        "method": method,
        "gpu": torch.cuda.get_device_name(),
        "eager_us": times["eager"],
        "tuned_us": times["tuned"],
        "speedup": times["eager"] / times["tuned"],
        "max_rel_error": err,
        "max_rel_error_vs_f32": vs_f32,
        "variants": {k: {"us": t, "speedup": times["eager"] / t, "max_rel_error": errors[k], "launches": reports[k]}
                     for k, t in times.items() if k.startswith("tuned[")},
        "tuning_wall_s": wall,
        "total_trials": args.total_trials,
        "forwards_applied": r["forwards"],  # the launch counts below are over these forwards
        "ours_launches": r["ours"],
        "fused_launches": r.get("fused", {}),
        "kept": r["kept"],
        "timed_in_place_us": r.get("timed", {}),  # chain key -> [ours, PyTorch's]
        "predicted": report.get("model"),
        "eager_profile": shares,
        "graph_profiles_us": {k: {"total": p["total_us"], **p["shares_us"]} for k, p in profiles.items()},
    }
    if compile_info is not None:
        result.update(compiled_us=times["compiled"], tuned_vs_compiled=times["compiled"] / times["tuned"],
                      compiled_max_rel_error=errors["compiled"], compile=compile_info)
    print(f"\n{name} batch {args.batch} on {result['gpu']} ({method}, interleaved, median of {args.rounds} rounds x {args.iters})")
    print(f"  eager   {times['eager']:10.1f} us")
    print(f"  tuned   {times['tuned']:10.1f} us   {result['speedup']:.3f}x eager")
    for k, v in result["variants"].items():
        print(f"  {k} {v['us']:10.1f} us   {v['speedup']:.3f}x eager (max relative error {v['max_rel_error']:.2e})")
    if compile_info is not None:
        print(f"  compiled {times['compiled']:10.1f} us   tuned is {result['tuned_vs_compiled']:.3f}x torch.compile "
              f"({compile_info['mode']}, first call {compile_info['first_call_s']:.1f} s; "
              f"max relative error {errors['compiled']:.2e})")
    print(f"  max relative error of the output {err:.2e}")
    n = max(r["forwards"], 1)
    kept = {why: count / n for why, count in r["kept"].items()}
    print(f"  per forward: ops on our kernels {r['ours'] / n:g} ({sum(r.get('fused', {}).values()) / n:g} fused conv or "
          f"linear chains); PyTorch's kept: {kept}")
    timed = r.get("timed", {})
    if timed:
        print(f"  timed in place: {len(timed)} chain keys, ours the faster on {sum(o < t for o, t in timed.values())}: "
              + ", ".join(f"{o:.1f}/{t:.1f}" for o, t in timed.values()) + " us (ours/PyTorch's)")
    if wall is not None:
        m = report.get("model", {})
        print(f"  tuning {wall:.1f} s for {args.total_trials} trials; predicted GEMM/conv time "
              f"{m.get('tuned_us', 0):.1f} us vs vendor {m.get('vendor_us', 0):.1f} us")
    with open(os.path.join(args.workdir, f"{name}-e2e.json"), "w") as f:
        json.dump(result, f, indent=2)
    return result


def _report_compiled(name, args, method, times, errors, info):
    """`--compile-only`: eager against torch.compile, printed and written as JSON."""
    result = {"model": name, "batch": args.batch, "method": method, "gpu": torch.cuda.get_device_name(),
              "eager_us": times["eager"], "compiled_us": times["compiled"],
              "compiled_speedup": times["eager"] / times["compiled"], "compiled_max_rel_error": errors["compiled"],
              "compile": info}
    print(f"\n{name} batch {args.batch} on {result['gpu']} ({method}, interleaved, median of {args.rounds} rounds x {args.iters})")
    print(f"  eager    {times['eager']:10.1f} us")
    print(f"  compiled {times['compiled']:10.1f} us   {result['compiled_speedup']:.3f}x eager "
          f"({info['mode']}, first call {info['first_call_s']:.1f} s)")
    with open(os.path.join(args.workdir, f"{name}-compile.json"), "w") as f:
        json.dump(result, f, indent=2)
    return result
