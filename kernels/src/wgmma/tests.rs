use super::gemm::*;
use super::plan::*;
use super::*;
use crate::dtype::DType;
use crate::space::Config;
use crate::target::Target;
use crate::template::{Arg, Template, TensorOperand};
use crate::workload::{Layout, Types};
use crate::workload::{Matmul, Workload};

fn mm(m: u64, n: u64, k: u64, layout: Layout, input: DType) -> Workload {
    Workload::Matmul(Matmul::new(m, n, k, layout, Types::default_for(input).unwrap()).unwrap())
}

fn config(json: &str) -> Config {
    Config::from_json(json).unwrap()
}

const BIG: &str = r#"{"block_m":256,"block_n":128,"consumers":2,"stages":4,"cluster":2,"persistent":1,"raster_group":8,"producer":"warpgroup","schedule":"cooperative","stream_k":0,"epilogue":"direct"}"#;

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

/// Three consumers beside a producer start at 128 registers a thread (512 threads), and ptxas fits
/// each wgmma in that before setmaxnreg raises them: 64x192 f32 accumulators (96) compile, 64x208
/// (104) failed with C7602 on NVRTC 13.0, and f16 accumulators (half as many) fit either way.
#[test]
fn three_consumers_keep_one_wgmma_within_the_launch_registers() {
    let t = &WgmmaGemm;
    let sm90 = Target::sm90();
    let tile = |m: u32, producer: &str| {
        format!(
            r#"{{"block_m":{m},"block_n":192,"consumers":3,"stages":3,"cluster":1,"persistent":0,"raster_group":1,"producer":"{producer}","schedule":"cooperative","stream_k":0,"epilogue":"direct"}}"#
        )
    };
    let w = mm(4096, 4096, 4096, Layout::Tn, DType::F16);
    t.check(&w, &config(&tile(192, "warpgroup")), &sm90).unwrap();
    let r = t.check(&w, &config(&tile(208, "warpgroup")), &sm90).unwrap_err().to_string();
    assert!(r.contains("104 accumulators in one wgmma") && r.contains("within 128"), "{r}");
    // Without a producer warpgroup (384 threads) the cap is 168.
    t.check(&w, &config(&tile(208, "inline")), &sm90).unwrap();
    let f16_acc = Workload::Matmul(
        Matmul::new(4096, 4096, 4096, Layout::Tn, Types::new(DType::F16, DType::F16, Some(DType::F16)).unwrap())
            .unwrap(),
    );
    t.check(&f16_acc, &config(&tile(208, "warpgroup")), &sm90).unwrap();
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
    assert_eq!(spec.cluster_dims(), [2, 1, 1]);
    assert!(spec.source.contains("m64n256k16.f32.f16.f16") && spec.source.contains("p, 1, 1, 0, 1"));
    // tn with i8: both K-major, 128 K elements per 128-byte row, the integer instruction.
    let w = mm(4096, 4096, 4096, Layout::Tn, DType::I8);
    let spec = WgmmaGemm.generate(&w, &config(BIG), &sm90).unwrap();
    let Arg::Map(y) = spec.args[1] else { panic!() };
    assert_eq!((y.dims, y.box_dims), ([4096, 4096], [128, 128]));
    assert!(spec.source.contains("m64n256k32.s32.s8.s8"));
}

#[test]
fn a_192_column_tile_of_an_m_contiguous_a_is_shared_out_in_a_cluster() {
    let sm90 = Target::sm90();
    // nn: A (Y) is M-contiguous, loaded in 64-column chunks; three chunks in a cluster of 2 are
    // loaded two by the first block and one by the second, each multicast to both.
    let w = mm(3000, 3000, 4096, Layout::Nn, DType::F16);
    let c = config(&BIG.replace(r#""block_m":256"#, r#""block_m":192"#));
    WgmmaGemm.check(&w, &c, &sm90).unwrap();
    let spec = WgmmaGemm.generate(&w, &c, &sm90).unwrap();
    let Arg::Map(y) = spec.args[1] else { panic!("Y's map second") };
    assert_eq!((y.operand, y.box_dims), (TensorOperand::A, [64, 64]));
    assert!(spec.source.contains("__cluster_dims__(2, 1, 1)") && spec.source.contains("m64n192k16"));
}

#[test]
fn a_160_column_tile_takes_a_k_major_a_and_two_row_tiles_per_consumer() {
    let sm90 = Target::sm90();
    let wide = BIG.replace(r#""block_m":256,"block_n":128"#, r#""block_m":160,"block_n":256"#);
    let tn = mm(8192, 8192, 8192, Layout::Tn, DType::F16);
    WgmmaGemm.check(&tn, &config(&wide), &sm90).unwrap();
    let spec = WgmmaGemm.generate(&tn, &config(&wide), &sm90).unwrap();
    assert!(spec.source.contains("m64n160k16") && spec.source.contains("ACC_REGS = 80;"), "two 80-register row tiles");
    let reason = |w: &Workload, json: &str| WgmmaGemm.check(w, &config(json), &sm90).unwrap_err().to_string();
    // nn: A is M-contiguous, loaded and read in 64-column chunks.
    let r = reason(&mm(8192, 8192, 8192, Layout::Nn, DType::F16), &wide);
    assert!(r.contains("block_m 160") && r.contains("multiple of 64"), "{r}");
    // A TMA-stored f16 D goes out in 64-column pieces: 160 is two and a half.
    let f16_out = Workload::Matmul(
        Matmul::new(8192, 8192, 8192, Layout::Tn, Types::new(DType::F16, DType::F32, Some(DType::F16)).unwrap())
            .unwrap(),
    );
    let r = reason(&f16_out, &wide.replace(r#""epilogue":"direct""#, r#""epilogue":"tma""#));
    assert!(r.contains("epilogue") && r.contains("block_m 160"), "{r}");
    // f32 D: 32-column pieces, five of them (three stages leave room for the staging buffers).
    let tma = wide.replace(r#""epilogue":"direct""#, r#""epilogue":"tma""#).replace(r#""stages":4"#, r#""stages":3"#);
    WgmmaGemm.check(&tn, &config(&tma), &sm90).unwrap();
    // Stream-K's partial sums do not fit beside 160 accumulators.
    let r = reason(&tn, &wide.replace(r#""stream_k":0"#, r#""stream_k":1"#));
    assert!(r.contains("stream_k") && r.contains("160"), "{r}");
    // Three row tiles of 160 columns would be 240 registers.
    let r = reason(&tn, &wide.replace(r#""consumers":2"#, r#""consumers":1"#));
    assert!(r.contains("accumulator registers"), "{r}");
}

#[test]
fn y_stays_resident_when_every_tile_of_a_persistent_block_reads_the_same_one() {
    let sm90 = Target::sm90();
    let one_column = BIG
        .replace(r#""block_m":256"#, r#""block_m":128"#)
        .replace(r#""cluster":2"#, r#""cluster":1"#)
        .replace(r#""raster_group":8"#, r#""raster_group":1"#);
    // M = 128: one column of 512 tiles 128 wide; 8 K tiles of Y (16 KiB each) beside 4 stages of X.
    let w = mm(128, 65536, 512, Layout::Tn, DType::F16);
    let res = WgmmaGemm.check(&w, &config(&one_column), &sm90).unwrap();
    assert_eq!(res.smem_bytes, (4 * 128 + 8 * 128) * 128 + SMEM_SLACK);
    let spec = WgmmaGemm.generate(&w, &config(&one_column), &sm90).unwrap();
    assert!(spec.source.contains("constexpr bool Y_RESIDENT = true;"));
    let resident = |w: &Workload, json: &str| {
        let spec = WgmmaGemm.generate(w, &config(json), &sm90).unwrap();
        spec.source.contains("constexpr bool Y_RESIDENT = true;")
    };
    // Not when blocks run one tile each, when a cluster shares Y out, or when M takes two columns.
    assert!(!resident(&w, &one_column.replace(r#""persistent":1"#, r#""persistent":0"#)));
    assert!(!resident(&w, &one_column.replace(r#""cluster":1"#, r#""cluster":2"#)));
    assert!(!resident(&mm(256, 65536, 512, Layout::Tn, DType::F16), &one_column));
    // 128 K tiles of Y do not fit: the config stays valid with Y in the ring.
    let deep = mm(128, 65536, 8192, Layout::Tn, DType::F16);
    let res = WgmmaGemm.check(&deep, &config(&one_column), &sm90).unwrap();
    assert_eq!(res.smem_bytes, 4 * (128 + 128) * 128 + SMEM_SLACK);
    assert!(!resident(&deep, &one_column));
}

#[test]
fn a_grid_that_leaves_most_sms_idle_splits_k_over_a_cluster() {
    let sm90 = Target::sm90();
    let grid_128 = r#"{"block_m":128,"block_n":128,"cluster":1,"consumers":2,"epilogue":"direct","persistent":0,"producer":"warpgroup","raster_group":1,"schedule":"cooperative","stages":4,"stream_k":0}"#;
    // 512x384: 12 tiles of 128x128 on 132 SMs; K 8192 is 128 K tiles: 8 blocks a tile, 16 K tiles each.
    let w = mm(512, 384, 8192, Layout::Nn, DType::F16);
    let spec = WgmmaGemm.generate(&w, &config(grid_128), &sm90).unwrap();
    assert_eq!(spec.grid, [96, 1, 1]);
    assert!(spec.source.contains("constexpr int SPLIT = 8;"), "{}", spec.name);
    assert!(spec.source.contains("__cluster_dims__(8, 1, 1)") && spec.name.contains("_ks8_"), "{}", spec.name);
    let split_of = |w: &Workload, json: &str| {
        let spec = WgmmaGemm.generate(w, &config(json), &sm90).unwrap();
        constant(&spec.source, "SPLIT")
    };
    // K 512 is 8 K tiles: two blocks of 4.
    assert_eq!(split_of(&mm(512, 384, 512, Layout::Nn, DType::F16), grid_128), 2);
    // 16 tiles: 16 clusters of 8 would need every SM but 4, more than the GPCs offer; 4 a tile.
    assert_eq!(split_of(&mm(512, 512, 8192, Layout::Nn, DType::F16), grid_128), 4);
    // Not where the tiles fill the GPU, and not where something else owns the tile walk or the
    // epilogue.
    assert_eq!(split_of(&mm(4096, 4096, 8192, Layout::Nn, DType::F16), grid_128), 1);
    assert_eq!(split_of(&w, &grid_128.replace(r#""epilogue":"direct""#, r#""epilogue":"tma""#)), 1);
    // A cluster of 2 (Y multicast) splits too, with pairs of tiles in one cluster: 512x384 is 4
    // N tiles (one of padding) in 2 pairs x 4 M tiles; split 4 fills a cluster of 8.
    let pair = WgmmaGemm.generate(&w, &config(&grid_128.replace(r#""cluster":1"#, r#""cluster":2"#)), &sm90).unwrap();
    assert_eq!((constant(&pair.source, "SPLIT"), pair.grid), (4, [64, 1, 1]), "{}", pair.name);
    assert!(pair.source.contains("__cluster_dims__(8, 1, 1)") && pair.name.contains("_cl2_"), "{}", pair.name);
    assert_eq!(split_of(&w, &grid_128.replace(r#""schedule":"cooperative""#, r#""schedule":"pingpong""#)), 1);
    // i8 and f16 accumulators split too (whole register vectors per share).
    let i8 = Workload::Matmul(Matmul::new(512, 384, 8192, Layout::Tn, Types::default_for(DType::I8).unwrap()).unwrap());
    assert_eq!(split_of(&i8, grid_128), 8);
    let f16acc = Workload::Matmul(
        Matmul::new(512, 384, 8192, Layout::Nn, Types::new(DType::F16, DType::F16, None).unwrap()).unwrap(),
    );
    assert_eq!(split_of(&f16acc, grid_128), 8);
}

#[test]
fn stream_k_on_at_most_half_a_wave_of_tiles_gives_each_tile_whole_clusters() {
    let sm90 = Target::sm90();
    let sk = |bm: u32, bn: u32, cluster: u32| {
        config(&format!(
            r#"{{"block_m":{bm},"block_n":{bn},"cluster":{cluster},"consumers":1,"epilogue":"direct","persistent":1,"producer":"warpgroup","raster_group":1,"schedule":"cooperative","stages":4,"stream_k":1}}"#
        ))
    };
    // 512x1024x16384: 64 tiles of 128x64 (a wave is 132 blocks), 32 pairs in clusters of 2 (a
    // wave is 66 clusters), 16 tiles of 256x128.
    let w = Matmul::new(512, 1024, 16384, Layout::Nn, Types::default_for(DType::F16).unwrap()).unwrap();
    let kt = 16384 / 64;
    for (bm, bn, cluster, clusters_per_tile) in [(128, 64, 1, 2), (128, 64, 2, 2), (256, 64, 1, 4)] {
        let p = Plan::new(&w, &sk(bm, bn, cluster)).unwrap();
        let g = p.grid(&sm90);
        let cl = cluster as u64;
        assert_eq!(g.blocks / cl, g.cluster_tiles * clusters_per_tile, "{}", p.name(&sm90));
        for b in 0..g.blocks {
            // One job a block: one share of one tile, the first shares partial, the last the tail.
            let jobs = p.block_work(&sm90, b);
            let share = (b / cl) % clusters_per_tile;
            assert_eq!(jobs.len(), 1, "{}: block {b}: {jobs:?}", p.name(&sm90));
            let j = &jobs[0];
            assert_eq!(
                (j.ct, j.k0, j.k1),
                (b / cl / clusters_per_tile, share * kt / clusters_per_tile, (share + 1) * kt / clusters_per_tile)
            );
            let want = if share + 1 == clusters_per_tile { WorkKind::Tail } else { WorkKind::Partial };
            assert_eq!(j.kind, want, "{}: block {b}", p.name(&sm90));
        }
    }
    // More than half a wave of tiles keeps the ranges over every cluster of the wave.
    let wide = Matmul::new(2048, 1024, 16384, Layout::Nn, Types::default_for(DType::F16).unwrap()).unwrap();
    let p = Plan::new(&wide, &sk(128, 128, 1)).unwrap();
    assert_eq!((p.grid(&sm90).cluster_tiles, p.blocks(&sm90)), (128, 132));
}

#[test]
fn the_tile_walk_covers_every_k_tile_of_every_output_tile_exactly_once() {
    let sm90 = Target::sm90();
    let mut checked = 0;
    let mut stream_k = 0;
    let mut split = 0;
    let mut split_cluster = 0;
    let mut short_groups = 0;
    let mut raster_m = 0;
    let mut sk_whole_wave = 0;
    for (m, n, k, layout) in [
        (4096, 4096, 4096, Layout::Nn),
        (3000, 3000, 4096, Layout::Nn),
        (256, 8192, 8192, Layout::Tn),
        (1000, 1000, 1024, Layout::Tn),
        (1024, 1024, 1024, Layout::Nn),
        (2048, 5120, 5120, Layout::Nt),
        (4096, 14336, 4096, Layout::Nn),
        // A decode step: the swapped view's narrow N tiles beside 64-row ones.
        (4096, 16, 4096, Layout::Tn),
    ] {
        let w = Matmul::new(m, n, k, layout, Types::default_for(DType::F16).unwrap()).unwrap();
        let valid = WgmmaGemm.valid_indices(&Workload::Matmul(w), &sm90).unwrap();
        for i in valid.iter().step_by(7) {
            let p = Plan::at(&w, *i);
            let name = p.name(&sm90);
            let cl = p.cluster as u64;
            let kt = k.div_ceil(p.bk() as u64);
            let (pe, qe) = if p.swap { (m, n) } else { (n, m) };
            let (tiles_p, tiles_q) = (pe.div_ceil(p.bp as u64).next_multiple_of(cl), qe.div_ceil(p.bq as u64));
            // Per output tile: K tiles summed, jobs that stored it, and the blocks whose partial
            // sums it holds (by cluster tile, for the tail check).
            let mut k_seen = vec![0u64; (tiles_p * tiles_q) as usize];
            let mut stores = vec![0u32; (tiles_p * tiles_q) as usize];
            // K-split shares of each tile: (blocks, K tiles).
            let mut shares = vec![(0u64, 0u64); (tiles_p * tiles_q) as usize];
            let mut partials: std::collections::BTreeMap<u64, Vec<u64>> = Default::default();
            let mut tails = Vec::new();
            // Stream-K: each cluster's range (K tiles), the K tiles it has summed when its tail
            // starts, and the K tiles of its partial (its first job).
            let mut sk_ranges = Vec::new();
            let mut tail_starts = std::collections::BTreeMap::new();
            let mut partial_ends = std::collections::BTreeMap::new();
            let g = p.grid(&sm90);
            for b in 0..p.blocks(&sm90) {
                let jobs = p.block_work(&sm90, b);
                assert!(p.persistent || jobs.len() == 1, "{name}: a non-persistent block runs {} jobs", jobs.len());
                let kinds: Vec<WorkKind> = jobs.iter().map(|j| j.kind).collect();
                // A partial comes first (nobody waits long for it), a tail last of the stream-K
                // range, one of each at most; the range comes before the tile-by-tile tiles.
                let sk_jobs = jobs.iter().take_while(|j| p.stream_k && j.ct >= g.sk_dp_tiles).count();
                assert!(
                    jobs[sk_jobs..]
                        .iter()
                        .all(|j| matches!(j.kind, WorkKind::Full | WorkKind::Split)
                            && (!p.stream_k || j.ct < g.sk_dp_tiles)),
                    "{name}: {kinds:?}"
                );
                assert!(!kinds.iter().skip(1).any(|k| *k == WorkKind::Partial), "{name}: {kinds:?}");
                assert!(!kinds[..sk_jobs].iter().rev().skip(1).any(|k| *k == WorkKind::Tail), "{name}: {kinds:?}");
                if p.stream_k && b % cl == 0 {
                    let range = &jobs[..sk_jobs];
                    let k_tiles = |js: &[Work]| js.iter().map(|j| j.k1 - j.k0).sum::<u64>();
                    sk_ranges.push(k_tiles(range));
                    // K tiles this cluster has summed when its tail starts, and when its partial ends.
                    if let Some((last, before)) = range.split_last()
                        && last.kind == WorkKind::Tail
                    {
                        tail_starts.insert(b / cl, k_tiles(before));
                    }
                    if let Some(first) = range.first().filter(|j| j.kind == WorkKind::Partial) {
                        partial_ends.insert(b / cl, first.k1 - first.k0);
                    }
                }
                for j in &jobs {
                    let (tp, tq) = p.tile_of(&sm90, j.ct, b % cl);
                    assert!(tq < tiles_q && tp < tiles_p, "{name}: tile ({tp}, {tq})");
                    assert!(j.k0 < j.k1 && j.k1 <= kt, "{name}: K tiles {}..{} of {kt}", j.k0, j.k1);
                    let t = (tp * tiles_q + tq) as usize;
                    k_seen[t] += j.k1 - j.k0;
                    match j.kind {
                        WorkKind::Full => {
                            assert_eq!((j.k0, j.k1), (0, kt), "{name}");
                            stores[t] += 1;
                        }
                        WorkKind::Partial => partials.entry(j.ct).or_default().push(b / cl),
                        WorkKind::Split => {
                            // A cluster of cl * ks blocks: run kr = rank / cl of each pair's K tiles.
                            let ks = p.k_split(&sm90) as u64;
                            let kr = b % (cl * ks) / cl;
                            assert_eq!(j.ct, b / (cl * ks), "{name}: the blocks of a cluster share one cluster tile");
                            assert_eq!((j.k0, j.k1), (kr * kt / ks, (kr + 1) * kt / ks), "{name}");
                            shares[t].0 += 1;
                            shares[t].1 += j.k1 - j.k0;
                        }
                        WorkKind::Tail => {
                            assert_eq!(j.k1, kt, "{name}: a tail ends the tile");
                            stores[t] += 1;
                            if b % cl == 0 {
                                tails.push((b / cl, j.ct));
                            }
                        }
                    }
                }
            }
            let ks = p.k_split(&sm90) as u64;
            for t in 0..(tiles_p * tiles_q) as usize {
                assert_eq!(k_seen[t], kt, "{name}: tile {t}");
                if ks > 1 {
                    // Every block of the cluster stores its share; together they store the tile.
                    assert_eq!((stores[t], shares[t]), (0, (ks, kt)), "{name}: tile {t}");
                } else {
                    assert_eq!((stores[t], shares[t].0), (1, 0), "{name}: tile {t}");
                }
            }
            // Each tail adds exactly the partial sums left for its tile, and each is added once.
            let mut added = 0;
            for (c, ct) in &tails {
                let mut sources = p.tail_sources(&sm90, *c, *ct);
                sources.sort_unstable();
                let mut want = partials.get(ct).cloned().unwrap_or_default();
                want.sort_unstable();
                want.dedup();
                assert_eq!(sources, want, "{name}: tail of cluster tile {ct} on cluster {c}");
                added += sources.len();
            }
            let left: usize = partials.values().map(|v| v.len() / cl as usize).sum();
            assert_eq!(added, left, "{name}: partial sums nobody adds");
            if p.stream_k {
                // Equal ranges (within one K tile), so every cluster reaches its tile-by-tile
                // tiles together; and, where the grid has at least a wave of tiles, at least one
                // tile's K each, so in step no tail starts before the partials it adds are done.
                let (lo, hi) = (*sk_ranges.iter().min().unwrap(), *sk_ranges.iter().max().unwrap());
                assert!(hi - lo <= 1, "{name}: stream-K ranges of {lo}..{hi} K tiles");
                if g.cluster_tiles >= g.blocks / cl {
                    assert!(lo >= kt, "{name}: a stream-K range of {lo} K tiles, a tile has {kt}");
                    sk_whole_wave += 1;
                    for (c, ct) in &tails {
                        for src in p.tail_sources(&sm90, *c, *ct) {
                            assert!(partial_ends[&src] <= tail_starts[c], "{name}: cluster {c}'s tail waits for {src}");
                        }
                    }
                }
            }
            stream_k += usize::from(p.stream_k);
            split += usize::from(ks > 1);
            split_cluster += usize::from(ks > 1 && cl > 1);
            // Raster groups whose last group is short (the kernel's second constant divisor).
            let lines = if p.raster_m { tiles_q } else { tiles_p / cl };
            short_groups += usize::from(p.group > 1 && !lines.is_multiple_of(p.group as u64));
            raster_m += usize::from(p.raster_m);
            checked += 1;
        }
    }
    assert!(
        checked > 500
            && stream_k > 50
            && sk_whole_wave > 50
            && split > 10
            && split_cluster > 5
            && short_groups > 200
            && raster_m > 200,
        "checked {checked} configs, {stream_k} with stream_k ({sk_whole_wave} of a wave or more), {split} split \
         ({split_cluster} in clusters of 2), {short_groups} with a short last group, {raster_m} with raster m"
    );
}

#[test]
fn the_raster_knob_walks_along_the_dimension_it_names_and_defaults_to_n() {
    let sm90 = Target::sm90();
    // 14336 / 128 = 112 rows of block_n tiles (56 cluster rows), 4096 / 256 = 16 columns.
    let w = Matmul::new(4096, 14336, 4096, Layout::Nn, Types::default_for(DType::F16).unwrap()).unwrap();
    let space = WgmmaGemm.space();
    let walk = |raster: &str, group: u32| {
        let c = config(&BIG.replace(r#""raster_group":8"#, &format!(r#""raster_group":{group},"raster":"{raster}""#)));
        let p = Plan::new(&w, &c).unwrap();
        assert_eq!(p.raster_m, raster == "m");
        (0..p.grid(&sm90).cluster_tiles).map(|ct| p.tile_of(&sm90, ct, 0)).collect::<Vec<_>>()
    };
    // Raster n, bands of 8 cluster rows: rows 0, 2, ..., 14 of column 0, then of column 1.
    let n8 = walk("n", 8);
    assert_eq!(&n8[..9], &[(0, 0), (2, 0), (4, 0), (6, 0), (8, 0), (10, 0), (12, 0), (14, 0), (0, 1)]);
    assert_eq!(n8[8 * 16], (16, 0), "the second band starts after 8 rows x 16 columns");
    // Raster m, bands of 4 columns: columns 0..4 of cluster row 0, then of row 1.
    let m4 = walk("m", 4);
    assert_eq!(&m4[..6], &[(0, 0), (0, 1), (0, 2), (0, 3), (2, 0), (2, 1)]);
    assert_eq!(m4[4 * 56], (0, 4), "the second band starts after 4 columns x 56 cluster rows");
    // Raster m, group 1: the whole row first.
    let m1 = walk("m", 1);
    assert_eq!(m1[15], (0, 15));
    assert_eq!(m1[16], (2, 0));
    // A band count that does not divide: 16 columns in bands of 16 are refused (one band only).
    let c = config(&BIG.replace(r#""raster_group":8"#, r#""raster_group":16,"raster":"m""#));
    let e = WgmmaGemm.generate(&Workload::Matmul(w), &c, &sm90).unwrap_err().to_string();
    assert!(e.contains("raster_group 16 with raster m") && e.contains("(have 16)"), "{e}");
    // A one-column grid walks the same either way, so raster m is refused there.
    let one_col = Matmul::new(256, 65536, 1024, Layout::Nn, Types::default_for(DType::F16).unwrap()).unwrap();
    let c = config(&BIG.replace(r#""raster_group":8"#, r#""raster_group":1,"raster":"m""#));
    let e = WgmmaGemm.generate(&Workload::Matmul(one_col), &c, &sm90).unwrap_err().to_string();
    assert!(e.contains("raster m walks a grid of one row or one column"), "{e}");
    // A config written before the knob existed reads as raster n, the order it always had, and
    // completes to the same point of the space.
    let old = config(BIG);
    assert!(!old.0.contains_key("raster"));
    let with_n = config(&BIG.replace(r#""raster_group":8"#, r#""raster_group":8,"raster":"n""#));
    assert_eq!(space.index_of(&old).unwrap(), space.index_of(&with_n).unwrap());
    assert_eq!(space.config(space.index_of(&old).unwrap()).unwrap(), with_n);
    assert_eq!(
        WgmmaGemm.generate(&Workload::Matmul(w), &old, &sm90).unwrap().source,
        WgmmaGemm.generate(&Workload::Matmul(w), &with_n, &sm90).unwrap().source
    );
    // Other knobs have no default: leaving one out still names it.
    let mut no_stages = old.clone();
    no_stages.0.remove("stages");
    let e = space.index_of(&no_stages).unwrap_err().to_string();
    assert!(e.contains("stages") && e.contains("missing"), "{e}");
}

#[test]
fn stream_k_rules_and_workspace() {
    let sm90 = Target::sm90();
    let sk = BIG.replace(r#""stream_k":0"#, r#""stream_k":1"#).replace(r#""cluster":2"#, r#""cluster":1"#);
    // 2048x5120: 8 x 40 = 320 tiles of 256x128 on 132 SMs, 2.4 waves: one wave tile by tile,
    // the remaining 188 tiles' K tiles shared out.
    let w = Matmul::new(2048, 5120, 5120, Layout::Nt, Types::default_for(DType::Bf16).unwrap()).unwrap();
    let p = Plan::new(&w, &config(&sk)).unwrap();
    let res = p.check(&sm90).unwrap();
    assert_eq!(res.blocks, 132);
    // A flag per (block, consumer), then 128 threads x 128 f32 accumulators per (block, consumer).
    assert_eq!(res.workspace_bytes, 1280 + 132 * 2 * 128 * 128 * 4);
    let spec = WgmmaGemm.generate(&Workload::Matmul(w), &config(&sk), &sm90).unwrap();
    assert_eq!(spec.workspace_bytes, res.workspace_bytes);
    assert_eq!(spec.args.last(), Some(&Arg::Workspace));
    assert!(spec.source.contains("constexpr bool STREAM_K = true;"), "{}", &spec.source[..2000]);
    // Tiles smaller than a wave: stream-K is how such a shape fills the GPU.
    let small = Matmul::new(1024, 1024, 1024, Layout::Nn, Types::default_for(DType::F16).unwrap()).unwrap();
    let sk_small = sk.replace(r#""raster_group":8"#, r#""raster_group":1"#);
    Plan::new(&small, &config(&sk_small)).unwrap().check(&sm90).unwrap();
    let reason = |w: &Matmul, json: &str| Plan::new(w, &config(json)).unwrap().check(&sm90).unwrap_err().to_string();
    let r = reason(&w, &sk.replace(r#""persistent":1"#, r#""persistent":0"#));
    assert!(r.contains("stream_k") && r.contains("persistent 1"), "{r}");
    let r = reason(&w, &sk.replace("cooperative", "pingpong"));
    assert!(r.contains("stream_k") && r.contains("cooperative"), "{r}");
    // 4096 x 8448: 33 x 32 = 1056 tiles, 8 whole waves.
    let whole = Matmul::new(4096, 8448, 1024, Layout::Nn, Types::default_for(DType::F16).unwrap()).unwrap();
    let r = reason(&whole, &sk);
    assert!(r.contains("whole waves"), "{r}");
}

#[test]
fn the_tma_store_epilogue_maps_d_and_needs_aligned_rows() {
    let sm90 = Target::sm90();
    let tma = BIG.replace(r#""epilogue":"direct""#, r#""epilogue":"tma""#);
    let w = mm(4096, 3072, 1024, Layout::Nn, DType::F16);
    let spec = WgmmaGemm.generate(&w, &config(&tma), &sm90).unwrap();
    let Arg::Map(d) = spec.args[2] else { panic!("D's map third: {:?}", spec.args) };
    // f32 D, column-major M x N: rows of M, boxes of 32 elements (128 bytes) x 64 rows.
    assert_eq!((d.operand, d.dims, d.row_bytes, d.box_dims), (TensorOperand::D, [4096, 3072], 16384, [32, 64]));
    assert_eq!(spec.args[3..], [Arg::C, Arg::D, Arg::Workspace]);
    assert!(spec.source.contains("constexpr bool TMA_STORE = true;"));
    let direct = WgmmaGemm.generate(&w, &config(BIG), &sm90).unwrap();
    // Two 16 KiB staging buffers per consumer warpgroup.
    assert_eq!(spec.smem_bytes - direct.smem_bytes, 2 * 2 * 64 * 128);
    // M = 1002 f32 elements is 4008 bytes a row: not whole 16-byte units.
    let ragged = mm(1002, 1024, 1024, Layout::Tn, DType::F16);
    let r = WgmmaGemm.check(&ragged, &config(&tma.replace(r#""persistent":1"#, r#""persistent":0"#)), &sm90);
    let r = r.unwrap_err().to_string();
    assert!(r.contains("epilogue tma") && r.contains("M=1002"), "{r}");
}

/// Version 18: with C (beta != 0), the TMA store and a producer warpgroup, C comes by TMA through
/// a map of its own (D's, over C) into a ring per consumer that takes the shared memory the block
/// leaves, up to two tiles' worth; other configs read C as version 17 did and keep their launch.
#[test]
fn c_is_loaded_by_tma_beside_the_tma_store() {
    let sm90 = Target::sm90();
    let w = Workload::from_key("matmul/m1024n1000k1024/nn/f16,f32,f16/alpha=1,beta=1").unwrap();
    let pp = r#"{"block_m":128,"block_n":128,"consumers":2,"stages":2,"cluster":1,"persistent":0,"raster_group":1,"producer":"warpgroup","schedule":"pingpong","stream_k":0,"epilogue":"tma"}"#;
    let spec = WgmmaGemm.generate(&w, &config(pp), &sm90).unwrap();
    let (Arg::Map(d), Arg::Map(c)) = (spec.args[2], spec.args[3]) else { panic!("maps of D and C: {:?}", spec.args) };
    assert_eq!((c.operand, c.dims, c.row_bytes, c.box_dims), (TensorOperand::C, d.dims, d.row_bytes, d.box_dims));
    assert_eq!(spec.args[4..], [Arg::C, Arg::D, Arg::Workspace]);
    // Ping-pong: a consumer's tile is 2 row tiles x 2 column blocks; two tiles' worth fit beside 2 stages.
    assert_eq!(constant(&spec.source, "C_SLOTS"), 8);
    assert!(spec.smem_bytes <= sm90.max_smem_per_block);
    // Deeper stages leave room for fewer blocks: 4 stages of 32 KiB and the staging leave 4 a consumer.
    let deep = WgmmaGemm.generate(&w, &config(&pp.replace(r#""stages":2"#, r#""stages":4"#)), &sm90).unwrap();
    assert_eq!(constant(&deep.source, "C_SLOTS"), 4);
    assert!(deep.smem_bytes <= sm90.max_smem_per_block && deep.smem_bytes + 2 * 8208 > sm90.max_smem_per_block);
    // No C, stores from registers, or an inline producer: C_SLOTS 0 and no map of C.
    let plain = Workload::from_key("matmul/m1024n1000k1024/nn/f16,f32,f16/alpha=1,beta=0").unwrap();
    let inline = pp.replace("warpgroup", "inline").replace("pingpong", "cooperative");
    for (w, json) in
        [(&plain, pp.to_string()), (&w, pp.replace(r#""epilogue":"tma""#, r#""epilogue":"direct""#)), (&w, inline)]
    {
        let spec = WgmmaGemm.generate(w, &config(&json), &sm90).unwrap();
        assert_eq!(constant(&spec.source, "C_SLOTS"), 0, "{json}");
        assert!(!spec.args.iter().any(|a| matches!(a, Arg::Map(m) if m.operand == TensorOperand::C)), "{json}");
    }
}

/// Version 19: C's TMA loads and D's TMA stores carry the L2 evict-first hint where the kernel's
/// data (A, B, C and D) overflows the L2 (`C_ONCE`), and only on the C-by-TMA path.
#[test]
fn c_and_d_stream_past_the_l2_only_where_the_data_overflows_it() {
    let sm90 = Target::sm90();
    let pp = r#"{"block_m":128,"block_n":128,"consumers":2,"stages":4,"cluster":1,"persistent":1,"raster_group":1,"producer":"warpgroup","schedule":"pingpong","stream_k":0,"epilogue":"tma"}"#;
    let once = |key: &str, json: &str| {
        let t: &dyn Template = if key.starts_with("conv2d") { &super::conv::WgmmaConv2d } else { &WgmmaGemm };
        let src = t.generate(&Workload::from_key(key).unwrap(), &config(json), &sm90).unwrap().source;
        src.contains("constexpr bool C_ONCE = true;")
    };
    // ResNet-50's N=32 28x28 128->512 block end: 58 MB, past the 50 MiB L2.
    let res28 = "conv2d/n32h28w28c128/k512r1s1/pad0x0,stride1x1,dil1x1/nhwc/f16,f32,f16/beta=1,epi=bias+relu";
    assert!(once(res28, pp));
    // Its 14x14 256->1024 one, 29 MB; the same GEMM's data without C; C through registers.
    assert!(!once("conv2d/n32h14w14c256/k1024r1s1/pad0x0,stride1x1,dil1x1/nhwc/f16,f32,f16/beta=1,epi=bias+relu", pp));
    assert!(!once(&res28.replace("beta=1,", ""), pp));
    assert!(!once(res28, &pp.replace(r#""epilogue":"tma""#, r#""epilogue":"direct""#)));
}

#[test]
fn a_producer_warpgroup_keeps_one_block_per_sm() {
    // setmaxnreg moves registers inside one block's allocation; two blocks per SM hung on an H200.
    let sm90 = Target::sm90();
    let w = Matmul::new(4096, 4096, 4096, Layout::Nn, Types::default_for(DType::F16).unwrap()).unwrap();
    let small = r#"{"block_m":64,"block_n":64,"consumers":1,"stages":2,"cluster":1,"persistent":1,"raster_group":1,"producer":"warpgroup","schedule":"cooperative","stream_k":0,"epilogue":"direct"}"#;
    let p = Plan::new(&w, &config(small)).unwrap();
    assert_eq!(p.blocks(&sm90), 132);
    assert!(p.source(&sm90).contains("constexpr int BLOCKS_PER_SM = 1;"));
    let spec = WgmmaGemm.generate(&Workload::Matmul(w), &config(small), &sm90).unwrap();
    assert_eq!(spec.cluster_dims(), [1, 1, 1], "no cluster");
    let inline = Plan::new(&w, &config(&small.replace("warpgroup", "inline"))).unwrap();
    assert!(inline.blocks(&sm90) > 132, "an inline producer with a small tile runs several blocks per SM");
}

/// The value of `constexpr int NAME = V;` in a generated source.
fn constant(source: &str, name: &str) -> u32 {
    let prefix = format!("constexpr int {name} = ");
    let line = source.lines().find_map(|l| l.trim().strip_prefix(prefix.as_str())).unwrap_or_else(|| panic!("{name}"));
    line.trim_end_matches(';').parse().unwrap()
}

/// setmaxnreg moves registers within the block's allocation at launch: every thread starts at
/// the `__launch_bounds__(threads, 1)` cap, so the producer's PRODUCER_REGS plus the consumers'
/// CONSUMER_REGS (per lane of a warpgroup) must fit in threads x cap. A config past it hangs on
/// the GPU (its consumers wait forever in setmaxnreg.inc), which no CPU test would otherwise see.
#[test]
fn warp_specialized_register_budgets_fit_the_launch_allocation() {
    let sm90 = Target::sm90();
    let conv = |n, hw, c, k, rs, pad, stride| {
        Workload::Conv2d(crate::workload::Conv2d {
            n,
            h: hw,
            w: hw,
            c,
            k,
            r: rs,
            s: rs,
            pad: (pad, pad),
            stride: (stride, stride),
            dilation: (1, 1),
            types: Types::default_for(DType::F16).unwrap(),
            epilogue: Default::default(),
            residual: false,
        })
    };
    // Each config's header alone (its constants, as the kernel's source has them), not the whole
    // source: this walks thousands of configs.
    let gemm_plan = |w: &Workload, c: &Config| Plan::new(matmul(w)?, c);
    type PlanOf<'a> = &'a dyn Fn(&Workload, &Config) -> crate::error::Result<Plan>;
    let cases: Vec<(&dyn Template, PlanOf, Workload)> = vec![
        (&WgmmaGemm, &gemm_plan, mm(4096, 4096, 4096, Layout::Nn, DType::F16)),
        (&WgmmaGemm, &gemm_plan, mm(1000, 1000, 1024, Layout::Tn, DType::I8)),
        (&conv::WgmmaConv2d, &conv::plan, conv(32, 56, 64, 64, 3, 1, 1)),
        (&conv::WgmmaConv2d, &conv::plan, conv(32, 28, 128, 128, 3, 1, 2)),
        (&conv::WgmmaConv2d, &conv::plan, conv(32, 56, 64, 128, 1, 0, 1)),
    ];
    let mut specialized = 0;
    for (t, plan, w) in cases {
        for (_, c) in crate::template::valid_configs(t, &w, &sm90).unwrap() {
            if c.name("producer").unwrap() != "warpgroup" {
                continue;
            }
            let p = plan(&w, &c).unwrap();
            let name = p.name(&sm90);
            let header = p.header(&sm90, &name).source("ns", &[]);
            let consumers = constant(&header, "CONSUMERS");
            let threads = 128 * (consumers + 1);
            let cap = (sm90.regs_per_sm / threads).min(255) / 8 * 8;
            let (producer, consumer) = (constant(&header, "PRODUCER_REGS"), constant(&header, "CONSUMER_REGS"));
            assert!(
                128 * (producer + consumers * consumer) <= threads * cap,
                "{name}: producer {producer} + {consumers} x {consumer} registers per lane exceed {threads} x {cap}",
            );
            assert_eq!(consumer % 8, 0, "{name}");
            specialized += 1;
        }
    }
    assert!(specialized > 500, "only {specialized} warp-specialized configs checked");
}

/// A gathering producer marks a stage full GATHER_LAG tiles after issuing it; consumers free a
/// stage only once the next is full, so the lag must leave two stages of slack or the pipeline
/// waits forever (see `Plan::gather_lag`).
#[test]
fn gathered_stages_are_marked_full_before_the_producer_needs_them_back() {
    let sm90 = Target::sm90();
    let layer = Workload::Conv2d(crate::workload::Conv2d {
        n: 32,
        h: 56,
        w: 56,
        c: 64,
        k: 64,
        r: 3,
        s: 3,
        pad: (1, 1),
        stride: (1, 1),
        dilation: (1, 1),
        types: Types::default_for(DType::F16).unwrap(),
        epilogue: Default::default(),
        residual: false,
    });
    let mut stages_seen = std::collections::BTreeSet::new();
    for (_, c) in crate::template::valid_configs(&conv::WgmmaConv2d, &layer, &sm90).unwrap() {
        // The config's header alone: its constants, as the kernel's source has them.
        let p = conv::plan(&layer, &c).unwrap();
        let name = p.name(&sm90);
        let header = p.header(&sm90, &name).source("ns", &[]);
        let (stages, lag) = (constant(&header, "STAGES"), constant(&header, "GATHER_LAG"));
        assert!(lag + 2 <= stages, "{name}: lag {lag} with {stages} stages");
        stages_seen.insert(stages);
    }
    assert!(stages_seen.contains(&2) && stages_seen.len() >= 3, "{stages_seen:?}");
}

#[test]
fn tf32_is_k_major_only_and_issues_k8_tf32_wgmmas() {
    let t = &WgmmaGemm;
    let sm90 = Target::sm90();
    let e = t.supports(&mm(4096, 4096, 4096, Layout::Nn, DType::Tf32), &sm90).unwrap_err();
    assert_eq!(e.field(), Some("layout"));
    assert!(e.to_string().contains("mma_ext_gemm"), "{e}");
    let w = mm(4096, 4096, 4096, Layout::Tn, DType::Tf32);
    let valid = crate::template::valid_configs(t, &w, &sm90).unwrap();
    assert!(valid.len() >= 50, "{} valid tf32 configs", valid.len());
    let spec = t.generate(&w, &config(BIG), &sm90).unwrap();
    // K 8 per wgmma (32 bytes, as for every type), scale immediates, no transpose bits; a stage
    // row of 128 bytes holds 32 floats.
    let line = spec.source.lines().find(|l| l.contains("wgmma.mma_async")).unwrap_or("");
    assert!(line.contains("k8.f32.tf32.tf32"), "no tf32 wgmma: {line}");
    assert!(spec.source.contains("p, 1, 1;"), "tf32 takes the scale immediates only");
    assert!(spec.source.contains("constexpr int BK = 32;"));
    assert!(spec.args.iter().any(|a| matches!(a, crate::Arg::Map(m) if m.dtype == DType::Tf32)));
    // Exact f32 is not wgmma's: it would round.
    let e = t.supports(&mm(4096, 4096, 4096, Layout::Tn, DType::F32), &sm90).unwrap_err();
    assert_eq!(e.field(), Some("input"));
}

#[test]
fn stores_from_registers_go_in_vectors_only_where_m_takes_whole_vectors() {
    let sm90 = Target::sm90();
    let direct = BIG
        .replace(r#""cluster":2"#, r#""cluster":1"#)
        .replace(r#""persistent":1"#, r#""persistent":0"#)
        .replace(r#""raster_group":8"#, r#""raster_group":1"#);
    let f16_out = |m: u64| Workload::from_key(&format!("matmul/m{m}n1000k512/tn/f16,f32,f16/alpha=1,beta=0")).unwrap();
    let vec_aligned = |w: &Workload| {
        let src = WgmmaGemm.generate(w, &config(&direct), &sm90).unwrap().source;
        assert!(src.contains("constexpr bool VEC_ALIGNED"), "the flag is emitted");
        src.contains("constexpr bool VEC_ALIGNED = true;")
    };
    // 16 bytes are 8 f16 outputs along M (the view's Q, contiguous in D); 4-byte outputs store pairs.
    assert!(vec_aligned(&f16_out(1000)));
    assert!(!vec_aligned(&f16_out(1004)));
}

#[test]
fn skinny_gemms_swap_the_operands_for_narrow_n_tiles() {
    let sm90 = Target::sm90();
    let e4m3 = Types::new(DType::E4m3, DType::F32, Some(DType::Bf16)).unwrap();
    let decode = Workload::Matmul(Matmul::new(4096, 16, 4096, Layout::Tn, e4m3).unwrap());
    let narrow = r#"{"block_m":128,"block_n":16,"consumers":1,"stages":6,"cluster":1,"persistent":0,"raster_group":1,"producer":"inline","schedule":"cooperative","stream_k":0,"epilogue":"direct"}"#;
    let spec = WgmmaGemm.generate(&decode, &config(narrow), &sm90).unwrap();
    // X is the user's A (M rows, 64-row wgmma tiles), Y the user's B (N = 16 columns: wgmma's n).
    let (Arg::Map(x), Arg::Map(y)) = (spec.args[0], spec.args[1]) else { panic!("maps first") };
    assert_eq!((x.operand, x.dims, x.box_dims), (TensorOperand::A, [4096, 4096], [128, 128]));
    assert_eq!((y.operand, y.dims, y.box_dims), (TensorOperand::B, [4096, 16], [128, 16]));
    assert!(spec.source.contains("m64n16k32.f32.e4m3.e4m3"), "{}", spec.name);
    assert!(spec.source.contains("constexpr bool SWAP = true;") && spec.name.contains("m128n16sw"));
    assert_eq!((constant(&spec.source, "P"), constant(&spec.source, "Q")), (4096, 16));
    // 32 tiles of 128 rows leave most SMs idle: the K split spreads them over more blocks.
    assert!(spec.grid[0] >= 64, "{}: {} blocks", spec.name, spec.grid[0]);
    // Among the valid configs, swapped ones fill the GPU with a block or more per SM.
    let valid = WgmmaGemm.valid_indices(&decode, &sm90).unwrap();
    let Workload::Matmul(w) = decode else { unreachable!() };
    let swapped: Vec<Plan> = valid.iter().map(|i| Plan::at(&w, *i)).filter(|p| p.swap).collect();
    assert!(swapped.len() >= 50, "{} swapped configs of {}", swapped.len(), valid.len());
    assert!(swapped.iter().all(|p| p.bq == 16), "block_n 32 is twice N = 16");
    assert!(swapped.iter().any(|p| p.blocks(&sm90) >= 128 && p.k_split(&sm90) >= 2));
    assert!(swapped.iter().any(|p| p.blocks(&sm90) >= 128 && p.stream_k));
    // Each rule names its reason.
    let reason = |w: &Workload, json: &str| WgmmaGemm.check(w, &config(json), &sm90).unwrap_err().to_string();
    let r = reason(&decode, &narrow.replace(r#""block_n":16"#, r#""block_n":32"#));
    assert!(r.contains("block_n 32 is at least twice N=16"), "{r}");
    let r = reason(&decode, &narrow.replace(r#""epilogue":"direct""#, r#""epilogue":"tma""#));
    assert!(r.contains("epilogue direct"), "{r}");
    let r = reason(&mm(4096, 16, 4096, Layout::Nn, DType::F16), narrow);
    assert!(r.contains("layout tn, not nn"), "{r}");
    let r = reason(&mm(4096, 4096, 4096, Layout::Tn, DType::F16), narrow);
    assert!(r.contains("N <= 128"), "{r}");
    let layer = Workload::from_key("conv2d/n1h56w56c64/k64r1s1/pad0x0,stride1x1,dil1x1/nhwc/f16,f32,f16").unwrap();
    let r = super::conv::WgmmaConv2d.check(&layer, &config(narrow), &sm90).unwrap_err().to_string();
    assert!(r.contains("only wgmma_gemm"), "{r}");
}
