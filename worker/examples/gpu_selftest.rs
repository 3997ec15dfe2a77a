//! GPU self-test of the cuda backend without tracker or daemon: for a set of workloads covering
//! every dtype and layout, generate a spread of configs, compile them with NVRTC for the GPU's
//! arch, verify and time them in-process, and print one line per kernel plus a summary.
//!
//! `gpu_selftest [configs-per-workload] [samples]`; run on a GPU machine with libnvrtc and the
//! CUDA headers reachable (LD_LIBRARY_PATH, TENSORTUNE_CUDA_INCLUDE).

use std::collections::BTreeMap;

use tensortune_kernels::support::{self, Tolerance};
use tensortune_kernels::template::valid_configs;
use tensortune_kernels::{DType, Layout, Matmul, Target, Template, Types, Workload, gemm};
use tensortune_worker::cuda::CudaExecutor;
use tensortune_worker::nvrtc;
use tensortune_worker::protocol::{Executor, Launch, MeasureRequest, Status};

fn mm(m: u64, n: u64, k: u64, layout: Layout, i: DType, a: DType, o: DType, alpha: f64, beta: f64) -> Workload {
    let mut w = Matmul::new(m, n, k, layout, Types::new(i, a, Some(o)).unwrap()).unwrap();
    w.alpha = alpha;
    w.beta = beta;
    Workload::Matmul(w)
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let per = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(8usize);
    let samples = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(5u32);
    let inc = nvrtc::find_include_dir().ok_or_else(|| anyhow::anyhow!("CUDA headers not found"))?;
    let mut exec = CudaExecutor::new(0)?;
    let f = exec.facts();
    println!("device: {} ({}), sm_{}, {} SMs, driver {}, cuda {}, nvrtc {:?}", f.name, f.class_key, f.arch, f.sm_count, f.driver_version, f.cuda_version, nvrtc::version());
    let target = Target {
        class_key: f.class_key.clone(),
        name: f.name.clone(),
        arch: f.arch,
        sm_count: f.sm_count,
        max_threads_per_block: f.max_threads_per_block,
        max_smem_per_block: f.max_smem_per_block,
        smem_per_sm: f.smem_per_sm,
        regs_per_sm: f.regs_per_sm,
        l2_bytes: f.l2_bytes,
    };
    use DType::*;
    use Layout::*;
    let workloads = vec![
        mm(512, 64, 512, Nn, F16, F32, F32, 1.0, 0.0),
        mm(512, 32, 512, Nt, F16, F32, F16, 1.0, 0.0),
        mm(256, 256, 256, Tn, F16, F16, F16, 1.0, 0.0),
        mm(200, 136, 264, Tt, F16, F32, F32, 0.5, -1.0),
        mm(512, 32, 512, Tn, I8, I32, I32, 1.0, 0.0),
        mm(96, 80, 128, Nn, I8, I32, I32, 2.0, 3.0),
        mm(256, 128, 512, Nt, Bf16, F32, F32, 1.0, 0.0),
        mm(1000, 1001, 1024, Tt, Bf16, F32, Bf16, 1.0, 0.0),
        mm(1024, 1024, 1024, Nn, F16, F32, F32, 1.0, 0.0),
    ];
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for w in &workloads {
        let key = w.key();
        let support_src = support::source(w);
        let support_cubin = match nvrtc::compile(&support_src, "support", &target.nvrtc_arch(), &inc) {
            Ok(c) => c.cubin,
            Err(e) => {
                println!("{key}: support module failed to compile: {e}");
                *counts.entry("support_compile_error".into()).or_default() += 1;
                continue;
            }
        };
        let valid = valid_configs(&gemm::WmmaGemm, w, &target)?;
        let step = (valid.len() / per).max(1);
        let mut first = true;
        for (index, config) in valid.iter().step_by(step).take(per) {
            let spec = gemm::WmmaGemm.generate(w, config, &target)?;
            let compiled = match nvrtc::compile(&spec.source, &spec.name, &target.nvrtc_arch(), &inc) {
                Ok(c) => c,
                Err(e) => {
                    println!("{key} #{index}: compile error: {e}");
                    *counts.entry("compile_error".into()).or_default() += 1;
                    continue;
                }
            };
            let req = MeasureRequest {
                task_id: *index,
                workload: *w,
                workload_key: key.clone(),
                launch: Launch {
                    name: spec.name.clone(),
                    entry: spec.entry.clone(),
                    grid: spec.grid,
                    block: spec.block,
                    smem_bytes: spec.smem_bytes,
                    workspace_bytes: spec.workspace_bytes,
                    args: spec.args.clone(),
                },
                cubin: compiled.cubin,
                support_cubin: if first { support_cubin.clone() } else { Vec::new() },
                tolerance: Tolerance::for_workload(w),
                samples,
                min_sample_ms: 1.0,
                min_batch: 50,
                baseline: first,
                model_us: 0.0,
                vendor_model_us: 0.0,
            };
            first = false;
            let o = exec.measure(&req);
            let status = format!("{:?}", o.status);
            *counts.entry(status.clone()).or_default() += 1;
            println!(
                "{key} #{index} {config}: {status} {:.2} us (x{} spread {:.3}) base {:?} {} err {:?}/{:?} regs {} smem {} {:.0} ms {}",
                o.median_us,
                o.batch,
                o.spread,
                o.baseline_us,
                o.baseline_kind,
                o.max_abs_err,
                o.max_rel_err,
                o.registers,
                o.smem_bytes,
                o.measure_ms,
                if o.status == Status::Ok { String::new() } else { o.error.chars().take(400).collect::<String>() }
            );
            if exec.poisoned() {
                println!("context poisoned; reopening");
                exec = CudaExecutor::new(0)?;
                first = true;
            }
        }
    }
    println!("SUMMARY {counts:?}");
    Ok(())
}
