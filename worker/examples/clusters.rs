//! How many thread-block clusters of each size this GPU runs at once when each block fills an SM
//! (the driver's `cuOccupancyMaxActiveClusters`): `clusters [smem-KiB] [threads]` (defaults 150
//! and 384, one block an SM, as a large wgmma kernel). A part's GPCs hold different numbers of SMs,
//! so clusters of 4 or 8 fit fewer times than the SM count divided by the size; the wgmma K split
//! (kernels::wgmma `Plan::k_split`) must keep its clusters to what fits in one wave.
use cudarc::driver::sys::CUfunction_attribute_enum as FnAttr;
use cudarc::driver::{CudaContext, LaunchConfig};
use cudarc::nvrtc::Ptx;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize, name: &str, default: u32| -> anyhow::Result<u32> {
        args.get(i).map_or(Ok(default), |s| {
            s.parse().map_err(|e| anyhow::anyhow!("{name} {s:?}: {e} (usage: clusters [smem-KiB] [threads])"))
        })
    };
    let smem_kib = arg(1, "smem-KiB", 150)?;
    let threads = arg(2, "threads", 384)?;
    let ctx = CudaContext::new(0)?;
    let (major, minor) = ctx.compute_capability()?;
    let arch = format!("sm_{major}{minor}{}", if major == 9 { "a" } else { "" });
    let inc = tensortune_worker::nvrtc::find_include_dir().ok_or_else(|| anyhow::anyhow!("no CUDA headers"))?;
    let stream = ctx.default_stream();
    println!(
        "{} ({arch}, {} SMs): blocks of {threads} threads and {smem_kib} KiB of shared memory",
        ctx.name()?,
        ctx.attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?
    );
    for size in [1u32, 2, 4, 8] {
        let name = format!("cluster_{size}");
        let src = format!(
            "extern \"C\" __global__ void __cluster_dims__({size}, 1, 1) {name}(int* p) {{ extern __shared__ int s[]; if (p) p[threadIdx.x] = s[threadIdx.x]; }}\n"
        );
        let out = tensortune_worker::nvrtc::compile(&src, &name, &arch, &inc)?;
        let module = ctx.load_module(Ptx::from_binary(out.cubin))?;
        let func = module.load_function(&name)?;
        let smem = smem_kib * 1024;
        func.set_attribute(FnAttr::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem as i32)?;
        let cfg = LaunchConfig { grid_dim: (size * 64, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: smem };
        let n = func.occupancy_max_active_clusters(cfg, &stream)?;
        println!("clusters of {size}: {n} at once ({} blocks)", n * size);
    }
    Ok(())
}
