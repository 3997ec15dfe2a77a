//! Verifies and times one config on GPU 0, in-process, with the template of the workload's op
//! (wmma_gemm, wmma_conv2d), or the one `TT_TEMPLATE` names (e.g. wgmma_gemm):
//! `run_one KEY CONFIG_JSON [samples] [repeat] [warm|flush]` (`flush`: one launch per sample from a
//! cold L2). For profilers (ncu) and repeatability checks. `TT_NO_BASELINE=1` leaves the vendor
//! baseline out of the process. `TT_ALTERNATE=1` times the vendor after every repeat, not just the
//! first (its pick again, as finalist rounds do): ours and the vendor alternate from the same GPU
//! state, for comparisons under sustained load. `TT_VENDOR=gemmex` or `TT_VENDOR=lt:N` (matmul),
//! or `TT_VENDOR=fastest` (every candidate, cuBLAS's or cuDNN's, on the first repeat; the fastest
//! of them alone after), times that vendor algorithm alone instead of our kernel, `repeat` times
//! (to hold one kernel on the GPU for seconds); with `TT_ALTERNATE` too, that algorithm is the one
//! timed after ours each repeat.
//! Each line starts with the wall time (Unix ms), to set beside `nvidia-smi` samples of clock and
//! power, and ends with the board's mean power over that repeat and its energy counter (NVML,
//! millijoules).
use anyhow::Context as _;
use tensortune_kernels::support::{self, Tolerance};
use tensortune_kernels::*;
use tensortune_worker::cuda::{CudaExecutor, VendorAlgorithm};
use tensortune_worker::nvrtc;
use tensortune_worker::protocol::{Executor, Launch, MeasureRequest};
fn main() -> anyhow::Result<()> {
    let a: Vec<String> = std::env::args().collect();
    let w = Workload::from_key(&a[1])?;
    let config = Config::from_json(&a[2])?;
    let samples: u32 = a.get(3).map(|s| s.parse()).transpose()?.unwrap_or(10);
    let repeat: usize = a.get(4).map(|s| s.parse()).transpose()?.unwrap_or(1);
    let flush_l2 = match a.get(5).map(String::as_str) {
        None | Some("warm") => false,
        Some("flush") => true,
        Some(other) => anyhow::bail!("unknown timing mode {other:?}; expected warm or flush"),
    };
    // Checked against the workload too, before the compile.
    let vendor = match std::env::var("TT_VENDOR") {
        Ok(v) => {
            let a = v.parse::<VendorAlgorithm>().map_err(|e| anyhow::anyhow!("TT_VENDOR={e}"))?;
            a.check(&w).map_err(|e| anyhow::anyhow!("TT_VENDOR={e}"))?;
            Some(a)
        }
        Err(_) => None,
    };
    let mut exec = CudaExecutor::new(0).context("opening cuda:0")?;
    let f = exec.facts();
    let target = f.target.clone();
    let inc = nvrtc::find_include_dir().ok_or_else(|| anyhow::anyhow!("CUDA headers not found"))?;
    let template = match std::env::var("TT_TEMPLATE") {
        Ok(name) => registry::by_name(&name)?,
        Err(_) => registry::default_for(w.op())?,
    };
    let spec = template.generate(&w, &config, &target)?;
    let cubin = nvrtc::compile(&spec.source, &spec.name, &target.nvrtc_arch(), &inc)?.cubin;
    let support_cubin = nvrtc::compile(&support::source(&w), "support", &target.nvrtc_arch(), &inc)?.cubin;
    let alternate = std::env::var_os("TT_ALTERNATE").is_some();
    for r in 0..repeat {
        let req = MeasureRequest {
            task_id: r as u64,
            workload: w,
            workload_key: w.key(),
            launch: Launch::of(&spec),
            cubin: cubin.clone(),
            support_cubin: if r == 0 { support_cubin.clone() } else { Vec::new() },
            tolerance: Tolerance::for_workload(&w),
            samples,
            min_sample_ms: 1.0,
            min_batch: 50,
            sample_launches: 0,
            flush_l2,
            // TT_NO_BASELINE: ours alone in the process (for compute-sanitizer, whose racecheck
            // otherwise reports inside the vendor's kernels).
            baseline: (r == 0 || alternate) && std::env::var_os("TT_NO_BASELINE").is_none(),
            fresh_baseline: r > 0 && alternate,
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
        let (energy0, t0) = (exec.energy_mj(), std::time::Instant::now());
        let line = match (&vendor, alternate) {
            (Some(which), false) => {
                // `fastest` picks on the first repeat and holds that pick after.
                let (us, kind) = exec.vendor_alone(&MeasureRequest { fresh_baseline: r > 0, ..req.clone() }, *which)?;
                format!(
                    "{kind} {} median {:.3} us vendor None clock {} MHz",
                    if us.is_some() { "Ok" } else { "Failed" },
                    us.unwrap_or(0.0),
                    exec.sm_clock_mhz()
                )
            }
            (which, _) => {
                // With TT_VENDOR and TT_ALTERNATE: ours, then that vendor algorithm (not the pick).
                let o = exec.measure(&MeasureRequest { baseline: req.baseline && which.is_none(), ..req.clone() });
                let (baseline_us, baseline_kind) = match which {
                    Some(which) => exec.vendor_alone(&req, *which)?,
                    None => (o.baseline_us, o.baseline_kind.clone()),
                };
                format!(
                    "{} {:?} median {:.3} us spread {:.4} batch {} vendor {:?} clock {} MHz err {:?} {} [vendor: {}]",
                    spec.name,
                    o.status,
                    o.median_us,
                    o.spread,
                    o.batch,
                    baseline_us,
                    o.sm_clock_mhz,
                    o.max_abs_err,
                    o.error,
                    baseline_kind
                )
            }
        };
        // The counter moves in steps (about every 100 ms on an H100): a short repeat's power is
        // rough, so the raw counter goes out too, for a mean over many repeats.
        let power = match (energy0, exec.energy_mj()) {
            (Some(e0), Some(e1)) => {
                format!(
                    " power {:.0} W energy {e1} mJ",
                    (e1.saturating_sub(e0)) as f64 / t0.elapsed().as_secs_f64() / 1e3
                )
            }
            _ => String::new(),
        };
        let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
        println!("{now_ms} {line}{power}");
    }
    Ok(())
}
