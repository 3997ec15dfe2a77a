//! NVRTC compiles what the generator emits: for the first workload, a set of its valid configs
//! that holds every pair of knob values any valid config holds (and, run by the GPU machine's
//! script, every valid config); a sample across every dtype and layout; and every support module.
//! No GPU needed (NVRTC alone, from the PyPI wheels that scripts/setup-nvrtc.sh installs); cubins
//! are built for sm_80 and sm_90.
//!
//! Kernels are compiled in batches: every generated source is a shared preamble plus one
//! self-contained block in its own namespace (`kernels::cuda::PREAMBLE`), so a batch is the
//! preamble followed by the blocks, byte for byte as the worker compiles them one at a time. A
//! failing batch is recompiled kernel by kernel to name the culprit with its log.

use std::collections::{HashMap, HashSet};

use tensortune_kernels::template::valid_configs;
use tensortune_kernels::{
    Config, DType, KernelSpec, Launch, Layout, Matmul, Target, Template, Types, Workload, gemm, support,
};
use tensortune_nvrtc as nvrtc;

use crate::common::{InTurn, assert_all_compile, include_dir};

fn matmul(m: u64, n: u64, k: u64, layout: Layout, types: Types) -> Workload {
    Workload::Matmul(Matmul::new(m, n, k, layout, types).unwrap())
}

fn generate(w: &Workload, target: &Target, configs: &[Config]) -> Vec<KernelSpec> {
    configs.iter().map(|c| gemm::WmmaGemm.generate(w, c, target).unwrap()).collect()
}

/// The pairs of knob values a config holds (each knob's value with every other's).
fn value_pairs(config: &Config) -> Vec<(String, String)> {
    let values: Vec<String> = config.0.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
    let mut pairs = Vec::new();
    for (i, a) in values.iter().enumerate() {
        for b in &values[i + 1..] {
            pairs.push((a.clone(), b.clone()));
        }
    }
    pairs
}

/// A greedy all-pairs cover of `configs`: configs taken one by one, each the one holding the most
/// value pairs not yet held, until every pair that some config holds is held by one taken. A
/// generator bug that shows in a combination of two knob values shows in one of these.
fn pairwise_cover(configs: &[Config]) -> Vec<Config> {
    let mut ids: HashMap<(String, String), usize> = HashMap::new();
    let pairs: Vec<Vec<usize>> = configs
        .iter()
        .map(|c| {
            value_pairs(c)
                .into_iter()
                .map(|p| {
                    let next = ids.len();
                    *ids.entry(p).or_insert(next)
                })
                .collect()
        })
        .collect();
    let mut open = vec![true; ids.len()];
    let mut left = ids.len();
    let mut taken = Vec::new();
    while left > 0 {
        let gain = |p: &Vec<usize>| p.iter().filter(|&&id| open[id]).count();
        let best = (0..configs.len()).max_by_key(|&i| (gain(&pairs[i]), std::cmp::Reverse(i))).expect("configs");
        for &id in &pairs[best] {
            if open[id] {
                open[id] = false;
                left -= 1;
            }
        }
        taken.push(configs[best].clone());
    }
    taken
}

#[test]
fn every_pair_of_knob_values_of_512x64x512_compiles_for_sm80_and_sm90() {
    let w = matmul(512, 64, 512, Layout::Nn, Types::default_for(DType::F16).unwrap());
    for target in [Target::sm80(), Target::sm90()] {
        let valid: Vec<Config> =
            valid_configs(&gemm::WmmaGemm, &w, &target).unwrap().into_iter().map(|(_, c)| c).collect();
        assert!(valid.len() >= 100, "only {} valid configs on {}", valid.len(), target.name);
        let cover = pairwise_cover(&valid);
        // Every pair any valid config holds is held by one of the cover, and the cover is no
        // bigger than it needs: a fraction of the space.
        let held: HashSet<(String, String)> = cover.iter().flat_map(value_pairs).collect();
        assert!(valid.iter().flat_map(value_pairs).all(|p| held.contains(&p)), "a pair is not covered");
        assert!(cover.len() * 5 < valid.len(), "{} of {} configs", cover.len(), valid.len());
        assert_all_compile(&generate(&w, &target, &cover), &target);
    }
}

/// Every valid config (thousands: about 4,000 kernels for the two architectures, half an hour of
/// a 2-core machine), run by `scripts/gpu-check.sh gputests` on the GPU machine's cores.
#[test]
#[ignore = "exhaustive: scripts/gpu-check.sh gputests runs it"]
fn every_config_of_512x64x512_compiles_for_sm80_and_sm90() {
    let w = matmul(512, 64, 512, Layout::Nn, Types::default_for(DType::F16).unwrap());
    for target in [Target::sm80(), Target::sm90()] {
        let valid: Vec<Config> =
            valid_configs(&gemm::WmmaGemm, &w, &target).unwrap().into_iter().map(|(_, c)| c).collect();
        assert!(valid.len() >= 100, "only {} valid configs on {}", valid.len(), target.name);
        assert_all_compile(&generate(&w, &target, &valid), &target);
    }
}

#[test]
fn support_modules_compile_for_every_type_combination() {
    let mut specs = Vec::new();
    for (input, acc, outs) in Types::SUPPORTED {
        for out in *outs {
            let types = Types::new(*input, *acc, Some(*out)).unwrap();
            // The layout sets two flags of the module (A_K_CONTIG, B_K_CONTIG), each on its own
            // branches: nn and tt take each flag both ways. Packed inputs exist in tn only, with K
            // a multiple of one sub-byte MMA step.
            let layouts: &[Layout] = if input.is_packed() { &[Layout::Tn] } else { &[Layout::Nn, Layout::Tt] };
            for &layout in layouts {
                // FP8's support modules (sm_90 only) are compiled by tests/compile/fused_compile.rs.
                if input.is_fp8() {
                    continue;
                }
                let k = 32u64.max(input.k_multiple());
                let mut m = Matmul::new(64, 48, k, layout, types).unwrap_or_else(|e| panic!("{types:?} {layout}: {e}"));
                m.beta = 1.0;
                let w = Workload::Matmul(m);
                specs.push(KernelSpec {
                    source: support::source(&w),
                    launch: Launch {
                        name: format!("support_{}", tensortune_kernels::short_digest(&w.key())),
                        entry: "tt_compare".into(),
                        grid: [1, 1, 1],
                        block: [1, 1, 1],
                        smem_bytes: 0,
                        workspace_bytes: 0,
                        args: vec![],
                    },
                });
            }
        }
    }
    // Support modules share one namespace name, so compile them one by one (batch of one). Each
    // goes to sm_80 or sm_90 in turn: the two layouts of a type combination come in a row, so
    // every unpacked combination is compiled for both (as the sampled kernels are, `InTurn`).
    let inc = include_dir();
    for (i, spec) in specs.iter().enumerate() {
        let arch = ["sm_80", "sm_90"][i % 2];
        if let Err(e) = nvrtc::compile(&spec.source, &spec.name, arch, &inc) {
            panic!("{} ({arch}): {e}", spec.name);
        }
    }
}

/// Every type combination x layout x two shapes (one ragged in M and N, one aligned with beta = 1
/// so the epilogue reads C; the aligned plain f16 shape is every pair's test above), a config
/// spread over each workload's valid space (offset per workload, so successive workloads take
/// different ones), each workload for sm_80 or sm_90 in turn (every type and layout reaches both):
/// 48 kernels in all.
#[test]
fn a_sample_of_every_dtype_and_layout_compiles_for_sm80_and_sm90() {
    const PER_WORKLOAD: usize = 1;
    let shapes: [(u64, u64, u64, f64); 2] = [(1024, 1024, 1024, 1.0), (200, 72, 272, 0.0)];
    let mut turns = InTurn::new();
    let mut workloads = 0;
    // wmma_gemm's types: the 16- and 8-bit tensor-core inputs (f32, tf32 and the packed types
    // have templates of their own, with their own compile tests). FP8 is wgmma_gemm's alone
    // (tests/compile/fused_compile.rs).
    for (input, acc, outs) in Types::SUPPORTED.iter().filter(|r| r.0.bits() <= 16 && r.0.bits() >= 8 && !r.0.is_fp8()) {
        for out in *outs {
            let types = Types::new(*input, *acc, Some(*out)).unwrap();
            for layout in Layout::ALL {
                // The shapes' order turns with each type and layout, so each shape reaches both
                // architectures (InTurn alternates per workload).
                let first = (workloads / shapes.len()) % 2;
                for (i, (m, n, k, beta)) in shapes.iter().cycle().skip(first).take(shapes.len()).enumerate() {
                    let mut mm = Matmul::new(*m, *n, *k, layout, types).unwrap();
                    mm.beta = *beta;
                    let w = Workload::Matmul(mm);
                    let target = turns.target();
                    let valid = valid_configs(&gemm::WmmaGemm, &w, &target).unwrap();
                    assert!(valid.len() >= PER_WORKLOAD, "{}: {} valid configs", w.key(), valid.len());
                    // Evenly spaced, with an offset per workload so the samples differ.
                    let step = valid.len() / PER_WORKLOAD;
                    turns.add((0..PER_WORKLOAD).map(|j| {
                        let (_, config) = &valid[j * step + (workloads * 7 + i) % step.max(1)];
                        gemm::WmmaGemm.generate(&w, config, &target).unwrap()
                    }));
                    workloads += 1;
                }
            }
        }
    }
    for (target, specs) in turns.each(20) {
        assert_all_compile(specs, target);
    }
}
