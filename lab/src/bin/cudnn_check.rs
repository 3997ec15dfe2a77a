//! The cuDNN baseline of conv2d alone, on GPU 0, in-process: for each workload, the support
//! module is compiled with NVRTC, the inputs and the float64 reference are made, and cuDNN is
//! timed (every algorithm it offers, by graph replay; the fastest is kept) and cross-checked, as
//! the worker does for conv records. Prints one line per workload and a table last.
//!
//! `cudnn_check [samples] [warm|flush] [conv2d workload keys...]`; without keys, seven ResNet-like
//! shapes, each with f16 inputs (f16 and f32 output), i8 inputs, exact f32 (`FLOAT_CONFIG` with
//! FMA math: the check fails if cuDNN ran TF32) and tf32 (tensor-op math). Needs libnvrtc, the CUDA
//! headers (TENSORTUNE_CUDA_INCLUDE) and cuDNN 9 (on the loader's path, or TENSORTUNE_CUDNN_LIB).
//! Logs go to stderr; `RUST_LOG=tensortune_worker=debug` adds every algorithm cuDNN offered, with
//! cuDNN's own time and ours.

use anyhow::Context as _;
use tensortune_kernels::support::{self, Tolerance};
use tensortune_kernels::{Conv2d, DType, Types, Workload};
use tensortune_worker::cuda::CudaExecutor;
use tensortune_worker::nvrtc;
use tensortune_worker::protocol::{Executor, Launch, MeasureRequest};

/// A square conv shape: batch, input height and width, channels in and out, filter size, padding
/// and stride (both dimensions alike).
struct Shape {
    n: u64,
    hw: u64,
    c: u64,
    k: u64,
    rs: u64,
    pad: u64,
    stride: u64,
}

const fn shape(n: u64, hw: u64, c: u64, k: u64, rs: u64, pad: u64, stride: u64) -> Shape {
    Shape { n, hw, c, k, rs, pad, stride }
}

impl Shape {
    /// e.g. `N=1 56x56 64->128 3x3 pad1 stride2`.
    fn label(&self) -> String {
        let mut s = format!("N={} {}x{} {}->{} {}x{}", self.n, self.hw, self.hw, self.c, self.k, self.rs, self.rs);
        if self.pad > 0 {
            s.push_str(&format!(" pad{}", self.pad));
        }
        if self.stride > 1 {
            s.push_str(&format!(" stride{}", self.stride));
        }
        s
    }
}

const SHAPES: [Shape; 7] = [
    shape(1, 56, 64, 128, 1, 0, 1),
    shape(1, 28, 128, 256, 1, 0, 1),
    shape(1, 28, 256, 256, 1, 0, 1),
    shape(32, 56, 64, 128, 1, 0, 1),
    shape(32, 56, 64, 64, 3, 1, 1),
    shape(1, 14, 256, 256, 3, 1, 1),
    shape(1, 56, 64, 128, 3, 1, 2),
];

/// What GPU.md measured for cuDNN on an H200 (graph of 100 launches), by workload key.
const REFERENCE_US: [(&str, f64); 1] = [("conv2d/n1h56w56c64/k128r1s1/pad0x0,stride1x1,dil1x1/nhwc/f16,f32,f16", 5.09)];

fn main() -> anyhow::Result<()> {
    // RUST_LOG=tensortune_worker=debug lists every algorithm cuDNN offered and its graph time.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(false).init();
    let args: Vec<String> = std::env::args().collect();
    let samples: u32 = args.get(1).map(|s| s.parse()).transpose()?.unwrap_or(10);
    let flush_l2 = match args.get(2).map(String::as_str) {
        None | Some("warm") => false,
        Some("flush") => true,
        Some(other) => anyhow::bail!("unknown timing mode {other:?}; expected warm or flush"),
    };
    let workloads: Vec<(String, Workload)> = if args.len() > 3 {
        args[3..].iter().map(|k| Ok((k.clone(), Workload::from_key(k)?))).collect::<anyhow::Result<_>>()?
    } else {
        default_workloads()?
    };

    let inc = nvrtc::find_include_dir().ok_or_else(|| anyhow::anyhow!("CUDA headers not found"))?;
    let mut exec = CudaExecutor::new(0).context("opening cuda:0")?;
    let f = exec.facts();
    println!(
        "device: {} ({}), driver {}, cuda {}",
        f.target.name, f.target.class_key, f.driver_version, f.cuda_version
    );
    let target = f.target.clone();

    let mut rows = Vec::new();
    for (label, w) in &workloads {
        let support_cubin = nvrtc::compile(&support::source(w), "support", &target.nvrtc_arch(), &inc)?.cubin;
        let req = MeasureRequest {
            task_id: 0,
            workload: *w,
            workload_key: w.key(),
            // No kernel of ours runs: `vendor_baseline` only loads the workload.
            launch: Launch {
                name: "none".into(),
                entry: String::new(),
                grid: [1; 3],
                block: [1; 3],
                smem_bytes: 0,
                workspace_bytes: 0,
                args: Vec::new(),
            },
            cubin: Vec::new(),
            support_cubin,
            tolerance: Tolerance::for_workload(w),
            samples,
            min_sample_ms: 1.0,
            min_batch: 50,
            sample_launches: 0,
            flush_l2,
            baseline: true,
            fresh_baseline: false,
            repick_baseline: false,
            regime: Default::default(),
            settle_cap_ms: 0.0,
            hold_ms: 0.0,
            energy_ms: 0.0,
            start_uncapped: false,
            baseline_first: false,
            model_us: 0.0,
            vendor_model_us: 0.0,
        };
        let start = std::time::Instant::now();
        let (us, kind) = exec.vendor_baseline(&req);
        let secs = start.elapsed().as_secs_f64();
        let tflops = us.map(|us| w.flops() / us / 1e6);
        let reference = REFERENCE_US.iter().find(|(k, _)| *k == w.key()).map(|(_, us)| *us);
        println!(
            "{}: {} {} ({:.1} s){}",
            w.key(),
            us.map_or("-".into(), |us| format!("{us:.2} us")),
            tflops.map_or(String::new(), |t| format!("{t:.1} TFLOP/s")),
            secs,
            reference.map_or(String::new(), |r| format!(" [GPU.md H200: {r} us]"))
        );
        println!("    {kind}");
        let check = if kind.starts_with("none") {
            "none"
        } else if kind.contains("failed our check") {
            "FAILED"
        } else {
            "ok"
        };
        rows.push((label.clone(), types_label(w), us, check, algo(&kind)));
    }

    println!("\n{:<38} {:<12} {:>10} {:>7}  algorithm", "shape", "types", "cuDNN us", "check");
    for (label, types, us, check, algo) in &rows {
        let us = us.map_or("-".into(), |us| format!("{us:.2}"));
        println!("{label:<38} {types:<12} {us:>10} {check:>7}  {algo}");
    }
    let failed = rows.iter().filter(|r| r.3 == "FAILED").count();
    let none = rows.iter().filter(|r| r.3 == "none").count();
    println!(
        "SUMMARY {} workloads, {} timed, {none} without a baseline, {failed} failed the check",
        rows.len(),
        rows.len() - none
    );
    Ok(())
}

fn default_workloads() -> anyhow::Result<Vec<(String, Workload)>> {
    let types = [
        Types::new(DType::F16, DType::F32, Some(DType::F16))?,
        Types::new(DType::F16, DType::F32, Some(DType::F32))?,
        Types::new(DType::I8, DType::I32, Some(DType::I32))?,
        Types::default_for(DType::F32)?,
        Types::default_for(DType::Tf32)?,
    ];
    let mut out = Vec::new();
    for sh in SHAPES {
        for t in types {
            let conv = Conv2d {
                n: sh.n,
                h: sh.hw,
                w: sh.hw,
                c: sh.c,
                k: sh.k,
                r: sh.rs,
                s: sh.rs,
                pad: (sh.pad, sh.pad),
                stride: (sh.stride, sh.stride),
                dilation: (1, 1),
                types: t,
                epilogue: Default::default(),
                residual: false,
            };
            conv.validate()?;
            out.push((sh.label(), Workload::Conv2d(conv)));
        }
    }
    Ok(out)
}

fn types_label(w: &Workload) -> String {
    let t = w.types();
    format!("{}->{}", t.input, t.output)
}

/// The algorithm part of a baseline kind (`cudnnConvolutionForward ALGO (math), ...`).
fn algo(kind: &str) -> String {
    kind.strip_prefix("cudnnConvolutionForward ").and_then(|rest| rest.split(", ").next()).unwrap_or("").to_string()
}
