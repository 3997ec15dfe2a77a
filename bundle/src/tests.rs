//! Manifest parsing, the index text and entry selection, on a hand-built bundle (no GPU).

use std::collections::BTreeMap;

use crate::manifest::{FORMAT, Manifest, Provenance};
use crate::{Bundle, DType, Device, Entry, Launch, Layout, MapRecipe, Operand, Param, Problem, select};

fn matmul(m: u64, n: u64, k: u64, layout: Layout) -> Problem {
    Problem::Matmul {
        m,
        n,
        k,
        layout,
        input: DType::F16,
        accumulator: DType::F32,
        output: DType::F32,
        alpha: 1.0,
        beta: 0.0,
        epilogue: Default::default(),
    }
}

fn entry(name: &str, problem: Problem, arch: u32, sm_count: u32, time_us: f64) -> Entry {
    let cubin = if arch == 90 { "sm_90a" } else { "sm_80" };
    Entry {
        name: name.into(),
        workload_key: format!("key-of-{name}"),
        problem,
        template: "wgmma_gemm".into(),
        template_version: 1,
        config: serde_json::json!({"block_m": 128}),
        device: Device { class_key: format!("gpu/sm{arch}/{sm_count}sm"), name: "gpu".into(), arch, sm_count },
        source: format!("{name}.cu"),
        cubins: BTreeMap::from([(cubin.to_string(), format!("{name}.{cubin}.cubin"))]),
        entry: name.into(),
        launch: Launch { grid: [4, 2, 1], block: [384, 1, 1], dynamic_smem_bytes: 100_000, cluster: [2, 1, 1] },
        workspace_bytes: 64,
        params: vec![
            Param::TensorMap(MapRecipe::tiled(Operand::A, DType::F16, [1024, 512], 2048, [64, 128])),
            Param::Pointer { operand: Operand::B },
            Param::Pointer { operand: Operand::C },
            Param::Pointer { operand: Operand::D },
            Param::Pointer { operand: Operand::Workspace },
        ],
        elements: BTreeMap::from([("a".into(), 1 << 20), ("d".into(), 1 << 20)]),
        time_us,
        vendor_us: Some(time_us * 1.1),
        vendor_kind: "cublasGemmEx".into(),
        winner: String::new(),
        provenance: Provenance { record_id: 7, samples_us: vec![time_us], batch: 50, ..Provenance::default() },
    }
}

fn manifest(kernels: Vec<Entry>) -> Manifest {
    Manifest {
        format: FORMAT,
        generator: "test".into(),
        created_ms: 1,
        nvrtc_version: "13.0".into(),
        nvrtc_flags: vec!["-std=c++17".into()],
        kernels,
    }
}

#[test]
fn a_manifest_round_trips_and_bad_ones_are_named() {
    let m = manifest(vec![entry("k1", matmul(1024, 1024, 1024, Layout::Nn), 90, 132, 10.0)]);
    let text = serde_json::to_string_pretty(&m).unwrap();
    assert_eq!(Manifest::parse(&text).unwrap(), m);
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(json["kernels"][0]["params"][0]["kind"], "tensor_map");
    assert_eq!(json["kernels"][0]["params"][0]["swizzle"], "128b");
    assert_eq!(json["kernels"][0]["problem"]["op"], "matmul");

    let e = Manifest::parse(&text.replacen("\"format\": 1", "\"format\": 2", 1)).unwrap_err();
    assert!(e.contains("format 2 is not supported"), "{e}");
    let mut bad = m.clone();
    bad.kernels[0].launch.grid = [3, 2, 1];
    let e = Manifest::parse(&serde_json::to_string(&bad).unwrap()).unwrap_err();
    assert!(e.contains("not a multiple of the cluster"), "{e}");
    let mut bad = m.clone();
    if let Param::TensorMap(r) = &mut bad.kernels[0].params[0] {
        r.swizzle = "64b".into();
    }
    let e = Manifest::parse(&serde_json::to_string(&bad).unwrap()).unwrap_err();
    assert!(e.contains("not the recipe"), "{e}");
}

#[test]
fn open_checks_the_files_the_manifest_names() {
    let dir = tempfile::tempdir().unwrap();
    let m = manifest(vec![entry("k1", matmul(64, 64, 64, Layout::Nn), 90, 132, 1.0)]);
    std::fs::write(dir.path().join("manifest.json"), serde_json::to_string(&m).unwrap()).unwrap();
    std::fs::write(dir.path().join("k1.cu"), "// source").unwrap();
    let e = Bundle::open(dir.path()).unwrap_err().to_string();
    assert!(e.contains("k1.sm_90a.cubin") && e.contains("not in the bundle"), "{e}");
    std::fs::write(dir.path().join("k1.sm_90a.cubin"), b"\x7fELF").unwrap();
    let b = Bundle::open(dir.path()).unwrap();
    assert_eq!(b.manifest, m);
}

#[test]
fn the_index_carries_every_launch_fact() {
    let m = manifest(vec![entry("k1", matmul(1024, 512, 256, Layout::Tn), 90, 132, 10.5)]);
    let text = Bundle::index_text(&m);
    let want = "tensortune-bundle-index 1\nkernel k1\nop matmul\nshape 1024 512 256\nlayout tn\nepilogue 1.0 0.0\n\
                types f16 f32 f32\ndevice 90 132\ncubin sm_90a k1.sm_90a.cubin\nentry k1\ngrid 4 2 1\nblock 384 1 1\n\
                smem 100000\ncluster 2 1 1\nworkspace 64\nparam map a f16 1024 512 2048 64 128\nparam ptr b\n\
                param ptr c\nparam ptr d\nparam ptr workspace\ntime_us 10.5\nvendor_us 11.55\nvendor_kind cublasGemmEx\nend\n";
    assert_eq!(text, want);
}

#[test]
fn selection_is_exact_first_then_the_nearest_shape_of_the_same_kind() {
    let m = manifest(vec![
        entry("big", matmul(4096, 4096, 4096, Layout::Nn), 90, 132, 500.0),
        entry("mid", matmul(1024, 1024, 1024, Layout::Nn), 90, 132, 20.0),
        entry("mid_tn", matmul(1000, 1000, 1000, Layout::Tn), 90, 132, 20.0),
        entry("mid_a100", matmul(1000, 1000, 1000, Layout::Nn), 80, 108, 30.0),
        entry("mid_h100", matmul(1024, 1024, 1024, Layout::Nn), 90, 114, 25.0),
    ]);
    // Exact, on the class with the same SM count.
    let s = select(&m, &matmul(1024, 1024, 1024, Layout::Nn), 90, 132).unwrap();
    assert_eq!((s.entry.name.as_str(), s.nearest, s.same_sm_count), ("mid", false, true));
    // The same shape tuned on a part with other SM count, when that is what this GPU has.
    let s = select(&m, &matmul(1024, 1024, 1024, Layout::Nn), 90, 114).unwrap();
    assert_eq!((s.entry.name.as_str(), s.same_sm_count), ("mid_h100", true));
    let s = select(&m, &matmul(1024, 1024, 1024, Layout::Nn), 90, 100).unwrap();
    assert_eq!((s.entry.name.as_str(), s.nearest, s.same_sm_count), ("mid", false, false));
    // Nearest: 1000^3 nn on sm_90 is not in the bundle (mid_tn is another layout, mid_a100 another arch).
    let s = select(&m, &matmul(1000, 1000, 1000, Layout::Nn), 90, 132).unwrap();
    assert_eq!((s.entry.name.as_str(), s.nearest), ("mid", true));
    assert!((s.distance - 3.0 * 1.024f64.ln()).abs() < 1e-12);
    let s = select(&m, &matmul(3000, 5000, 4096, Layout::Nn), 90, 132).unwrap();
    assert_eq!((s.entry.name.as_str(), s.nearest), ("big", true));
    // On sm_80 only the A100 entry runs.
    let s = select(&m, &matmul(1024, 1024, 1024, Layout::Nn), 80, 108).unwrap();
    assert_eq!((s.entry.name.as_str(), s.nearest), ("mid_a100", true));
    // Nothing comparable: another layout with no entry, other types, another arch.
    assert!(select(&m, &matmul(1024, 1024, 1024, Layout::Tt), 90, 132).is_none());
    let Problem::Matmul { m: mm, n, k, layout, alpha, beta, .. } = matmul(64, 64, 64, Layout::Nn) else {
        unreachable!()
    };
    let bf16 = Problem::Matmul {
        m: mm,
        n,
        k,
        layout,
        input: DType::Bf16,
        accumulator: DType::F32,
        output: DType::F32,
        alpha,
        beta,
        epilogue: Default::default(),
    };
    assert!(select(&m, &bf16, 90, 132).is_none());
    assert!(select(&m, &matmul(1024, 1024, 1024, Layout::Nn), 100, 148).is_none());
    // Another epilogue of the same shape is the nearest, not exact.
    let Problem::Matmul { m: mm, n, k, layout, input, accumulator, output, .. } = matmul(1024, 1024, 1024, Layout::Nn)
    else {
        unreachable!()
    };
    let scaled = Problem::Matmul {
        m: mm,
        n,
        k,
        layout,
        input,
        accumulator,
        output,
        alpha: 2.0,
        beta: 1.0,
        epilogue: Default::default(),
    };
    let s = select(&m, &scaled, 90, 132).unwrap();
    assert_eq!((s.entry.name.as_str(), s.nearest), ("mid", true));
    // A fused epilogue (a linear layer's bias) is another computation: never a plain kernel's.
    let biased = crate::ConvEpilogue { bias: true, ..Default::default() };
    let fused =
        Problem::Matmul { m: mm, n, k, layout, input, accumulator, output, alpha: 1.0, beta: 0.0, epilogue: biased };
    assert!(select(&m, &fused, 90, 132).is_none());
    let mut e = entry("biased", fused, 90, 132, 5.0);
    e.workload_key = "matmul/m1024n1024k1024/nn/f16,f32,f32/alpha=1,beta=0,epi=bias".into();
    let one = manifest(vec![e]);
    let json = serde_json::to_string(&one).unwrap();
    assert!(json.contains(r#""epilogue":{"scale":false,"bias":true"#), "{json}");
    let back: Manifest = serde_json::from_str(&json).unwrap();
    assert!(
        Bundle::index_text(&back).contains("epilogue 1.0 0.0\nmatmul_epilogue epi=bias\n"),
        "{}",
        Bundle::index_text(&back)
    );
    assert_eq!(select(&back, &fused, 90, 132).map(|s| s.nearest), Some(false));
}

/// A tf32 kernel states its problem as tf32 (its maps copy f32): it round-trips through the
/// manifest and index text, and answers tf32 problems only, never an exact-f32 one of the same
/// shape (which would get TF32's rounding).
#[test]
fn a_tf32_entry_answers_tf32_problems_only() {
    let problem = |input| Problem::Matmul {
        m: 1024,
        n: 1024,
        k: 1024,
        layout: Layout::Tn,
        input,
        accumulator: DType::F32,
        output: DType::F32,
        alpha: 1.0,
        beta: 0.0,
        epilogue: Default::default(),
    };
    let mut e = entry("tf32", problem(DType::Tf32), 90, 132, 7.8);
    e.params[0] = Param::TensorMap(MapRecipe::tiled(Operand::A, DType::F32, [1024, 1024], 4096, [32, 128]));
    let m = manifest(vec![e]);
    let json = serde_json::to_string(&m).unwrap();
    assert!(json.contains(r#""input":"tf32""#) && json.contains(r#""dtype":"f32""#), "{json}");
    let back: Manifest = serde_json::from_str(&json).unwrap();
    assert!(Bundle::index_text(&back).contains("types tf32 f32 f32"), "{}", Bundle::index_text(&back));
    assert_eq!(select(&back, &problem(DType::Tf32), 90, 132).map(|s| s.nearest), Some(false));
    assert!(select(&back, &problem(DType::F32), 90, 132).is_none(), "exact f32 never gets a tf32 kernel");
    assert_eq!(DType::Tf32.bytes(), 4);
}

#[test]
fn a_fused_conv_entry_answers_its_own_epilogue_only() {
    use crate::{Activation, ConvEpilogue};
    let problem = |epilogue| Problem::Conv2d {
        n: 32,
        h: 56,
        w: 56,
        c: 64,
        k: 256,
        r: 1,
        s: 1,
        pad: [0, 0],
        stride: [1, 1],
        dilation: [1, 1],
        input: DType::F16,
        accumulator: DType::F32,
        output: DType::F16,
        epilogue,
    };
    let block_end = ConvEpilogue { bias: true, residual: true, activation: Activation::Relu, ..Default::default() };
    let m = manifest(vec![entry("fused", problem(block_end), 90, 132, 9.0)]);
    let json = serde_json::to_string(&m).unwrap();
    assert!(json.contains(r#""epilogue":{"scale":false,"bias":true,"residual":true,"activation":"relu"}"#), "{json}");
    let back: Manifest = serde_json::from_str(&json).unwrap();
    assert!(Bundle::index_text(&back).contains("conv_epilogue beta=1,epi=bias+relu\n"));
    assert_eq!(select(&back, &problem(block_end), 90, 132).map(|s| s.nearest), Some(false));
    assert!(select(&back, &problem(ConvEpilogue::default()), 90, 132).is_none(), "a plain layer never gets it");
    // A plain conv's problem is written as before epilogues existed.
    let plain = serde_json::to_string(&problem(ConvEpilogue::default())).unwrap();
    assert!(!plain.contains("epilogue"), "{plain}");
    assert_eq!(serde_json::from_str::<Problem>(&plain).unwrap(), problem(ConvEpilogue::default()));
}

#[test]
fn the_winner_is_recorded_or_read_from_the_times() {
    let mut e = entry("k1", matmul(1024, 1024, 1024, Layout::Nn), 90, 132, 10.0);
    assert_eq!(e.winner(), "ours");
    e.vendor_us = Some(9.0);
    assert_eq!(e.winner(), "vendor");
    assert_eq!(Entry::winner_of(10.0, None), "ours");
    assert_eq!(Entry::winner_of(10.0, Some(10.0)), "vendor");
    e.winner = "ours".into();
    let text = serde_json::to_string(&manifest(vec![e])).unwrap();
    assert!(text.contains("\"winner\":\"ours\""));
    assert_eq!(Manifest::parse(&text).unwrap().kernels[0].winner(), "ours");
}
