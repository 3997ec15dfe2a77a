//! NVRTC compiles what `simt_gemm` emits for sm_80 and sm_90, on the CPU: a spread over the valid
//! configs of the suite's f32 shapes (1024^3 and 4096^3) in every layout, plus a ragged shape with
//! beta = 1, taken from every warp tile and min_blocks pair that has valid configs. None may spill
//! registers to local memory (ptxas's `--warn-on-spills`): with min_blocks 2 that checks the rule
//! that ptxas held to the cap still fits the config.

use std::collections::BTreeMap;

use tensortune_kernels::simt::SimtGemm;
use tensortune_kernels::simt_conv::SimtConv2d;
use tensortune_kernels::template::valid_configs;
use tensortune_kernels::{Conv2d, DType, KernelSpec, Layout, Matmul, Target, Template, Types, Workload};

use crate::common::{InTurn, assert_all_compile_without_spills};

/// `per` valid configs of each (warp_tile, min_blocks) pair, evenly spaced, from a start that
/// differs per workload.
fn sampled(template: &dyn Template, w: &Workload, target: &Target, per: usize, turn: usize) -> Vec<KernelSpec> {
    let mut kinds: BTreeMap<String, Vec<_>> = BTreeMap::new();
    for (_, c) in valid_configs(template, w, target).unwrap() {
        let kind = format!("{}/{}", c.name("warp_tile").unwrap(), c.int("min_blocks").unwrap());
        kinds.entry(kind).or_default().push(c);
    }
    assert!(kinds.len() >= 5, "{}: only kinds {:?}", w.key(), kinds.keys().collect::<Vec<_>>());
    let mut specs = Vec::new();
    for valid in kinds.values() {
        let step = (valid.len() / per).max(1);
        for j in 0..per.min(valid.len()) {
            specs.push(template.generate(w, &valid[j * step + turn % step], target).unwrap());
        }
    }
    specs
}

#[test]
fn a_sample_of_simt_configs_compiles_without_spills_for_sm80_and_sm90() {
    let types = Types::default_for(DType::F32).unwrap();
    let mut turns = InTurn::new();
    let mut turn = 0;
    for layout in Layout::ALL {
        for (m, n, k, beta) in [(1024, 1024, 1024, 0.0), (4096, 4096, 4096, 0.0), (1000, 72, 260, 1.0)] {
            let mut mm = Matmul::new(m, n, k, layout, types).unwrap();
            mm.beta = beta;
            turns.add(sampled(&SimtGemm, &Workload::Matmul(mm), &turns.target(), 1, turn));
            turn += 1;
        }
    }
    for (target, specs) in turns.each(30) {
        assert_all_compile_without_spills(specs, target);
    }
}

#[test]
fn a_sample_of_simt_conv_configs_compiles_without_spills_for_sm80_and_sm90() {
    let types = Types::default_for(DType::F32).unwrap();
    // (n, h, w, c, k, r, pad, stride, dilation): a ResNet 3x3, a strided RGB stem (c = 3: vec 1
    // only), a dilated ragged layer and a pointwise one.
    let layers = [
        (8, 28, 28, 128, 128, 3, 1, 1, 1),
        (2, 56, 56, 3, 64, 7, 3, 2, 1),
        (3, 13, 11, 6, 40, 3, 2, 1, 2),
        (4, 14, 14, 256, 512, 1, 0, 1, 1),
    ];
    // Each layer on both architectures: four layers are too few to take turns.
    for target in [Target::sm80(), Target::sm90()] {
        let mut specs = Vec::new();
        for (turn, (n, h, w, c, k, r, pad, stride, dil)) in layers.into_iter().enumerate() {
            let conv = Conv2d {
                n,
                h,
                w,
                c,
                k,
                r,
                s: r,
                pad: (pad, pad),
                stride: (stride, stride),
                dilation: (dil, dil),
                types,
                epilogue: Default::default(),
                residual: false,
            };
            specs.extend(sampled(&SimtConv2d, &Workload::Conv2d(conv), &target, 1, turn));
        }
        assert!(specs.len() >= 20, "only {} sampled kernels", specs.len());
        assert_all_compile_without_spills(&specs, &target);
    }
}
