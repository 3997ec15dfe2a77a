//! NVRTC compiles what `wgmma_conv2d` emits for sm_90a, on the CPU: over 60 configs spread over
//! every 16-bit and 8-bit input type, and a further sample of tf32 layers (f32 data, TF32
//! wgmmas), all three load paths (a pointwise layer read by TMA tiles, TMA im2col where
//! the channels are a multiple of a K tile, the gather everywhere else),
//! padding, stride 2, dilation 2, ragged tiles, non-square filters, the fewest channels each type
//! allows, and every kind of config (producer, schedule, cluster, persistence, stream-K,
//! epilogue). A serialized wgmma or an ignored setmaxnreg counts as a failure, as in the worker.

use tensortune_kernels::template::valid_configs;
use tensortune_kernels::wgmma::conv::WgmmaConv2d;
use tensortune_kernels::{Conv2d, DType, KernelSpec, Target, Template, Types, Workload};

use crate::common::{assert_all_compile, least_seen_kinds, wgmma_kind as kind};

/// A layer: batch, (h, w), c -> k, filter (r, s), pad, stride, dilation.
#[allow(clippy::too_many_arguments)]
fn layer(
    n: u64,
    hw: (u64, u64),
    c: u64,
    k: u64,
    rs: (u64, u64),
    pad: (u64, u64),
    stride: u64,
    dil: u64,
    t: Types,
) -> Conv2d {
    Conv2d {
        n,
        h: hw.0,
        w: hw.1,
        c,
        k,
        r: rs.0,
        s: rs.1,
        pad,
        stride: (stride, stride),
        dilation: (dil, dil),
        types: t,
        epilogue: Default::default(),
        residual: false,
    }
}

/// Kernels of a sample per load path, by the kernel's name: the gather, TMA im2col, or a
/// pointwise layer's TMA tiles.
#[derive(Default)]
struct LoadPaths {
    gathered: usize,
    im2col: usize,
    pointwise: usize,
}

impl LoadPaths {
    fn count(&mut self, spec: &KernelSpec) {
        if spec.name.contains("gather") {
            self.gathered += 1
        } else if spec.name.contains("im2col") {
            self.im2col += 1
        } else {
            self.pointwise += 1
        }
    }
}

impl std::fmt::Display for LoadPaths {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} gathered, {} im2col, {} pointwise", self.gathered, self.im2col, self.pointwise)
    }
}

#[test]
fn a_sample_of_wgmma_conv_configs_compiles_for_sm90a() {
    let target = Target::sm90();
    let mut specs: Vec<KernelSpec> = Vec::new();
    let mut kinds = std::collections::BTreeMap::new();
    let mut paths = LoadPaths::default();
    let mut turn = 0usize;
    let mut all_offered = std::collections::BTreeSet::new();
    // The tensor-core types wgmma_conv2d takes (not f32, tf32 or the packed matmul-only types).
    for (input, acc, outs) in Types::SUPPORTED.iter().filter(|r| matches!(r.0, DType::F16 | DType::Bf16 | DType::I8)) {
        for out in *outs {
            let t = Types::new(*input, *acc, Some(*out)).unwrap();
            let unit = if *input == DType::I8 { 16 } else { 8 };
            let layers = [
                layer(32, (56, 56), 64, 128, (1, 1), (0, 0), 1, 1, t),
                layer(32, (56, 56), 64, 64, (3, 3), (1, 1), 1, 1, t),
                layer(16, (14, 14), 256, 256, (3, 3), (1, 1), 2, 1, t),
                layer(2, (7, 9), unit, 40, (3, 3), (1, 1), 1, 2, t),
                layer(3, (13, 17), 2 * unit, 48, (1, 3), (0, 1), 1, 1, t),
                layer(3, (5, 7), 4 * unit, 72, (1, 1), (0, 0), 1, 1, t),
                // A K tile's channels (64, or 128 for i8), dilated and strided, ragged output.
                layer(2, (11, 13), 8 * unit, 40, (3, 2), (2, 1), 2, 2, t),
            ];
            for l in layers {
                let w = Workload::Conv2d(l);
                let valid = valid_configs(&WgmmaConv2d, &w, &target).unwrap();
                assert!(!valid.is_empty(), "no valid config for {}", w.key());
                // One config of the kinds compiled least so far, more (up to three) where the layer
                // offers kinds the sample has not compiled yet.
                let offered: std::collections::BTreeSet<String> = valid.iter().map(|(_, c)| kind(c)).collect();
                all_offered.extend(offered.iter().cloned());
                let unseen = offered.iter().filter(|k| !kinds.contains_key(*k)).count();
                for c in least_seen_kinds(&valid, kind, unseen.clamp(1, 3), turn, &mut kinds) {
                    let spec = WgmmaConv2d.generate(&w, &c, &target).unwrap();
                    paths.count(&spec);
                    specs.push(spec);
                }
                turn += 1;
            }
        }
    }
    eprintln!("{} sampled configs ({paths}) of {} kinds", specs.len(), kinds.len());
    assert!(specs.len() >= 60, "only {} sampled configs", specs.len());
    assert!(paths.gathered >= 15 && paths.im2col >= 20 && paths.pointwise >= 15, "{paths}");
    assert!(kinds.len() >= 30, "only {} kinds of config: {kinds:?}", kinds.len());
    let missed: Vec<&String> = all_offered.iter().filter(|k| !kinds.contains_key(*k)).collect();
    assert!(missed.is_empty(), "kinds some layer offers that the sample did not compile: {missed:?}");
    assert_all_compile(&specs, &target);
}

/// TF32 (f32 data, `m64nNk8.f32.tf32.tf32`): a K tile is 32 channels and a 16-byte unit 4, so the
/// layers put each load path at its tf32 boundary: im2col from 32 channels, the gather at the
/// fewest (4) and where a K tile straddles taps (48), pointwise TMA tiles of floats.
#[test]
fn a_sample_of_tf32_wgmma_conv_configs_compiles_for_sm90a() {
    let target = Target::sm90();
    let t = Types::default_for(DType::Tf32).unwrap();
    let layers = [
        layer(8, (56, 56), 64, 64, (3, 3), (1, 1), 1, 1, t),
        layer(32, (28, 28), 128, 128, (1, 1), (0, 0), 1, 1, t),
        layer(2, (11, 13), 32, 40, (3, 2), (2, 1), 2, 2, t),
        layer(2, (7, 9), 4, 40, (3, 3), (1, 1), 1, 2, t),
        layer(3, (13, 17), 48, 48, (1, 3), (0, 1), 2, 1, t),
        layer(3, (5, 7), 12, 72, (1, 1), (0, 0), 1, 1, t),
    ];
    let mut specs: Vec<KernelSpec> = Vec::new();
    let mut kinds = std::collections::BTreeSet::new();
    let mut paths = LoadPaths::default();
    for (turn, l) in layers.into_iter().enumerate() {
        let w = Workload::Conv2d(l);
        let valid = valid_configs(&WgmmaConv2d, &w, &target).unwrap();
        assert!(!valid.is_empty(), "no valid config for {}", w.key());
        for (_, c) in valid.iter().skip(turn % 5).step_by(valid.len() / 8 + 1) {
            kinds.insert(kind(c));
            let spec = WgmmaConv2d.generate(&w, c, &target).unwrap();
            assert!(spec.source.contains("k8.f32.tf32.tf32"), "{} issues no tf32 wgmma", spec.name);
            paths.count(&spec);
            specs.push(spec);
        }
    }
    eprintln!("{} sampled tf32 configs ({paths})", specs.len());
    assert!(paths.gathered >= 10 && paths.im2col >= 10 && paths.pointwise >= 10, "{paths}");
    assert!(kinds.len() >= 8, "only {} kinds of config: {kinds:?}", kinds.len());
    assert_all_compile(&specs, &target);
}

/// Conv2d epilogues (issue 36): bias + ReLU and ResNet's block end (residual + bias + ReLU) on
/// each load path, and scale + bias + GELU into f32, a few configs each (the TMA-store epilogue
/// and the direct one among them): the fused branches of the shared body compile for sm_90a.
#[test]
fn fused_wgmma_conv_epilogues_compile_for_sm90a() {
    let target = Target::sm90();
    let f16 = Types::new(DType::F16, DType::F32, Some(DType::F16)).unwrap();
    let f32_out = Types::new(DType::F16, DType::F32, Some(DType::F32)).unwrap();
    let fused = |l: Conv2d, epi: &str, residual: bool| Conv2d { epilogue: epi.parse().unwrap(), residual, ..l };
    let layers = [
        fused(layer(32, (56, 56), 64, 256, (1, 1), (0, 0), 1, 1, f16), "bias", true),
        fused(layer(32, (56, 56), 64, 64, (3, 3), (1, 1), 1, 1, f16), "bias+relu", false),
        fused(layer(3, (9, 9), 16, 40, (3, 3), (1, 1), 2, 1, f16), "bias+relu", true),
        fused(layer(3, (13, 17), 32, 48, (1, 3), (0, 1), 1, 1, f32_out), "scale+bias+gelu", false),
    ];
    let mut specs: Vec<KernelSpec> = Vec::new();
    let mut stores = std::collections::BTreeSet::new();
    for (turn, l) in layers.into_iter().enumerate() {
        let w = Workload::Conv2d(l);
        let valid = valid_configs(&WgmmaConv2d, &w, &target).unwrap();
        for (_, c) in valid.iter().skip(turn).step_by(valid.len() / 3 + 1) {
            stores.insert(c.name("epilogue").unwrap().to_string());
            let spec = WgmmaConv2d.generate(&w, c, &target).unwrap();
            assert!(spec.source.contains("constexpr bool EPI_BIAS = true;"), "{}", spec.name);
            assert_eq!(spec.source.contains("constexpr bool READ_C = true;"), l.residual, "{}", spec.name);
            specs.push(spec);
        }
    }
    assert!(specs.len() >= 10 && stores.len() == 2, "{} configs, epilogue stores {stores:?}", specs.len());
    assert_all_compile(&specs, &target);
}
