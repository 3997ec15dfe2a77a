#!/usr/bin/env python3
"""A tensortune client in Python, on stubs generated from proto/tensortune.proto.

Submits a matmul tuning job to a tracker, follows it through WatchJob, then asks QueryBest for the
fastest kernel and prints it (or writes it as JSON). Run `examples/python/setup.sh` first; it
prints the PYTHONPATH this script needs:

    PYTHONPATH=$(examples/python/setup.sh) examples/python/tune.py \\
        --tracker 127.0.0.1:50051 --m 512 --n 64 --k 512 --trials 20

A tracker with tokens wants one: the script reads it from TENSORTUNE_TOKEN_FILE or TENSORTUNE_TOKEN
(never from the command line, where other users of the machine could read it). Give --tls-ca for a
tracker that serves TLS.
"""

import argparse
import json
import os
import sys

import grpc
import tensortune_pb2 as pb
import tensortune_pb2_grpc as rpc

DTYPES = {"f16": pb.DTYPE_F16, "bf16": pb.DTYPE_BF16, "i8": pb.DTYPE_I8, "f32": pb.DTYPE_F32, "i32": pb.DTYPE_I32}
LAYOUTS = {"nn": pb.LAYOUT_NN, "nt": pb.LAYOUT_NT, "tn": pb.LAYOUT_TN, "tt": pb.LAYOUT_TT}
FINISHED = {pb.JOB_STATE_DONE, pb.JOB_STATE_CANCELLED, pb.JOB_STATE_FAILED}


def token():
    """The bearer token from the environment, if any."""
    path = os.environ.get("TENSORTUNE_TOKEN_FILE")
    if path:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    return os.environ.get("TENSORTUNE_TOKEN", "").strip() or None


def channel(args):
    """A channel to the tracker, with TLS when a CA is given."""
    target = args.tracker.removeprefix("http://").removeprefix("https://")
    if args.tls_ca:
        with open(args.tls_ca, "rb") as f:
            return grpc.secure_channel(target, grpc.ssl_channel_credentials(root_certificates=f.read()))
    return grpc.insecure_channel(target)


def workload(args):
    mm = pb.Matmul(m=args.m, n=args.n, k=args.k, layout=LAYOUTS[args.layout], input=DTYPES[args.dtype])
    if args.accumulator:
        mm.accumulator = DTYPES[args.accumulator]
    if args.output:
        mm.output = DTYPES[args.output]
    return pb.Workload(matmul=mm)


def progress(job):
    parts = [f"{w.trials_done}/{w.trials_target} {w.state}" for w in job.workloads]
    return f"job {job.id} {pb.JobState.Name(job.state).removeprefix('JOB_STATE_').lower()}: " + ", ".join(parts)


def record_view(r):
    m = r.measurement
    return {
        "record_id": r.id,
        "workload_key": r.workload_key,
        "device_class": r.device_class,
        "template": r.template,
        "template_version": r.template_version,
        "config": json.loads(r.config),
        "median_us": m.median_us,
        "vendor_us": m.baseline_us if m.HasField("baseline_us") else None,
        "speedup": r.speedup,
        "tflops": r.tflops,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tracker", required=True, help="host:port of the tracker")
    p.add_argument("--tls-ca", help="CA certificate (PEM) of a tracker that serves TLS")
    p.add_argument("--m", type=int, required=True)
    p.add_argument("--n", type=int, required=True)
    p.add_argument("--k", type=int, required=True)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="f16")
    p.add_argument("--accumulator", choices=sorted(DTYPES))
    p.add_argument("--output", choices=sorted(DTYPES))
    p.add_argument("--layout", choices=sorted(LAYOUTS), default="nn")
    p.add_argument("--trials", type=int, default=50)
    p.add_argument("--tuner", default="model")
    p.add_argument("--template", default="", help="one template's space; default: every template's")
    p.add_argument("--device-class", default="")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600, help="seconds to follow the job")
    p.add_argument("--json", help="write the best record here as JSON")
    args = p.parse_args()

    metadata = (("authorization", f"Bearer {t}"),) if (t := token()) else ()
    with channel(args) as ch:
        tuning = rpc.TuningStub(ch)
        try:
            submitted = tuning.SubmitJob(
                pb.SubmitJobRequest(
                    workloads=[workload(args)],
                    template=args.template,
                    tuner=args.tuner,
                    trials=args.trials,
                    device_class=args.device_class,
                    seed=args.seed,
                    label="python example",
                ),
                metadata=metadata,
            )
        except grpc.RpcError as e:
            # The tracker names the field and the allowed range; pass its words on.
            print(f"error: the tracker refused the job: {e.code().name}: {e.details()}", file=sys.stderr)
            return 2
        print(f"job {submitted.job_id} on {submitted.device_class}", flush=True)

        last = None
        try:
            for job in tuning.WatchJob(pb.JobRef(job_id=submitted.job_id), metadata=metadata, timeout=args.timeout):
                line = progress(job)
                if line != last:
                    print(line, flush=True)
                    last = line
                if job.state in FINISHED:
                    break
        except grpc.RpcError as e:
            print(
                f"error: stopped following job {submitted.job_id} ({e.code().name}: {e.details()}); "
                "the job goes on in the tracker",
                file=sys.stderr,
            )
            return 3
        job = tuning.GetJob(pb.JobRef(job_id=submitted.job_id), metadata=metadata)
        if job.state != pb.JOB_STATE_DONE:
            print(f"error: job {job.id} ended {pb.JobState.Name(job.state)}: {job.error}", file=sys.stderr)
            return 4

        best = tuning.QueryBest(
            pb.QueryBestRequest(workload=workload(args), device_class=submitted.device_class), metadata=metadata
        ).best
        if not best:
            print("error: the job finished without an ok record", file=sys.stderr)
            return 4
        view = record_view(best[0])
        print(
            f"best: {view['median_us']:.2f} us ({view['template']} v{view['template_version']}) "
            f"config {json.dumps(view['config'], sort_keys=True)}"
        )
        if view["vendor_us"] is not None:
            print(f"vendor: {view['vendor_us']:.2f} us, speedup {view['speedup']:.3f}x")
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(view, f, indent=2, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
