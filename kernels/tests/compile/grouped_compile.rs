//! Batched and grouped matmul on `wgmma_gemm` (issue 36): NVRTC compiles a few kernels of each
//! new path for sm_90a without spills, and their support modules (the reference walks every
//! problem) for sm_90, on the CPU.

use tensortune_kernels::wgmma::WgmmaGemm;
use tensortune_kernels::{Config, Target, Template, Workload, support};
use tensortune_nvrtc as nvrtc;

use crate::common::{self, assert_all_compile_without_spills};

/// BERT-base's attention products (b8 s384, 12 heads: Q.K^T in tn, P.V in nn, as the Python
/// capture spells them) and MoE grouped GEMMs: ragged groups in tn, and B N-contiguous (nt).
pub(crate) const KEYS: [&str; 4] = [
    "matmul/b96m384n384k64/tn/f16,f32,f16/alpha=1,beta=0",
    "matmul/b96m64n384k384/nn/f16,f32,f16/alpha=1,beta=0",
    "matmul/m100+300+64+1000n512k256/tn/bf16,f32,bf16/alpha=1,beta=0",
    "matmul/m128+256+512n1024k512/nt/bf16,f32,bf16/alpha=1,beta=1",
];

/// The knobs every case shares, then each case's: one block per tile and persistent, a cluster of
/// 2 (Y multicast within one problem), ping-pong, the inline producer, the tile walk along M, the
/// TMA-store epilogue (through one map of every problem's D).
const COMMON: &str = r#""raster_group":1,"stages":4,"stream_k":0"#;
const CASES: [(usize, &str); 8] = [
    (
        0,
        r#""block_m":128,"block_n":128,"cluster":1,"consumers":2,"persistent":0,"producer":"warpgroup","schedule":"cooperative","epilogue":"tma""#,
    ),
    (
        0,
        r#""block_m":128,"block_n":128,"cluster":2,"consumers":2,"persistent":1,"producer":"warpgroup","schedule":"pingpong","epilogue":"direct""#,
    ),
    (
        1,
        r#""block_m":64,"block_n":64,"cluster":1,"consumers":1,"persistent":0,"producer":"warpgroup","schedule":"cooperative","epilogue":"direct""#,
    ),
    (
        1,
        r#""block_m":64,"block_n":128,"cluster":2,"consumers":2,"persistent":1,"producer":"inline","schedule":"cooperative","epilogue":"direct""#,
    ),
    (
        2,
        r#""block_m":64,"block_n":128,"cluster":1,"consumers":1,"persistent":0,"producer":"inline","schedule":"cooperative","raster":"m","epilogue":"direct""#,
    ),
    (
        2,
        r#""block_m":128,"block_n":128,"cluster":1,"consumers":2,"persistent":0,"producer":"warpgroup","schedule":"cooperative","epilogue":"direct""#,
    ),
    (
        3,
        r#""block_m":128,"block_n":128,"cluster":2,"consumers":2,"persistent":0,"producer":"warpgroup","schedule":"pingpong","epilogue":"tma""#,
    ),
    (
        3,
        r#""block_m":64,"block_n":64,"cluster":1,"consumers":1,"persistent":0,"producer":"warpgroup","schedule":"cooperative","epilogue":"direct""#,
    ),
];

#[test]
fn batched_and_grouped_kernels_compile_for_sm90a_without_spills() {
    let target = Target::sm90();
    let mut specs = Vec::new();
    for (i, knobs) in CASES {
        let w = Workload::from_key(KEYS[i]).unwrap();
        let c: Config = serde_json::from_str(&format!("{{{knobs},{COMMON}}}")).unwrap();
        match WgmmaGemm.generate(&w, &c, &target) {
            Ok(spec) => specs.push(spec),
            Err(e) => panic!("{} {knobs}: {e}", KEYS[i]),
        }
    }
    assert!(specs.iter().any(|s| s.source.contains("constexpr int BATCH = 96;")));
    assert_eq!(specs.iter().filter(|s| s.source.contains("constexpr bool TMA_STORE = true;")).count(), 2);
    assert!(specs.iter().any(|s| s.source.contains("constexpr int GROUP_COLS[] = {0, 1, 4, 5, 13};")));
    assert_all_compile_without_spills(&specs, &target);
}

#[test]
fn support_modules_of_batched_and_grouped_workloads_compile() {
    let inc = common::include_dir();
    for key in [KEYS[0], KEYS[2]] {
        let source = support::source(&Workload::from_key(key).unwrap());
        if let Err(e) = nvrtc::compile(&source, "support", "sm_90", &inc) {
            panic!("{key}: {e}");
        }
    }
}
