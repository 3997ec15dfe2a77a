//! FP8 inputs and fused epilogues on `wgmma_gemm` (issue 36): NVRTC compiles a few kernels of
//! each new path for sm_90a without spills, and their support modules (reference and unfused
//! epilogue) for sm_90, on the CPU (the worker's `gpu_selftest` runs them on a GPU, every output element
//! checked).

use tensortune_kernels::template::valid_configs;
use tensortune_kernels::wgmma::WgmmaGemm;
use tensortune_kernels::{KernelSpec, Target, Template, Workload, support};
use tensortune_nvrtc as nvrtc;

use crate::common::{self, assert_all_compile_without_spills, wgmma_kind};

/// The workloads of every new path (`tests/data/fused-keys.txt`, which the worker's GPU test runs
/// too), in the file's order.
pub(crate) fn keys() -> Vec<&'static str> {
    include_str!("../data/fused-keys.txt").lines().filter(|l| !l.is_empty() && !l.starts_with('#')).collect()
}

/// One config of each of a few kinds (the middle of the kind's configs), `per` a workload.
fn some_configs(w: &Workload, target: &Target, per: usize) -> Vec<KernelSpec> {
    let valid = valid_configs(&WgmmaGemm, w, target).unwrap_or_else(|e| panic!("{}: {e}", w.key()));
    let mut kinds: std::collections::BTreeMap<String, Vec<_>> = Default::default();
    for (_, c) in &valid {
        kinds.entry(wgmma_kind(c)).or_default().push(c);
    }
    let step = (kinds.len() / per).max(1);
    kinds
        .values()
        .step_by(step)
        .take(per)
        .map(|group| WgmmaGemm.generate(w, group[group.len() / 2], target).unwrap())
        .collect()
}

#[test]
fn fp8_and_fused_epilogue_kernels_compile_for_sm90a_without_spills() {
    let target = Target::sm90();
    let keys = keys();
    let mut specs = Vec::new();
    for key in &keys {
        let w = Workload::from_key(key).unwrap();
        specs.extend(some_configs(&w, &target, 1));
    }
    assert_eq!(specs.len(), keys.len(), "one kernel a key");
    // The new paths are really there: FP8 wgmma, the epilogue's parameters and constants.
    assert!(specs.iter().any(|s| s.source.contains("k32.f32.e4m3.e4m3")));
    assert!(specs.iter().any(|s| s.source.contains("k32.f32.e5m2.e5m2")));
    assert!(specs.iter().any(|s| s.source.contains("constexpr int EPI_ACT = 2;")));
    assert!(specs.iter().any(|s| s.source.contains("const float* __restrict__ rscale_v")));
    assert_all_compile_without_spills(&specs, &target);
}

#[test]
fn support_modules_of_fp8_and_fused_workloads_compile() {
    let inc = common::include_dir();
    let keys = keys();
    for key in [keys[1], keys[3], keys[6]] {
        let w = Workload::from_key(key).unwrap();
        let source = support::source(&w);
        if let Err(e) = nvrtc::compile(&source, "support", "sm_90", &inc) {
            panic!("{key}: {e}");
        }
    }
}

/// C read 16 bytes a thread (v17, `C_VECTORS`, issue 36's block ends): ResNet-50's 28x28 128->512
/// block end under the TMA store with an inline producer at one block an SM (C staged in the
/// store's buffers; with a producer warpgroup, v18 loads C by TMA instead, tested below), and
/// a residual matmul whose K split stores from registers (C read in rows of 8 and moved to the
/// pair layout by the quad's shuffles). Two kernels: the other paths (groups, batches, f32 and i32
/// C under the TMA store) compile in the samples above and in `grouped_compile`. (v17's winner of
/// that layer, an inline producer at 2 blocks an SM with the TMA store, spills 12 bytes.)
#[test]
fn residuals_read_16_bytes_a_thread_and_compile_without_spills() {
    use tensortune_kernels::Config;
    use tensortune_kernels::wgmma::conv::WgmmaConv2d;
    let target = Target::sm90();
    let knobs = r#""cluster":1,"consumers":2,"producer":"warpgroup","stream_k":0"#;
    let cases: [(&dyn Template, &str, String); 2] = [
        (
            &WgmmaConv2d,
            "conv2d/n32h28w28c128/k512r1s1/pad0x0,stride1x1,dil1x1/nhwc/f16,f32,f16/beta=1,epi=bias+relu",
            format!(
                r#"{{"block_m":128,"block_n":128,"persistent":1,"raster_group":4,"schedule":"cooperative","stages":4,"epilogue":"tma",{knobs}}}"#
            )
            .replace("warpgroup", "inline"),
        ),
        (
            &WgmmaGemm,
            "matmul/m512n384k8192/nn/f16,f32,f16/alpha=1,beta=1",
            format!(
                r#"{{"block_m":128,"block_n":128,"persistent":0,"raster_group":1,"schedule":"cooperative","stages":4,"epilogue":"direct",{knobs}}}"#
            ),
        ),
    ];
    let mut specs = Vec::new();
    for (t, key, config) in &cases {
        let spec = t.generate(&Workload::from_key(key).unwrap(), &Config::from_json(config).unwrap(), &target).unwrap();
        assert!(
            common::header_flag(&spec.source, "READ_C") && common::header_flag(&spec.source, "VEC_ALIGNED"),
            "{key}"
        );
        specs.push(spec);
    }
    assert!(common::header_flag(&specs[0].source, "TMA_STORE") && common::header_int(&specs[0].source, "C_SLOTS") == 0);
    assert!(common::header_int(&specs[1].source, "SPLIT") > 1, "the matmul splits K");
    assert_all_compile_without_spills(&specs, &target);
}

/// C by TMA (v18, `C_SLOTS` > 0: the TMA store with C and a producer warpgroup): every kind of
/// kernel that takes it compiles without spills, its producer's C loaders in the producer's 40
/// registers among them. ResNet-50's 28x28 128->512 block end (N=32) under ping-pong with 2 and 4
/// stages and cooperative consumers, a stride-2 block end (im2col activations), and matmuls with
/// f32 and i32 C, a batch, stream-K in 2-block clusters and a cluster's padding tile on a ragged N.
#[test]
fn residuals_loaded_by_tma_compile_without_spills() {
    use tensortune_kernels::Config;
    use tensortune_kernels::wgmma::conv::WgmmaConv2d;
    let target = Target::sm90();
    let cfg = |extra: &str| {
        let base = r#""block_m":128,"block_n":128,"cluster":1,"consumers":2,"producer":"warpgroup","stream_k":0,"raster_group":1,"epilogue":"tma""#;
        let mut m: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&format!("{{{base}}}")).unwrap();
        let e: serde_json::Map<String, serde_json::Value> = serde_json::from_str(extra).unwrap();
        m.extend(e);
        Config::from_json(&serde_json::Value::Object(m).to_string()).unwrap()
    };
    let res28 = "conv2d/n32h28w28c128/k512r1s1/pad0x0,stride1x1,dil1x1/nhwc/f16,f32,f16/beta=1,epi=bias+relu";
    let res_s2 = "conv2d/n32h28w28c512/k1024r1s1/pad0x0,stride2x2,dil1x1/nhwc/f16,f32,f16/beta=1,epi=bias+relu";
    let cases: [(&dyn Template, &str, &str); 9] = [
        (&WgmmaConv2d, res28, r#"{"persistent":1,"schedule":"pingpong","stages":2}"#),
        (&WgmmaConv2d, res28, r#"{"persistent":1,"schedule":"pingpong","stages":4}"#),
        (&WgmmaConv2d, res28, r#"{"persistent":1,"schedule":"cooperative","stages":3}"#),
        (&WgmmaConv2d, res_s2, r#"{"persistent":1,"schedule":"pingpong","stages":4}"#),
        (
            &WgmmaGemm,
            "matmul/m1024n1000k1024/nn/f16,f32,f32/alpha=1,beta=0.5",
            r#"{"persistent":0,"schedule":"pingpong","stages":4}"#,
        ),
        (
            &WgmmaGemm,
            "matmul/m1024n1000k1024/tn/i8,i32,i32/alpha=2,beta=-1",
            r#"{"persistent":0,"schedule":"cooperative","stages":4}"#,
        ),
        (
            &WgmmaGemm,
            "matmul/b4m384n384k64/tn/f16,f32,f16/alpha=1,beta=1",
            r#"{"persistent":0,"schedule":"cooperative","stages":4}"#,
        ),
        (
            &WgmmaGemm,
            "matmul/m3000n3000k4096/tn/bf16,f32,bf16/alpha=1,beta=0.5",
            r#"{"block_m":256,"cluster":2,"stream_k":1,"persistent":1,"schedule":"cooperative","stages":3}"#,
        ),
        (
            &WgmmaGemm,
            "matmul/m1000n800k512/nn/f16,f32,f16/alpha=1,beta=1,epi=bias+relu",
            r#"{"cluster":2,"persistent":0,"schedule":"pingpong","stages":4}"#,
        ),
    ];
    let specs: Vec<KernelSpec> = cases
        .iter()
        .map(|(t, key, extra)| {
            let spec = t.generate(&Workload::from_key(key).unwrap(), &cfg(extra), &target).unwrap();
            assert!(common::header_int(&spec.source, "C_SLOTS") >= 2, "{key} {extra}: C by TMA");
            spec
        })
        .collect();
    assert_all_compile_without_spills(&specs, &target);
}
