//! How many thread-block clusters of each size this GPU runs at once when each block fills an SM
//! (the driver's `cuOccupancyMaxActiveClusters`), and what a launch of one wave of such clusters
//! costs when it does nothing: `clusters [smem-KiB] [threads]` (defaults 150 and 384, one block an
//! SM, as a large wgmma kernel). A part's GPCs hold different numbers of SMs, so clusters of 4 or 8
//! fit fewer times than the SM count divided by the size; the wgmma K split
//! (kernels::wgmma `Plan::k_split`) must keep its clusters to what fits in one wave.
//!
//! The launch cost: each size's kernel, over a grid of one wave of clusters, is captured 200 times
//! into a CUDA graph and replayed between two events (as the worker times kernels), in two bodies:
//! `empty` returns at once; `meetings` does what every wgmma kernel does around its work, a
//! barrier set up by thread 0, the cluster's first meeting (arrive relaxed, as v13) and its last
//! (arrive release, as v13; v14 ends with a producer tail instead). The microseconds a launch are
//! the median of 9 replays. 2-block clusters ran 2-5 us slower than single blocks on 10-20 us
//! layers (H100, 2026-11-27, `hot-cluster-sync.txt`); this says how much of that a cluster launch
//! costs before any work. On an H100 the launch itself costs no more than one of single blocks,
//! and the two meetings 0.7-0.9 us (`docs/data/clusters-launch-h100-2026-11-27.txt`). The kernels
//! are built for `CLUSTERS_ARCH` (default sm_90a), all of them before the GPU is opened, so a
//! machine without one still checks that they compile. `GPU_PACK_LAB=1 scripts/gpu-pack.sh` packs it
//! and `lab/gpu-lab.sh clusters` runs it.
use std::sync::Arc;

use cudarc::driver::sys::CUfunction_attribute_enum as FnAttr;
use cudarc::driver::sys::{CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;

/// Launches in one graph, and replays of it whose median is reported.
const LAUNCHES: u32 = 200;
const REPLAYS: usize = 9;

/// The `meetings` body for a cluster of `size` (`size` 1: a block's own barrier).
fn meetings(size: u32) -> String {
    let meet = |arrive: &str| {
        format!(
            "asm volatile(\"barrier.cluster.arrive.{arrive}.aligned;\\nbarrier.cluster.wait.acquire.aligned;\\n\" ::: \"memory\");"
        )
    };
    let (first, last) = match size {
        1 => ("__syncthreads();".to_string(), "__syncthreads();".to_string()),
        _ => (meet("relaxed"), meet("release")),
    };
    format!(
        "__shared__ unsigned long long bar;\n\
         if (threadIdx.x == 0) {{\n\
           asm volatile(\"mbarrier.init.shared::cta.b64 [%0], 1;\\n\" :: \"r\"((unsigned)__cvta_generic_to_shared(&bar)));\n\
           asm volatile(\"fence.mbarrier_init.release.cluster;\\n\" ::: \"memory\");\n\
         }}\n\
         {first}\n\
         if (p && threadIdx.x == 0) p[blockIdx.x] = (int)bar;\n\
         {last}"
    )
}

/// Microseconds a launch of `func` takes over `cfg`, replayed from a graph of [`LAUNCHES`].
fn launch_us(stream: &Arc<CudaStream>, func: &CudaFunction, cfg: LaunchConfig) -> anyhow::Result<f64> {
    let null: u64 = 0;
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    let mut launched = Ok(());
    for _ in 0..LAUNCHES {
        let mut b = stream.launch_builder(func);
        b.arg(&null);
        // SAFETY: the kernel takes one int pointer, and null means it writes nothing.
        launched = unsafe { b.launch(cfg) }.map(|_| ());
        if launched.is_err() {
            break;
        }
    }
    let graph = stream.end_capture(CUgraphInstantiate_flags(0))?;
    launched?;
    let graph = graph.ok_or_else(|| anyhow::anyhow!("the capture came back empty"))?;
    graph.upload()?;
    graph.launch()?;
    stream.synchronize()?;
    let ctx = stream.context();
    let mut us = Vec::with_capacity(REPLAYS);
    for _ in 0..REPLAYS {
        // Timed events (the driver's default; cudarc's `None` would turn timing off).
        let timed = Some(CUevent_flags::CU_EVENT_DEFAULT);
        let (start, end) = (ctx.new_event(timed)?, ctx.new_event(timed)?);
        start.record(stream)?;
        graph.launch()?;
        end.record(stream)?;
        end.synchronize()?;
        us.push(start.elapsed_ms(&end)? as f64 * 1e3 / LAUNCHES as f64);
    }
    us.sort_by(f64::total_cmp);
    Ok(us[REPLAYS / 2])
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize, name: &str, default: u32| -> anyhow::Result<u32> {
        args.get(i).map_or(Ok(default), |s| {
            s.parse().map_err(|e| anyhow::anyhow!("{name} {s:?}: {e} (usage: clusters [smem-KiB] [threads])"))
        })
    };
    let smem_kib = arg(1, "smem-KiB", 150)?;
    let threads = arg(2, "threads", 384)?;
    // Every kernel is compiled before the GPU is touched (NVRTC needs none), so a machine without
    // one still checks the sources.
    let inc = tensortune_worker::nvrtc::find_include_dir().ok_or_else(|| anyhow::anyhow!("no CUDA headers"))?;
    let arch = std::env::var("CLUSTERS_ARCH").unwrap_or_else(|_| "sm_90a".into());
    let mut kernels = Vec::new();
    for size in [1u32, 2, 4, 8] {
        for (body, code) in [("empty", String::new()), ("meetings", meetings(size))] {
            let name = format!("cluster_{size}_{body}");
            let src = format!(
                "extern \"C\" __global__ void __cluster_dims__({size}, 1, 1) {name}(int* p) {{ extern __shared__ int s[]; if (p) p[threadIdx.x] = s[threadIdx.x];\n{code}\n}}\n"
            );
            let out = tensortune_worker::nvrtc::compile(&src, &name, &arch, &inc)?;
            kernels.push((size, body, name, out.cubin));
        }
    }
    let ctx = CudaContext::new(0)?;
    // A stream of its own: the legacy default stream cannot be captured into a graph.
    let stream = ctx.new_stream()?;
    println!(
        "{} ({arch}, {} SMs): blocks of {threads} threads and {smem_kib} KiB of shared memory",
        ctx.name()?,
        ctx.attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?
    );
    let smem = smem_kib * 1024;
    for pair in kernels.chunks(2) {
        let size = pair[0].0;
        let mut costs = Vec::new();
        let mut at_once = 0;
        for (_, body, name, cubin) in pair {
            let module = ctx.load_module(Ptx::from_binary(cubin.clone()))?;
            let func = module.load_function(name)?;
            func.set_attribute(FnAttr::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem as i32)?;
            let probe =
                LaunchConfig { grid_dim: (size * 64, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: smem };
            at_once = func.occupancy_max_active_clusters(probe, &stream)?;
            let wave = LaunchConfig { grid_dim: (at_once.max(1) * size, 1, 1), ..probe };
            costs.push(format!("{body} {:.2} us", launch_us(&stream, &func, wave)?));
        }
        println!(
            "clusters of {size}: {at_once} at once ({} blocks); a launch of one wave: {}",
            at_once * size,
            costs.join(", ")
        );
    }
    Ok(())
}
