use super::*;
use crate::workload::{Layout, Types};

fn mm(m: u64, n: u64, k: u64, layout: Layout, input: DType) -> Workload {
    Workload::Matmul(Matmul::new(m, n, k, layout, Types::default_for(input).unwrap()).unwrap())
}

fn config(json: &str) -> Config {
    Config::from_json(json).unwrap()
}

const BIG: &str = r#"{"block_m":256,"block_n":128,"consumers":2,"stages":4,"cluster":2,"persistent":1,"raster_group":8,"producer":"warpgroup","schedule":"cooperative"}"#;

#[test]
fn rejects_what_it_cannot_run_naming_the_field() {
    let t = &WgmmaGemm;
    let sm80 = Target::sm80();
    let err = t.supports(&mm(1024, 1024, 1024, Layout::Nn, DType::F16), &sm80).unwrap_err().to_string();
    assert!(err.contains("template") && err.contains("sm_80"), "{err}");
    let err = t.supports(&mm(1024, 1024, 1024, Layout::Nn, DType::I8), &Target::sm90()).unwrap_err().to_string();
    assert!(err.contains("layout") && err.contains("tn"), "{err}");
    // A M-contiguous (nn): M's rows must be whole 16-byte units for TMA.
    let err = t.supports(&mm(1001, 1024, 1024, Layout::Nn, DType::F16), &Target::sm90()).unwrap_err().to_string();
    assert!(err.contains("invalid m") && err.contains("multiple of 8"), "{err}");
    // The same M is fine when A is K-major (tn): only K rows are loaded by TMA.
    t.supports(&mm(1001, 1024, 1024, Layout::Tn, DType::F16), &Target::sm90()).unwrap();
    t.supports(&mm(4096, 4096, 4096, Layout::Tn, DType::I8), &Target::sm90()).unwrap();
}

#[test]
fn validity_rules_give_reasons() {
    let t = &WgmmaGemm;
    let w = mm(4096, 4096, 4096, Layout::Nn, DType::F16);
    let sm90 = Target::sm90();
    let res = t.check(&w, &config(BIG), &sm90).unwrap();
    assert_eq!(res.threads, 384);
    assert_eq!(res.blocks, 132);
    let reason = |json: &str| t.check(&w, &config(json), &sm90).unwrap_err().to_string();
    let r = reason(&BIG.replace(r#""stages":4"#, r#""stages":6"#));
    assert!(r.contains("shared memory") && r.contains("227 KiB"), "{r}");
    let r = reason(&BIG.replace(r#""consumers":2"#, r#""consumers":1"#));
    assert!(r.contains("accumulator registers"), "{r}");
    let r = reason(&BIG.replace(r#""block_n":128"#, r#""block_n":64"#));
    assert!(r.contains("64-row wgmma tiles"), "{r}");
    let small = mm(256, 128, 4096, Layout::Nn, DType::F16);
    let r = t.check(&small, &config(BIG), &sm90).unwrap_err().to_string();
    assert!(r.contains("persistent") || r.contains("cluster") || r.contains("raster_group"), "{r}");
}

#[test]
fn every_valid_config_generates_and_the_space_is_not_empty() {
    let sm90 = Target::sm90();
    for (w, min) in [
        (mm(4096, 4096, 4096, Layout::Nn, DType::F16), 300),
        (mm(3000, 3000, 4096, Layout::Nn, DType::F16), 300),
        (mm(4096, 4096, 4096, Layout::Tn, DType::I8), 100),
        (mm(256, 8192, 8192, Layout::Tn, DType::F16), 50),
        (mm(1024, 1024, 1024, Layout::Tt, DType::Bf16), 50),
    ] {
        let valid = WgmmaGemm.valid_indices(&w, &sm90).unwrap();
        assert!(valid.len() >= min, "{}: {} valid configs", w.key(), valid.len());
        let space = WgmmaGemm.space();
        for i in valid.iter().step_by(37) {
            let c = space.config(*i).unwrap();
            let spec = WgmmaGemm.generate(&w, &c, &sm90).unwrap();
            assert!(spec.source.contains("wgmma.mma_async") && spec.grid[0] >= 1, "{}", spec.name);
            assert!(spec.smem_bytes <= sm90.max_smem_per_block);
            assert!(matches!(spec.args[0], Arg::Map(_)) && matches!(spec.args[1], Arg::Map(_)));
        }
    }
}

#[test]
fn tensor_maps_follow_the_layout() {
    let sm90 = Target::sm90();
    // nn: B (X) is K-major, A (Y) is M-contiguous.
    let w = mm(4096, 2048, 1024, Layout::Nn, DType::F16);
    let spec =
        WgmmaGemm.generate(&w, &config(&BIG.replace(r#""raster_group":8"#, r#""raster_group":4"#)), &sm90).unwrap();
    let (Arg::Map(x), Arg::Map(y)) = (spec.args[0], spec.args[1]) else { panic!("maps first") };
    assert_eq!((x.operand, x.dims, x.row_bytes, x.box_dims), (TensorOperand::B, [1024, 2048], 2048, [64, 128]));
    assert_eq!((y.operand, y.dims, y.row_bytes, y.box_dims), (TensorOperand::A, [4096, 1024], 8192, [64, 64]));
    assert!(spec.source.contains("__cluster_dims__(2, 1, 1)"));
    assert!(spec.source.contains("m64n256k16.f32.f16.f16") && spec.source.contains("p, 1, 1, 0, 1"));
    // tn with i8: both K-major, 128 K elements per 128-byte row, the integer instruction.
    let w = mm(4096, 4096, 4096, Layout::Tn, DType::I8);
    let spec = WgmmaGemm.generate(&w, &config(BIG), &sm90).unwrap();
    let Arg::Map(y) = spec.args[1] else { panic!() };
    assert_eq!((y.dims, y.box_dims), ([4096, 4096], [128, 128]));
    assert!(spec.source.contains("m64n256k32.s32.s8.s8"));
}

#[test]
fn the_tile_walk_covers_every_output_tile_exactly_once() {
    let sm90 = Target::sm90();
    let mut checked = 0;
    for (m, n, k, layout) in [
        (4096, 4096, 4096, Layout::Nn),
        (3000, 3000, 4096, Layout::Nn),
        (256, 8192, 8192, Layout::Tn),
        (1000, 1000, 1024, Layout::Tn),
        (2048, 5120, 5120, Layout::Nt),
        (4096, 14336, 4096, Layout::Nn),
    ] {
        let w = Matmul::new(m, n, k, layout, Types::default_for(DType::F16).unwrap()).unwrap();
        let valid = WgmmaGemm.valid_indices(&Workload::Matmul(w), &sm90).unwrap();
        for i in valid.iter().step_by(11) {
            let p = Plan::at(&w, *i);
            let (tiles_p, tiles_q) = (n.div_ceil(p.bp as u64), m.div_ceil(p.bq as u64));
            let mut seen = vec![0u32; (tiles_p.next_multiple_of(p.cluster as u64) * tiles_q) as usize];
            for b in 0..p.blocks(&sm90) {
                let tiles = p.block_tiles(&sm90, b);
                assert!(
                    p.persistent || tiles.len() == 1,
                    "{}: a non-persistent block walks {} tiles",
                    p.name(),
                    tiles.len()
                );
                for (tp, tq) in tiles {
                    assert!(
                        tq < tiles_q && tp < tiles_p.next_multiple_of(p.cluster as u64),
                        "{}: tile ({tp}, {tq})",
                        p.name()
                    );
                    seen[(tp * tiles_q + tq) as usize] += 1;
                }
            }
            for tp in 0..tiles_p {
                for tq in 0..tiles_q {
                    assert_eq!(seen[(tp * tiles_q + tq) as usize], 1, "{}: tile ({tp}, {tq})", p.name());
                }
            }
            checked += 1;
        }
    }
    assert!(checked > 300, "checked {checked} configs");
}

#[test]
fn a_producer_warpgroup_keeps_one_block_per_sm() {
    // setmaxnreg moves registers inside one block's allocation; two blocks per SM hung on an H200.
    let sm90 = Target::sm90();
    let w = Matmul::new(4096, 4096, 4096, Layout::Nn, Types::default_for(DType::F16).unwrap()).unwrap();
    let small = r#"{"block_m":64,"block_n":64,"consumers":1,"stages":2,"cluster":1,"persistent":1,"raster_group":1,"producer":"warpgroup","schedule":"cooperative"}"#;
    let p = Plan::new(&w, &config(small)).unwrap();
    assert_eq!(p.blocks(&sm90), 132);
    assert!(p.source(&sm90).contains("constexpr int BLOCKS_PER_SM = 1;"));
    let inline = Plan::new(&w, &config(&small.replace("warpgroup", "inline"))).unwrap();
    assert!(inline.blocks(&sm90) > 132, "an inline producer with a small tile runs several blocks per SM");
}
