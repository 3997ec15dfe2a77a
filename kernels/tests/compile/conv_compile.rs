//! NVRTC compiles what `wmma_conv2d` generates, for sm_80 and sm_90: a fixed sample of configs
//! over the layers the template is tuned for (MobileNet pointwise layers, ResNet 3x3 layers, a
//! stride-2 3x3) and shapes that exercise the gather (padding, stride 2, dilation 2, ragged output
//! tiles, 1x3 and 3x1 filters, a 7x7 stride-2 stem, the fewest channels each input type allows),
//! in every type combination (three of the five a shape, in turn), on both paths; and the same shapes as tf32 (f32 data, m16n16k8 TF32
//! fragments). No GPU needed.
//!
//! As in `generated_kernels_compile.rs`, kernels are compiled in batches (the shared preamble,
//! then each kernel's self-contained block), on every core; a failing batch is recompiled kernel
//! by kernel to name the culprit with its log.

use std::collections::BTreeMap;
use std::time::Instant;

use tensortune_kernels::conv::WmmaConv2d;
use tensortune_kernels::template::valid_configs;
use tensortune_kernels::{Config, Conv2d, DType, Template, Types, Workload};

use crate::common::{InTurn, assert_all_compile};

/// Configs per workload: round-robin over the kinds from a start drawn per workload, so one per
/// workload still reaches every kind (the asserts below), at half the NVRTC time of two.
const PER_WORKLOAD: usize = 1;
/// Type combinations compiled per shape, in turn: each combination meets three fifths of the shapes.
const TYPES_PER_SHAPE: usize = 3;
/// The tf32 layers are fewer (one type): two configs each reach every kind.
const PER_TF32_WORKLOAD: usize = 2;

/// A conv: batch, (h, w), c -> k, filter (r, s), pad, stride, dilation.
#[allow(clippy::too_many_arguments)]
fn conv(
    n: u64,
    (h, w): (u64, u64),
    c: u64,
    k: u64,
    (r, s): (u64, u64),
    pad: (u64, u64),
    stride: (u64, u64),
    dilation: (u64, u64),
) -> Conv2d {
    let types = Types::default_for(DType::F16).unwrap();
    Conv2d { n, h, w, c, k, r, s, pad, stride, dilation, types, epilogue: Default::default(), residual: false }
}

/// The shapes: the seven tuning bars first, then the gather's corner cases.
fn shapes() -> Vec<(&'static str, Conv2d)> {
    let one = (1, 1);
    vec![
        ("1x1 n1 56x56 64->128", conv(1, (56, 56), 64, 128, one, (0, 0), one, one)),
        ("1x1 n1 28x28 128->256", conv(1, (28, 28), 128, 256, one, (0, 0), one, one)),
        ("1x1 n1 28x28 256->256", conv(1, (28, 28), 256, 256, one, (0, 0), one, one)),
        ("1x1 n32 56x56 64->128", conv(32, (56, 56), 64, 128, one, (0, 0), one, one)),
        ("3x3 n32 56x56 64->64", conv(32, (56, 56), 64, 64, (3, 3), (1, 1), one, one)),
        ("3x3 n1 14x14 256->256", conv(1, (14, 14), 256, 256, (3, 3), (1, 1), one, one)),
        ("3x3 s2 n1 56x56 64->128", conv(1, (56, 56), 64, 128, (3, 3), (1, 1), (2, 2), one)),
        ("3x3 pad 1, ragged", conv(2, (7, 5), 16, 24, (3, 3), (1, 1), one, one)),
        ("3x3 s2 c16 ragged", conv(3, (9, 9), 16, 40, (3, 3), (1, 1), (2, 2), one)),
        ("3x3 dilation 2", conv(1, (10, 11), 16, 40, (3, 3), (2, 2), one, (2, 2))),
        ("1x3 pad 0x1", conv(1, (13, 17), 32, 48, (1, 3), (0, 1), one, one)),
        ("3x1 pad 1x0 stride 1x2", conv(2, (12, 9), 32, 32, (3, 1), (1, 0), (1, 2), one)),
        ("7x7 s2 pad 3, c8", conv(1, (30, 30), 8, 64, (7, 7), (3, 3), (2, 2), one)),
        ("3x3 c8 (f16 minimum)", conv(1, (9, 9), 8, 16, (3, 3), (1, 1), one, one)),
        ("3x3 c16 (i8 minimum)", conv(1, (10, 10), 16, 32, (3, 3), (1, 1), one, one)),
        ("1x1 stride 2 (implicit only)", conv(4, (14, 14), 64, 96, one, (0, 0), (2, 2), one)),
        ("1x1 ragged pointwise", conv(3, (5, 7), 32, 48, one, (0, 0), one, one)),
    ]
}

/// The type combinations: f16 -> f32, f16 -> f16 (both accumulators), bf16 -> f32, i8 -> i32.
fn types() -> Vec<Types> {
    vec![
        Types::new(DType::F16, DType::F32, Some(DType::F32)).unwrap(),
        Types::new(DType::F16, DType::F32, Some(DType::F16)).unwrap(),
        Types::new(DType::F16, DType::F16, Some(DType::F16)).unwrap(),
        Types::new(DType::Bf16, DType::F32, Some(DType::F32)).unwrap(),
        Types::new(DType::I8, DType::I32, Some(DType::I32)).unwrap(),
    ]
}

/// The kind of a config, for spreading a sample over them: path, gather, split-K and its reduction.
fn kind(c: &Config) -> String {
    let split = c.int("split_k").unwrap() > 1;
    format!(
        "{}/{}/{}",
        c.name("path").unwrap(),
        c.name("gather").unwrap(),
        if split { c.name("split_reduce").unwrap() } else { "none" }
    )
}

/// `per` configs of `valid`, round-robin over its kinds from a kind drawn with a fixed LCG (so that
/// with fewer picks than kinds, successive workloads start at different kinds), each kind's picks
/// drawn with the same LCG.
fn sample(valid: &[(u64, Config)], per: usize, seed: &mut u64) -> Vec<Config> {
    let mut kinds: BTreeMap<String, Vec<&Config>> = BTreeMap::new();
    for (_, c) in valid {
        kinds.entry(kind(c)).or_default().push(c);
    }
    let mut groups: Vec<Vec<&Config>> = kinds.into_values().collect();
    *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let first = (*seed >> 33) as usize % groups.len().max(1);
    groups.rotate_left(first);
    let mut out = Vec::new();
    while out.len() < per && groups.iter().any(|g| !g.is_empty()) {
        for g in groups.iter_mut().filter(|g| !g.is_empty()) {
            if out.len() == per {
                break;
            }
            *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let at = (*seed >> 33) as usize % g.len();
            out.push(g.swap_remove(at).clone());
        }
    }
    out
}

#[test]
fn a_sample_of_conv_configs_compiles_for_sm80_and_sm90() {
    let started = Instant::now();
    let mut seed = 0x7e57_c0de_u64;
    let mut total = 0;
    let mut seen_kinds = BTreeMap::new();
    let mut turns = InTurn::new();
    let all_types = types();
    for (i, (label, shape)) in shapes().into_iter().enumerate() {
        // TYPES_PER_SHAPE of the type combinations, turning from one shape to the next.
        for j in 0..TYPES_PER_SHAPE {
            let types = all_types[(i + j) % all_types.len()];
            let w = Workload::Conv2d(Conv2d { types, ..shape });
            let target = turns.target();
            if types.input == DType::I8 && shape.c % 16 != 0 {
                // i8 vectors are 16 channels: such a conv is rejected, with the field named.
                let e = WmmaConv2d.supports(&w, &target).unwrap_err();
                assert_eq!(e.field(), Some("c"), "{label}: {e}");
                continue;
            }
            let valid = valid_configs(&WmmaConv2d, &w, &target).unwrap();
            assert!(valid.len() >= PER_WORKLOAD, "{label} {}: {} valid configs", w.key(), valid.len());
            let picked = sample(&valid, PER_WORKLOAD, &mut seed);
            for c in &picked {
                *seen_kinds.entry(kind(c)).or_insert(0) += 1;
            }
            turns.add(picked.iter().map(|c| WmmaConv2d.generate(&w, c, &target).unwrap()));
        }
    }
    for (target, specs) in turns.each(20) {
        total += specs.len();
        assert_all_compile(specs, target);
    }
    // Both paths, both gathers, and split-K through the workspace and through clusters (sm_90).
    for want in ["pointwise/regs/none", "implicit/regs/none", "implicit/smem/none", "implicit/regs/workspace"] {
        assert!(seen_kinds.contains_key(want), "no {want} config in the sample: {seen_kinds:?}");
    }
    assert!(seen_kinds.keys().any(|k| k.ends_with("/cluster")), "no cluster split-K in the sample: {seen_kinds:?}");
    eprintln!("{total} conv kernels compiled in {:.1} s; kinds {seen_kinds:?}", started.elapsed().as_secs_f64());
}

/// The same shapes as tf32 layers: f32 tiles, m16n16k8 TF32 fragments rounded to TF32, channels
/// in vectors of 4 floats (every shape's channels qualify).
#[test]
fn a_sample_of_tf32_conv_configs_compiles_for_sm80_and_sm90() {
    let started = Instant::now();
    let mut seed = 0x7f32_c0de_u64;
    let types = Types::default_for(DType::Tf32).unwrap();
    let mut seen_kinds = BTreeMap::new();
    let mut total = 0;
    let mut turns = InTurn::new();
    for (label, shape) in shapes() {
        let w = Workload::Conv2d(Conv2d { types, ..shape });
        let target = turns.target();
        let valid = valid_configs(&WmmaConv2d, &w, &target).unwrap();
        assert!(valid.len() >= PER_TF32_WORKLOAD, "{label} {}: {} valid configs", w.key(), valid.len());
        let mut specs = Vec::new();
        for c in sample(&valid, PER_TF32_WORKLOAD, &mut seed) {
            *seen_kinds.entry(kind(&c)).or_insert(0) += 1;
            let spec = WmmaConv2d.generate(&w, &c, &target).unwrap();
            assert!(spec.source.contains("#define TT_TF32 1"), "{}", spec.name);
            specs.push(spec);
        }
        turns.add(specs);
    }
    for (target, specs) in turns.each(1) {
        total += specs.len();
        assert_all_compile(specs, target);
    }
    for want in ["pointwise/regs/none", "implicit/regs/none", "implicit/smem/none"] {
        assert!(seen_kinds.contains_key(want), "no {want} config in the sample: {seen_kinds:?}");
    }
    eprintln!("{total} tf32 conv kernels compiled in {:.1} s; kinds {seen_kinds:?}", started.elapsed().as_secs_f64());
}
