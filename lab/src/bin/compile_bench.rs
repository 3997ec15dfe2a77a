//! NVRTC throughput: compiles N distinct generated kernels of a workload on T threads and prints
//! compiles per second. `compile_bench KEY N T [skip] [template]` (skip: offset into the valid
//! configs, so concurrent processes compile different kernels; template: default wmma_gemm).
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;
use tensortune_kernels::*;
fn main() -> anyhow::Result<()> {
    let a: Vec<String> = std::env::args().collect();
    let w = Workload::from_key(&a[1])?;
    let n: usize = a[2].parse()?;
    let threads: usize = a[3].parse()?;
    let skip: usize = a.get(4).map(|s| s.parse()).transpose()?.unwrap_or(0);
    let template = registry::by_name(a.get(5).map_or("wmma_gemm", String::as_str))?;
    let t = Target::sm90();
    let inc = tensortune_worker::nvrtc::find_include_dir().expect("CUDA headers");
    let specs: Vec<KernelSpec> = template::valid_configs(template, &w, &t)?
        .iter()
        .skip(skip)
        .take(n)
        .map(|(_, c)| template.generate(&w, c, &t))
        .collect::<Result<_>>()?;
    let next = AtomicUsize::new(0);
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(spec) = specs.get(i) else { break };
                    tensortune_worker::nvrtc::compile(&spec.source, &spec.name, "sm_90a", &inc).expect("compiles");
                }
            });
        }
    });
    let secs = start.elapsed().as_secs_f64();
    println!("threads {threads}: {} kernels in {secs:.2} s = {:.1} kernels/s", specs.len(), specs.len() as f64 / secs);
    Ok(())
}
