//! GPU self-test of the cuda backend without tracker or daemon: for a set of workloads covering
//! every dtype and layout, generate a spread of configs, compile them with NVRTC for the GPU's
//! arch, verify (every output element against the float64 reference, before and after the timed
//! launches) and time them in-process, and print one line per kernel plus a summary. Each workload
//! gets its op's template (wmma_gemm, wmma_conv2d).
//!
//! `gpu_selftest [configs-per-workload] [samples] [matrix | conv | conv32 | types | workload keys...]`;
//! `matrix` replaces the default workloads with every type combination x every layout x three
//! shapes (one ragged); `types` with the f32, tf32, s4, u4, b1xor and b1and workloads of
//! [`types_matrix`] (the types suite's shapes and ragged ones), each on every template that
//! supports it (simt_gemm, mma_ext_gemm, and wgmma_gemm for tf32 in tn);
//! `conv` with every conv type combination x the 15 conv shapes of [`conv_matrix`]
//! (padding, stride 2, dilation 2, ragged tiles, 1x3, 3x1 and 7x7 filters, pointwise layers, the
//! seven tuning layers); `conv32` with the exact f32 and tf32 conv layers of [`conv32_matrix`],
//! each on every template that supports it, as `types` does (tf32: wmma_conv2d and, on sm_90,
//! wgmma_conv2d on both its TMA im2col and gathered paths).
//! Configs are spread over the valid space and over the kinds of config that run different code
//! (conv path and gather, split-K and its reduction; wgmma producer, cluster and persistence).
//! `SELFTEST_TEMPLATE=wgmma_gemm` checks that template instead of the op's default (the first
//! template of the op that supports the workload: wmma_gemm for the tensor-core types, simt_gemm
//! for f32, mma_ext_gemm for tf32 and the packed types); workloads it does not support are then
//! listed and skipped. `SELFTEST_KNOB=name:value` keeps only the configs whose knob has that value
//! (a knob or value the template does not have is an error; workloads with no such valid config
//! are listed and skipped, and a filter that leaves nothing to check fails the run).
//! The exit status is non-zero when any kernel is not `Ok`.
//! Run on a GPU machine with libnvrtc and the CUDA headers reachable (LD_LIBRARY_PATH,
//! TENSORTUNE_CUDA_INCLUDE).

use std::collections::BTreeMap;

use anyhow::Context as _;
use tensortune_kernels::support::{self, Tolerance};
use tensortune_kernels::template::{self, valid_configs};
use tensortune_kernels::{Config, Space, Workload};
use tensortune_worker::cuda::CudaExecutor;
use tensortune_worker::nvrtc;
use tensortune_worker::protocol::{Executor, Launch, MeasureRequest, Status};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let per = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(8usize);
    let samples = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(5u32);
    let inc = nvrtc::find_include_dir().ok_or_else(|| anyhow::anyhow!("CUDA headers not found"))?;
    let mut exec = CudaExecutor::new(0).context("opening cuda:0")?;
    let f = exec.facts();
    println!(
        "device: {} ({}), sm_{}, {} SMs, driver {}, cuda {}, nvrtc {:?}",
        f.name,
        f.class_key,
        f.arch,
        f.sm_count,
        f.driver_version,
        f.cuda_version,
        nvrtc::version()
    );
    let target = f.target();
    let keys = [
        "matmul/m512n64k512/nn/f16,f32,f32/alpha=1,beta=0",
        "matmul/m512n32k512/nt/f16,f32,f16/alpha=1,beta=0",
        "matmul/m256n256k256/tn/f16,f16,f16/alpha=1,beta=0",
        "matmul/m200n136k264/tt/f16,f32,f32/alpha=0.5,beta=-1",
        "matmul/m512n32k512/tn/i8,i32,i32/alpha=1,beta=0",
        "matmul/m96n80k128/nn/i8,i32,i32/alpha=2,beta=3",
        "matmul/m256n128k512/nt/bf16,f32,f32/alpha=1,beta=0",
        "matmul/m1000n1001k1024/tt/bf16,f32,bf16/alpha=1,beta=0",
        "matmul/m1024n1024k1024/nn/f16,f32,f32/alpha=1,beta=0",
    ];
    let extra: Vec<String> = args.iter().skip(3).cloned().collect();
    let every_template = extra.first().is_some_and(|m| m == "types" || m == "conv32");
    let keys: Vec<String> = match extra.first().map(String::as_str) {
        Some("matrix") => matrix(),
        Some("conv") => conv_matrix(),
        Some("types") => types_matrix(),
        Some("conv32") => conv32_matrix(),
        _ => keys.iter().map(|k| k.to_string()).chain(extra).collect(),
    };
    let workloads = keys.iter().map(|k| Workload::from_key(k)).collect::<Result<Vec<_>, _>>()?;
    let chosen_template = match std::env::var("SELFTEST_TEMPLATE") {
        Ok(name) => Some(template::by_name(&name)?),
        Err(_) => None,
    };
    // SELFTEST_KNOB=name:value keeps the configs whose knob has that value (e.g. producer:inline,
    // to check one load path on its own).
    let knob_filter = match std::env::var("SELFTEST_KNOB") {
        Ok(spec) => {
            let (knob, value) = spec
                .split_once(':')
                .ok_or_else(|| anyhow::anyhow!("SELFTEST_KNOB={spec:?}: expected name:value, e.g. producer:inline"))?;
            Some((knob.to_owned(), value.to_owned()))
        }
        Err(_) => None,
    };
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
        // The named template; else the first of the op that supports the workload, or in `types`
        // mode every one that does (tf32 in tn is both wgmma_gemm's and mma_ext_gemm's).
        let supporting: Vec<_> =
            template::templates_for(w.op()).into_iter().filter(|t| t.supports(w, &target).is_ok()).collect();
        let templates = match (&chosen_template, supporting.first()) {
            (Some(t), _) => vec![*t],
            (None, None) => vec![template::default_for(w.op())?],
            (None, Some(first)) if !every_template => vec![*first],
            (None, Some(_)) => supporting,
        };
        for template in templates {
            let valid = match valid_configs(template, w, &target) {
                Ok(v) => v,
                Err(e) => {
                    println!("{key}: not supported by {}: {e}", template.name());
                    let what = if chosen_template.is_some() { "skipped_unsupported" } else { "unsupported" };
                    *counts.entry(what.into()).or_default() += 1;
                    continue;
                }
            };
            let valid: Vec<(u64, Config)> = match &knob_filter {
                Some((knob, value)) => {
                    check_knob(template.space(), template.name(), knob, value)?;
                    let kept: Vec<_> = valid
                        .into_iter()
                        .filter(|(_, c)| c.0.get(knob).is_some_and(|v| v.to_string() == *value))
                        .collect();
                    if kept.is_empty() {
                        println!("{key}: no valid {} config has {knob}={value}", template.name());
                        *counts.entry("skipped_no_match".into()).or_default() += 1;
                        continue;
                    }
                    kept
                }
                None => valid,
            };
            let chosen = spread(&valid, per);
            let specs = chosen.iter().map(|(_, c)| template.generate(w, c, &target)).collect::<Result<Vec<_>, _>>()?;
            // Compile them all at once on a few threads; measure one by one.
            let compiled: Vec<_> = std::thread::scope(|s| {
                let handles: Vec<_> = specs
                    .iter()
                    .map(|spec| s.spawn(|| nvrtc::compile(&spec.source, &spec.name, &target.nvrtc_arch(), &inc)))
                    .collect();
                handles.into_iter().map(|h| h.join().expect("compile thread")).collect()
            });
            let mut first = true;
            for (((index, config), spec), compiled) in chosen.into_iter().zip(&specs).zip(compiled) {
                let compiled = match compiled {
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
                    launch: Launch::of(spec),
                    cubin: compiled.cubin,
                    support_cubin: if first { support_cubin.clone() } else { Vec::new() },
                    tolerance: Tolerance::for_workload(w),
                    samples,
                    min_sample_ms: 1.0,
                    min_batch: 50,
                    sample_launches: 0,
                    flush_l2: false,
                    baseline: first,
                    fresh_baseline: false,
                    repick_baseline: false,
                    model_us: 0.0,
                    vendor_model_us: 0.0,
                };
                first = false;
                let o = exec.measure(&req);
                let status = format!("{:?}", o.status);
                *counts.entry(status.clone()).or_default() += 1;
                println!(
                    "{key} #{index} {config} {}: {status} {:.2} us (x{} spread {:.3}) base {:?} {} err {:?}/{:?} regs {} smem {} {:.0} ms {}",
                    spec.name,
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
                    exec = CudaExecutor::new(0).context("opening cuda:0")?;
                    first = true;
                }
            }
        }
    }
    println!("SUMMARY {counts:?}");
    if let Some((knob, value)) = &knob_filter {
        let measured: usize = counts.iter().filter(|(s, _)| !s.starts_with("skipped")).map(|(_, n)| n).sum();
        anyhow::ensure!(
            measured > 0,
            "SELFTEST_KNOB {knob}={value}: no workload had a valid config with it; nothing was checked"
        );
    }
    let bad: usize = counts
        .iter()
        .filter(|(status, _)| !matches!(status.as_str(), "Ok" | "skipped_unsupported" | "skipped_no_match"))
        .map(|(_, n)| n)
        .sum();
    anyhow::ensure!(bad == 0, "{bad} kernels or workloads were not Ok");
    Ok(())
}

/// Fails unless `knob` is a knob of the template's space and `value` one of its values, naming
/// what is allowed (a misspelt filter would otherwise keep nothing and check nothing).
fn check_knob(space: Space, template: &str, knob: &str, value: &str) -> anyhow::Result<()> {
    let Some(k) = space.knobs.iter().find(|k| k.name == knob) else {
        let names: Vec<_> = space.knobs.iter().map(|k| k.name).collect();
        anyhow::bail!("SELFTEST_KNOB: {template} has no knob {knob:?}; its knobs are {}", names.join(", "));
    };
    let values: Vec<String> = k.values.iter().map(|v| v.to_string()).collect();
    anyhow::ensure!(
        values.iter().any(|v| v == value),
        "SELFTEST_KNOB: {template}'s {knob} takes {}, not {value:?}",
        values.join(", ")
    );
    Ok(())
}

/// `per` configs of `valid`: evenly spaced over the space, and round-robin over the kinds of
/// config that run different code (path, gather, split-K and its reduction; gemm configs are all
/// one kind), so that every kind a workload allows is checked.
fn spread(valid: &[(u64, Config)], per: usize) -> Vec<&(u64, Config)> {
    let kind = |c: &Config| {
        let name = |k| c.name(k).unwrap_or("").to_owned();
        let split = c.int("split_k").is_ok_and(|s| s > 1);
        let int = |k| c.int(k).map_or(String::new(), |v| v.to_string());
        (
            name("path"),
            name("gather"),
            if split { name("split_reduce") } else { String::new() },
            (name("producer"), name("schedule"), int("cluster"), int("persistent"), int("stream_k"), name("epilogue")),
        )
    };
    let mut kinds: BTreeMap<_, Vec<&(u64, Config)>> = BTreeMap::new();
    for v in valid {
        kinds.entry(kind(&v.1)).or_default().push(v);
    }
    // Each kind's share of the picks, evenly spaced over its configs (from the middle of each
    // stretch, so small and large tiles both come up), then taken in turns.
    let share = per.div_ceil(kinds.len().max(1));
    let queues: Vec<Vec<&(u64, Config)>> = kinds
        .into_values()
        .map(|g| {
            let step = (g.len() / share).max(1);
            g.into_iter().skip(step / 2).step_by(step).collect()
        })
        .collect();
    let mut out = Vec::new();
    let mut round = 0;
    while out.len() < per && queues.iter().any(|q| round < q.len()) {
        for q in &queues {
            if let Some(v) = q.get(round)
                && out.len() < per
            {
                out.push(*v);
            }
        }
        round += 1;
    }
    out.sort_by_key(|(i, _)| *i);
    out
}

/// Every type combination x every layout x three shapes: a square one, a skinny one, and one whose
/// M and N are not multiples of 16 (K stays a multiple of 16 for i8).
fn matrix() -> Vec<String> {
    let types = ["f16,f32,f32", "f16,f32,f16", "f16,f16,f16", "bf16,f32,f32", "bf16,f32,bf16", "i8,i32,i32"];
    // wgmma_gemm's TMA wants 16-byte rows, so its ragged shape keeps M and N multiples of 8.
    let ragged = if std::env::var("SELFTEST_TEMPLATE").is_ok_and(|t| t.starts_with("wgmma")) {
        (1000, 1000, 1024)
    } else {
        (1000, 1001, 1024)
    };
    let shapes = [(256, 256, 256), (512, 32, 512), ragged];
    let mut keys = Vec::new();
    for t in types {
        for layout in ["nn", "nt", "tn", "tt"] {
            for (m, n, k) in shapes {
                keys.push(format!("matmul/m{m}n{n}k{k}/{layout}/{t}/alpha=1,beta=0"));
            }
        }
    }
    keys
}

/// The new types' workloads for a correctness run, each on every template that supports it: the
/// types suite's shapes (f32 exact and tf32 at 1024^3 and 4096^3, nn and tn: tf32 in tn is
/// wgmma_gemm's too; s4 and b1 at 4096^3 and 512x64x4096), every layout of f32 and tf32 and
/// every packed type (u4, b1and too) on a small square, a ragged shape with an epilogue reading C,
/// and a K of one MMA step past a stage.
fn types_matrix() -> Vec<String> {
    let mut keys = Vec::new();
    for t in ["f32,f32,f32", "tf32,f32,f32"] {
        for (m, n, k) in [(1024, 1024, 1024), (4096, 4096, 4096)] {
            for layout in ["nn", "tn"] {
                keys.push(format!("matmul/m{m}n{n}k{k}/{layout}/{t}/alpha=1,beta=0"));
            }
        }
        for layout in ["nn", "nt", "tn", "tt"] {
            keys.push(format!("matmul/m256n256k256/{layout}/{t}/alpha=1,beta=0"));
            keys.push(format!("matmul/m1000n72k260/{layout}/{t}/alpha=0.5,beta=-1"));
        }
    }
    for t in ["s4", "u4", "b1xor", "b1and"] {
        let k_step = if t.starts_with("b1") { 128 } else { 32 };
        for (m, n, k) in [(4096, 4096, 4096), (512, 64, 4096), (256, 256, 256), (1000, 72, 1024 + k_step)] {
            keys.push(format!("matmul/m{m}n{n}k{k}/tn/{t},i32,i32/alpha=1,beta=0"));
        }
        keys.push(format!("matmul/m200n136k{}/tn/{t},i32,i32/alpha=2,beta=3", 4 * k_step));
    }
    keys
}

/// Conv workloads for a correctness run: every type combination x shapes with padding, stride 2,
/// dilation 2, ragged output tiles (N*P*Q and K not multiples of the tiles), 1x3 / 3x1 / 7x7
/// filters, pointwise layers, and the seven tuning layers.
fn conv_matrix() -> Vec<String> {
    let types = ["f16,f32,f32", "f16,f32,f16", "f16,f16,f16", "bf16,f32,f32", "i8,i32,i32"];
    // (n, h, w, c, k, r, s, pad, stride, dilation), pad/stride/dilation as "HxW".
    let shapes = [
        (2, 7, 5, 16, 24, 3, 3, "1x1", "1x1", "1x1"),
        (3, 9, 9, 16, 40, 3, 3, "1x1", "2x2", "1x1"),
        (1, 10, 11, 16, 40, 3, 3, "2x2", "1x1", "2x2"),
        (1, 13, 17, 32, 48, 1, 3, "0x1", "1x1", "1x1"),
        (2, 12, 9, 32, 32, 3, 1, "1x0", "1x2", "1x1"),
        (1, 30, 30, 16, 64, 7, 7, "3x3", "2x2", "1x1"),
        (3, 5, 7, 32, 48, 1, 1, "0x0", "1x1", "1x1"),
        (4, 14, 14, 64, 96, 1, 1, "0x0", "2x2", "1x1"),
        // Channels a multiple of a K tile (wgmma_conv2d's TMA im2col loads; 128 for i8): dilated,
        // strided and ragged, non-square windows and strides.
        (2, 10, 11, 64, 40, 3, 3, "2x2", "1x1", "2x2"),
        (3, 9, 9, 128, 48, 3, 3, "1x1", "2x2", "1x1"),
        (1, 13, 17, 64, 48, 1, 3, "0x1", "1x1", "1x1"),
        (2, 12, 9, 128, 32, 3, 1, "1x0", "1x2", "1x1"),
        // The tuning layers: MobileNet pointwise, ResNet 3x3, a stride-2 3x3.
        (1, 56, 56, 64, 128, 1, 1, "0x0", "1x1", "1x1"),
        (1, 28, 28, 128, 256, 1, 1, "0x0", "1x1", "1x1"),
        (1, 28, 28, 256, 256, 1, 1, "0x0", "1x1", "1x1"),
        (32, 56, 56, 64, 128, 1, 1, "0x0", "1x1", "1x1"),
        (32, 56, 56, 64, 64, 3, 3, "1x1", "1x1", "1x1"),
        (1, 14, 14, 256, 256, 3, 3, "1x1", "1x1", "1x1"),
        (1, 56, 56, 64, 128, 3, 3, "1x1", "2x2", "1x1"),
    ];
    let mut keys = Vec::new();
    for t in types {
        for (n, h, w, c, k, r, s, pad, stride, dil) in shapes {
            keys.push(format!("conv2d/n{n}h{h}w{w}c{c}/k{k}r{r}s{s}/pad{pad},stride{stride},dil{dil}/nhwc/{t}"));
        }
    }
    keys
}

/// Exact f32 and tf32 conv layers for a correctness run: padding, stride 2, dilation 2, ragged
/// output tiles, non-square filters and strides, pointwise layers, the fewest channels (4: one
/// 16-byte vector of floats), and the types-conv suite's layers. On wgmma_conv2d (tf32), channels
/// that are a multiple of 32 (a K tile of floats) load by TMA in im2col mode, the others (12, 16,
/// 4) are gathered, and 1x1 stride-1 unpadded layers load by TMA tiles. Exact f32 goes to
/// simt_conv2d, which also gets two layers of 3 and 6 channels.
fn conv32_matrix() -> Vec<String> {
    // (n, h, w, c, k, r, s, pad, stride, dilation), pad/stride/dilation as "HxW".
    let shapes = [
        // Gathered on wgmma_conv2d: channels not a multiple of 32.
        (2, 7, 5, 16, 24, 3, 3, "1x1", "1x1", "1x1"),
        (3, 9, 9, 16, 40, 3, 3, "1x1", "2x2", "1x1"),
        (1, 10, 11, 16, 40, 3, 3, "2x2", "1x1", "2x2"),
        (1, 13, 17, 12, 48, 1, 3, "0x1", "1x1", "1x1"),
        (1, 30, 30, 4, 64, 7, 7, "3x3", "2x2", "1x1"),
        // Im2col on wgmma_conv2d: whole K tiles of 32 channels.
        (2, 10, 11, 64, 40, 3, 3, "2x2", "1x1", "2x2"),
        (3, 9, 9, 32, 48, 3, 3, "1x1", "2x2", "1x1"),
        (2, 12, 9, 96, 32, 3, 1, "1x0", "1x2", "1x1"),
        // Pointwise (TMA tiles) and a strided 1x1 (not pointwise).
        (3, 5, 7, 32, 48, 1, 1, "0x0", "1x1", "1x1"),
        (4, 14, 14, 64, 96, 1, 1, "0x0", "2x2", "1x1"),
        // The types-conv suite's layers.
        (8, 56, 56, 64, 64, 3, 3, "1x1", "1x1", "1x1"),
        (32, 28, 28, 128, 128, 1, 1, "0x0", "1x1", "1x1"),
        (8, 56, 56, 64, 128, 3, 3, "1x1", "2x2", "1x1"),
    ];
    let mut keys = Vec::new();
    for t in ["f32,f32,f32", "tf32,f32,f32"] {
        for (n, h, w, c, k, r, s, pad, stride, dil) in shapes {
            keys.push(format!("conv2d/n{n}h{h}w{w}c{c}/k{k}r{r}s{s}/pad{pad},stride{stride},dil{dil}/nhwc/{t}"));
        }
    }
    // Exact f32 only (simt_conv2d): channels that leave 1- and 2-float vectors.
    keys.push("conv2d/n2h9w7c3/k20r5s5/pad2x2,stride1x1,dil1x1/nhwc/f32,f32,f32".into());
    keys.push("conv2d/n1h12w10c6/k48r3s2/pad1x0,stride2x1,dil1x2/nhwc/f32,f32,f32".into());
    keys
}
