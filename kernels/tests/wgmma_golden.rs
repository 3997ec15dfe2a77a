//! Golden sources of `wgmma_gemm` v20 for a few configs (one per kind of code path: a producer
//! warpgroup with cooperative consumers on a persistent grid, ping-pong consumers in 2-block
//! clusters with MN-major operands, an inline producer on i8 with a C epilogue, and stream-K in
//! 2-block clusters on a ragged shape, the TMA-store epilogue with C, the 160-column tile of two
//! row tiles per consumer on a K-major A, Y resident in a one-column grid, a deep K split over an
//! 8-block cluster, a K split of pairs that share A by multicast (a 4-block cluster), stream-K of
//! whole shares (two clusters a tile), a tile walk along M first in 2-block clusters; the i8
//! case's 64 tiles split in two; FP8 e4m3 with tensor scales, bias and GELU; a ragged bf16 GEMM with
//! every epilogue part and C; the swapped view of decode steps, N = 16 tokens on wgmma's n side,
//! with a K split in a cluster and the exact GELU, and with stream-K; a 192x192 tile over three
//! consumers in 2-block clusters), so a diff shows what a generator change did. A change here
//! that alters code must bump the version and be re-verified on a GPU.
//!
//! After an intended change: `TT_UPDATE_GOLDEN=1 cargo test -p tensortune-kernels --test wgmma_golden`
//! rewrites the files; review the diff. The same directory holds the machine code of the
//! single-block kernels (`single_block_text.txt`, checked and rewritten by the worker's
//! `wgmma_compile` test, which has NVRTC): a change meant for clusters alone must leave it as it is.

use std::path::PathBuf;

use tensortune_kernels::wgmma::WgmmaGemm;
use tensortune_kernels::{Config, Target, Template, Workload};

const CASES: [(&str, &str, &str); 16] = [
    (
        "f16_nn_4096_cooperative_persistent",
        "matmul/m4096n4096k4096/nn/f16,f32,f32/alpha=1,beta=0",
        r#"{"block_m":256,"block_n":128,"cluster":1,"consumers":2,"persistent":1,"producer":"warpgroup","raster_group":8,"schedule":"cooperative","stages":4,"stream_k":0,"epilogue":"direct"}"#,
    ),
    (
        "bf16_nt_2048x5120x5120_pingpong_cluster2",
        "matmul/m2048n5120k5120/nt/bf16,f32,bf16/alpha=1,beta=0",
        r#"{"block_m":128,"block_n":128,"cluster":2,"consumers":2,"persistent":1,"producer":"warpgroup","raster_group":4,"schedule":"pingpong","stages":5,"stream_k":0,"epilogue":"direct"}"#,
    ),
    (
        "i8_tn_1000_inline_beta",
        "matmul/m1000n1000k1024/tn/i8,i32,i32/alpha=2,beta=-1",
        r#"{"block_m":128,"block_n":128,"cluster":1,"consumers":1,"persistent":0,"producer":"inline","raster_group":1,"schedule":"cooperative","stages":4,"stream_k":0,"epilogue":"direct"}"#,
    ),
    (
        "f16_nn_3000_stream_k_cluster2",
        "matmul/m3000n3000k4096/nn/f16,f32,f32/alpha=1,beta=0",
        r#"{"block_m":256,"block_n":128,"cluster":2,"consumers":2,"persistent":1,"producer":"warpgroup","raster_group":1,"schedule":"cooperative","stages":4,"stream_k":1,"epilogue":"direct"}"#,
    ),
    (
        "f16out_nn_1000_tma_store_beta",
        "matmul/m1000n1000k1024/nn/f16,f32,f16/alpha=1,beta=0.5",
        r#"{"block_m":128,"block_n":128,"cluster":1,"consumers":2,"persistent":0,"producer":"warpgroup","raster_group":1,"schedule":"pingpong","stages":4,"stream_k":0,"epilogue":"tma"}"#,
    ),
    (
        "f16_tn_8192_160x256_two_row_tiles",
        "matmul/m8192n8192k8192/tn/f16,f32,f32/alpha=1,beta=0",
        r#"{"block_m":160,"block_n":256,"cluster":1,"consumers":2,"persistent":1,"producer":"warpgroup","raster_group":8,"schedule":"cooperative","stages":4,"stream_k":0,"epilogue":"direct"}"#,
    ),
    (
        "f16_tn_128x65536x512_resident_y",
        "matmul/m128n65536k512/tn/f16,f32,f16/alpha=1,beta=0",
        r#"{"block_m":128,"block_n":128,"cluster":1,"consumers":2,"persistent":1,"producer":"warpgroup","raster_group":1,"schedule":"cooperative","stages":4,"stream_k":0,"epilogue":"tma"}"#,
    ),
    (
        "f16_nn_512x384x8192_k_split_8",
        "matmul/m512n384k8192/nn/f16,f32,f32/alpha=1,beta=0",
        r#"{"block_m":128,"block_n":128,"cluster":1,"consumers":2,"persistent":0,"producer":"warpgroup","raster_group":1,"schedule":"cooperative","stages":4,"stream_k":0,"epilogue":"direct"}"#,
    ),
    (
        "f16_nn_512x1024x16384_k_split_cluster2",
        "matmul/m512n1024k16384/nn/f16,f32,f32/alpha=1,beta=0",
        r#"{"block_m":128,"block_n":64,"cluster":2,"consumers":1,"persistent":0,"producer":"warpgroup","raster_group":1,"schedule":"cooperative","stages":6,"stream_k":0,"epilogue":"direct"}"#,
    ),
    (
        "f16_nn_512x1024x16384_stream_k_whole_shares",
        "matmul/m512n1024k16384/nn/f16,f32,f32/alpha=1,beta=0",
        r#"{"block_m":128,"block_n":64,"cluster":1,"consumers":1,"persistent":1,"producer":"warpgroup","raster_group":1,"schedule":"cooperative","stages":6,"stream_k":1,"epilogue":"direct"}"#,
    ),
    (
        "f16_nn_4096x14336_raster_m_cluster2",
        "matmul/m4096n14336k4096/nn/f16,f32,f32/alpha=1,beta=0",
        r#"{"block_m":256,"block_n":128,"cluster":2,"consumers":2,"persistent":1,"producer":"warpgroup","raster":"m","raster_group":4,"schedule":"cooperative","stages":4,"stream_k":0,"epilogue":"tma"}"#,
    ),
    (
        "e4m3_tn_4096_tensor_scale_bias_gelu",
        "matmul/m4096n4096k4096/tn/e4m3,f32,bf16/alpha=1,beta=0,scale=tensor,epi=bias+gelu",
        r#"{"block_m":256,"block_n":128,"cluster":2,"consumers":2,"persistent":1,"producer":"warpgroup","raster_group":8,"schedule":"cooperative","stages":4,"stream_k":0,"epilogue":"tma"}"#,
    ),
    (
        "bf16_tn_1000_scale_bias_relu_beta",
        "matmul/m1000n1000k1024/tn/bf16,f32,bf16/alpha=1,beta=1,epi=scale+bias+relu",
        r#"{"block_m":128,"block_n":128,"cluster":1,"consumers":2,"persistent":0,"producer":"warpgroup","raster_group":1,"schedule":"cooperative","stages":4,"stream_k":0,"epilogue":"direct"}"#,
    ),
    (
        "e4m3_tn_4096x16x4096_swap_k_split_bias_gelu_erf_beta",
        "matmul/m4096n16k4096/tn/e4m3,f32,bf16/alpha=1,beta=1,scale=tensor,epi=bias+gelu_erf",
        r#"{"block_m":128,"block_n":16,"cluster":1,"consumers":1,"persistent":0,"producer":"inline","raster_group":1,"schedule":"cooperative","stages":6,"stream_k":0,"epilogue":"direct"}"#,
    ),
    (
        "bf16_tn_14336x16x4096_swap_stream_k_bias_gelu",
        "matmul/m14336n16k4096/tn/bf16,f32,bf16/alpha=1,beta=0,epi=bias+gelu",
        r#"{"block_m":128,"block_n":16,"cluster":1,"consumers":1,"persistent":1,"producer":"warpgroup","raster_group":1,"schedule":"cooperative","stages":6,"stream_k":1,"epilogue":"direct"}"#,
    ),
    (
        "f16_nn_3000_three_consumers_192x192_cluster2",
        "matmul/m3000n3000k4096/nn/f16,f32,f32/alpha=1,beta=0",
        r#"{"block_m":192,"block_n":192,"cluster":2,"consumers":3,"persistent":0,"producer":"warpgroup","raster_group":1,"schedule":"cooperative","stages":4,"stream_k":0,"epilogue":"direct"}"#,
    ),
];

#[test]
fn wgmma_gemm_v20_sources_match_their_golden_files() {
    assert_eq!(WgmmaGemm.version(), 20, "a new version gets new golden files (and a GPU check)");
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/wgmma_gemm_v20");
    let update = std::env::var_os("TT_UPDATE_GOLDEN").is_some();
    let mut differing = Vec::new();
    for (name, key, config) in CASES {
        let w = Workload::from_key(key).unwrap();
        let spec = WgmmaGemm.generate(&w, &Config::from_json(config).unwrap(), &Target::sm90()).unwrap();
        let path = dir.join(format!("{name}.cu"));
        if update {
            std::fs::write(&path, &spec.source).unwrap();
            continue;
        }
        let golden = std::fs::read_to_string(&path).unwrap_or_default();
        if golden != spec.source {
            let line = golden.lines().zip(spec.source.lines()).position(|(a, b)| a != b);
            differing.push(format!("{name}: first differing line {line:?}"));
        }
    }
    assert!(differing.is_empty(), "generated sources differ from the golden files:\n{}", differing.join("\n"));
}
