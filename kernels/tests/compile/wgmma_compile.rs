//! NVRTC compiles what `wgmma_gemm` emits for sm_90a, on the CPU: a sample of over 40 configs
//! spread over every type combination, every layout the instruction takes, a ragged shape and
//! every kind of config (producer, schedule, cluster, persistence, stream-K, epilogue). A serialized
//! wgmma or an ignored setmaxnreg (ptxas C7510/C7511/C7508/C7514) counts as a failure, as in the
//! worker.

use sha2::{Digest, Sha256};
use tensortune_kernels::template::valid_configs;
use tensortune_kernels::wgmma::WgmmaGemm;
use tensortune_kernels::{Config, KernelSpec, Layout, Matmul, Target, Template, Types, Workload};

use crate::common;
use crate::common::{
    assert_all_compile, assert_all_compile_without_spills, header_flag, header_int, wgmma_kind as kind,
};

/// Kinds compiled per workload of the sample: about 23 workloads (types x layouts, each at one of
/// two shapes in turn) of two each reach all 30 kinds, every kind compiled once or twice (see
/// [`common::least_seen_kinds`]); CI compiles about 45 kernels, not a thousand (NVRTC's time is the
/// compile tests' time in CI, and CI's is held under 15 minutes).
const KINDS_PER_WORKLOAD: usize = 2;

#[test]
fn a_sample_of_wgmma_configs_compiles_for_sm90a() {
    let target = Target::sm90();
    let mut specs: Vec<KernelSpec> = Vec::new();
    let mut kinds_seen = std::collections::BTreeMap::new();
    let mut turn = 0;
    // FP8 has its own few kernels (fused_compile), so this sample stays the size it was.
    for (input, acc, outs) in Types::SUPPORTED.iter().filter(|r| !r.0.is_fp8()) {
        for out in *outs {
            let types = Types::new(*input, *acc, Some(*out)).unwrap();
            for layout in Layout::ALL {
                // One shape a type and layout, the two in turn: the aligned one with beta 0, the
                // ragged one reading C.
                let shapes = [(4096, 4096, 4096), (1000, 1000, 1000)];
                for (m, n, k) in shapes.into_iter().skip(turn % 2).take(1) {
                    // Packed types exist in tn only (and wgmma_gemm refuses them below).
                    let Ok(mut mm) = Matmul::new(m, n, k, layout, types) else { continue };
                    mm.beta = if m == 1000 { -1.0 } else { 0.0 };
                    let w = Workload::Matmul(mm);
                    let Ok(valid) = valid_configs(&WgmmaGemm, &w, &target) else { continue };
                    for c in common::least_seen_kinds(&valid, kind, KINDS_PER_WORKLOAD, turn, &mut kinds_seen) {
                        specs.push(WgmmaGemm.generate(&w, &c, &target).unwrap());
                    }
                    turn += 1;
                }
            }
        }
    }
    eprintln!("{} sampled configs of {} kinds", specs.len(), kinds_seen.len());
    assert!(specs.len() >= 40, "only {} sampled configs", specs.len());
    // Every kind of code path: producer x schedule x cluster x persistence x stream-K x epilogue
    // (what the rules allow: ping-pong needs a producer warpgroup, stream-K a persistent
    // cooperative grid).
    assert!(kinds_seen.len() >= 30, "only {} kinds of config: {kinds_seen:?}", kinds_seen.len());
    assert_all_compile(&specs, &target);
}

/// block_m 160 (two 64x160 wgmma row tiles per consumer: 160 accumulator registers, the most the
/// rules allow) compiles for sm_90a without spilling in every kind of config a K-major A allows
/// but stream-K, each kind at one of the operand widths that take layout tn with a 32-bit
/// accumulator (16-bit, 8-bit, tf32), the width turning from one kind to the next so that each
/// width meets a third of the kinds: the accumulators, where spills show, are 32-bit in all three,
/// and the widths differ in shared memory and in the copies. bf16 holds the same registers as f16
/// and an f16 accumulator half of them, so neither is compiled again here (the sample test
/// compiles both). Stream-K is left out: its partial-sum add spills at 160 (the rules refuse it
/// there) and already spilled 70-400 bytes a thread at 128 accumulators or with one inline
/// consumer in v3, which this test does not cover.
#[test]
fn the_160_column_tile_compiles_without_spills() {
    let target = Target::sm90();
    let widths = ["f16,f32,f32", "i8,i32,i32", "tf32,f32,f32"];
    // Per width, one config per kind, preferring two row tiles per consumer (the most registers).
    let mut by_width = Vec::new();
    for types in widths {
        let w = Workload::from_key(&format!("matmul/m8192n8192k8192/tn/{types}/alpha=1,beta=0")).unwrap();
        let valid = valid_configs(&WgmmaGemm, &w, &target).unwrap();
        let mut kinds = std::collections::BTreeMap::new();
        for (_, c) in
            valid.iter().filter(|(_, c)| c.int("block_m").ok() == Some(160) && c.int("stream_k").ok() == Some(0))
        {
            let rows = c.int("block_n").unwrap() / c.int("consumers").unwrap();
            let entry = kinds.entry(kind(c)).or_insert_with(|| c.clone());
            if rows == 128 && entry.int("block_n").unwrap() / entry.int("consumers").unwrap() != 128 {
                *entry = c.clone();
            }
        }
        assert!(kinds.len() >= 8, "{types}: only {} kinds take block_m 160: {:?}", kinds.len(), kinds.keys());
        by_width.push((w, kinds));
    }
    // Every kind any width takes, each compiled once, at the width whose turn it is (or the next
    // that takes it).
    let all: std::collections::BTreeSet<String> = by_width.iter().flat_map(|(_, k)| k.keys().cloned()).collect();
    let mut specs: Vec<KernelSpec> = Vec::new();
    let mut widths_used = std::collections::BTreeSet::new();
    for (i, k) in all.iter().enumerate() {
        let (at, (w, kinds)) = (0..widths.len())
            .map(|j| (i + j) % widths.len())
            .find_map(|j| by_width[j].1.contains_key(k).then_some((j, &by_width[j])))
            .unwrap();
        widths_used.insert(widths[at]);
        specs.push(WgmmaGemm.generate(w, &kinds[k], &target).unwrap());
    }
    assert_eq!(widths_used.len(), widths.len(), "widths compiled: {widths_used:?}");
    eprintln!("{} block_m 160 kernels, one a kind", specs.len());
    assert_all_compile_without_spills(&specs, &target);
}

/// The heights between 64, 128, 160, 192 and 256 (version 19: every multiple of 16) compile for
/// sm_90a without spilling: each new height once, in the config of the most accumulators it takes
/// (rows per consumer), one of four operand widths and layouts in turn (bf16 tt, f16 tn with f32
/// out, i8, tf32), the config among those chosen by a stride so that kinds vary.
#[test]
fn heights_between_the_powers_of_two_compile_without_spills() {
    let target = Target::sm90();
    let shapes = [
        "m776n2312k512/tt/bf16,f32,bf16",
        "m8192n8192k1024/tn/f16,f32,f32",
        "m2048n2048k2048/tn/i8,i32,i32",
        "m1000n1000k1000/tn/tf32,f32,f32",
    ];
    let heights = [32, 48, 80, 96, 112, 144, 176, 208, 224, 240];
    let rows = |c: &Config| c.int("block_n").unwrap() / c.int("consumers").unwrap();
    let mut specs = Vec::new();
    for (i, h) in heights.into_iter().enumerate() {
        let w = Workload::from_key(&format!("matmul/{}/alpha=1,beta=0", shapes[i % shapes.len()])).unwrap();
        let valid = valid_configs(&WgmmaGemm, &w, &target).unwrap();
        let of_h: Vec<&Config> = valid.iter().map(|(_, c)| c).filter(|c| c.int("block_m").ok() == Some(h)).collect();
        let most =
            of_h.iter().map(|c| rows(c)).max().unwrap_or_else(|| panic!("{}: no config of block_m {h}", w.key()));
        let widest: Vec<&Config> = of_h.into_iter().filter(|c| rows(c) == most).collect();
        let c = widest[(i * 97) % widest.len()];
        eprintln!("{} {}", w.key(), c.to_json());
        specs.push(WgmmaGemm.generate(&w, c, &target).unwrap());
    }
    assert_all_compile_without_spills(&specs, &target);
}

/// Version 20's 192-wide tiles (`block_n` 192: three 64-row tiles over three consumer warpgroups,
/// or one computing all three) compile for sm_90a without spills, at the widest `block_m` each
/// allows, with and without a producer warpgroup, the TMA store, a cluster, and stream-K (one
/// consumer: three have no registers for it), for the input widths of 1 and 2 bytes.
#[test]
fn tiles_192_wide_compile_without_spills() {
    let target = Target::sm90();
    let shapes = ["m2824n1720k1368/tn/f16,f32,f16", "m3000n3000k4096/nn/f16,f32,f32", "m2048n2048k2048/tn/i8,i32,i32"];
    // The second pick's widest tile is 208 rows until a rule refuses what ptxas cannot fit in the
    // 128 registers three consumers and a producer start with (C7602 at 208).
    let picks: [(&str, i64, &str, &str, i64, i64); 7] = [
        ("m2824n1720k1368/tn/f16,f32,f16", 3, "warpgroup", "tma", 0, 2),
        ("m2824n1720k1368/tn/f16,f32,f16", 3, "warpgroup", "direct", 0, 1),
        ("m2824n1720k1368/tn/f16,f32,f16", 3, "inline", "direct", 0, 1),
        ("m3000n3000k4096/nn/f16,f32,f32", 3, "warpgroup", "direct", 0, 2),
        ("m3000n3000k4096/nn/f16,f32,f32", 1, "warpgroup", "tma", 1, 1),
        ("m2048n2048k2048/tn/i8,i32,i32", 3, "warpgroup", "tma", 0, 2),
        ("m2048n2048k2048/tn/i8,i32,i32", 1, "inline", "direct", 0, 1),
    ];
    assert!(picks.iter().all(|p| shapes.contains(&p.0)));
    let mut specs = Vec::new();
    for (shape, consumers, producer, epilogue, stream_k, cluster) in picks {
        let w = Workload::from_key(&format!("matmul/{shape}/alpha=1,beta=0")).unwrap();
        let valid = valid_configs(&WgmmaGemm, &w, &target).unwrap();
        let of: Vec<&Config> = valid
            .iter()
            .map(|(_, c)| c)
            .filter(|c| {
                c.int("block_n").ok() == Some(192)
                    && c.int("consumers").ok() == Some(consumers)
                    && c.name("producer").ok() == Some(producer)
                    && c.name("epilogue").ok() == Some(epilogue)
                    && c.int("stream_k").ok() == Some(stream_k)
                    && c.int("cluster").ok() == Some(cluster)
            })
            .collect();
        let widest = of.iter().filter_map(|c| c.int("block_m").ok()).max().unwrap_or_else(|| {
            panic!("{shape}: no valid 192-wide config with {consumers} consumers, {producer}, {epilogue}")
        });
        let c = of.iter().find(|c| c.int("block_m").ok() == Some(widest)).unwrap();
        eprintln!("{} {}", w.key(), c.to_json());
        specs.push(WgmmaGemm.generate(&w, c, &target).unwrap());
    }
    assert_all_compile_without_spills(&specs, &target);
}

/// The `block_m` heights before version 19. The tests of a code path below generate the source of
/// every valid config of theirs to find the ones on the path; the heights v19 added multiply that
/// work by 2.6 (in CI's debug build, minutes) and change none of those paths, so they look among
/// these heights only ([`heights_between_the_powers_of_two_compile_without_spills`] compiles
/// the others), and leave out v20's 192-wide tiles likewise
/// ([`tiles_192_wide_compile_without_spills`]).
const V18_HEIGHTS: [i64; 5] = [64, 128, 160, 192, 256];

/// Of the configs that `needs` (a condition on the knobs, which the path's rule in the plan
/// requires) leaves out, every this many is generated all the same, to check that it is off the
/// path: a guard against the rule changing under the test.
const OFF_PATH_CHECK_EVERY: usize = 16;

/// For each (layout, types) of `cases`, the valid configs of the GEMM `shape` (e.g.
/// `m128n65536k256`) whose generated source `wanted` picks, with their kernels, among the heights
/// of [`V18_HEIGHTS`] and `block_n` other than 192. Only the configs that `needs` keeps are
/// generated (80 KB of source each; generating every valid config took most of these tests' time),
/// and every [`OFF_PATH_CHECK_EVERY`]th of the others, which `wanted` must not pick.
fn generated_where(
    shape: &str,
    cases: &[(&str, &str)],
    needs: impl Fn(&Config) -> bool,
    wanted: impl Fn(&str) -> bool,
) -> Vec<Vec<(Config, KernelSpec)>> {
    let target = Target::sm90();
    cases
        .iter()
        .map(|(layout, types)| {
            let w = Workload::from_key(&format!("matmul/{shape}/{layout}/{types}/alpha=1,beta=0")).unwrap();
            let (on, off): (Vec<Config>, Vec<Config>) = valid_configs(&WgmmaGemm, &w, &target)
                .unwrap()
                .into_iter()
                .map(|(_, c)| c)
                .filter(|c| c.int("block_m").is_ok_and(|h| V18_HEIGHTS.contains(&h)))
                .filter(|c| c.int("block_n").is_ok_and(|w| w != 192))
                .partition(|c| needs(c));
            for c in off.iter().step_by(OFF_PATH_CHECK_EVERY) {
                let spec = WgmmaGemm.generate(&w, c, &target).unwrap();
                assert!(!wanted(&spec.source), "{} {c:?} is on the path but its knobs were left out", w.key());
            }
            on.into_iter()
                .map(|c| {
                    let spec = WgmmaGemm.generate(&w, &c, &target).unwrap();
                    (c, spec)
                })
                .filter(|(_, spec)| wanted(&spec.source))
                .collect()
        })
        .collect()
}

/// Y resident in a one-column grid (every K tile of the user's A loaded once per persistent block)
/// compiles for sm_90a without spills, for each operand width in tn (bf16 holds f16's registers)
/// and for an M-contiguous A (nn), with each producer and schedule: each case compiles every other
/// kind it takes (the even ones, then the odd ones, in turn), so each kind meets half the cases.
#[test]
fn resident_y_kernels_compile_without_spills() {
    let cases = [("tn", "f16,f32,f16"), ("tn", "i8,i32,i32"), ("tn", "tf32,f32,f32"), ("nn", "f16,f16,f16")];
    let mut specs: Vec<KernelSpec> = Vec::new();
    let mut compiled = std::collections::BTreeSet::new();
    let mut all = std::collections::BTreeSet::new();
    // Y stays resident only in a persistent block alone in its cluster.
    let alone = |c: &Config| c.int("persistent").ok() == Some(1) && c.int("cluster").ok() == Some(1);
    let found = generated_where("m128n65536k256", &cases, alone, |src| header_flag(src, "Y_RESIDENT"));
    for (turn, ((layout, types), resident)) in cases.iter().zip(found).enumerate() {
        let mut kinds = std::collections::BTreeMap::new();
        for (c, spec) in resident {
            kinds.entry(kind(&c)).or_insert(spec);
        }
        assert!(kinds.len() >= 4, "{layout} {types}: only {} kinds keep Y resident: {:?}", kinds.len(), kinds.keys());
        all.extend(kinds.keys().cloned());
        for (k, spec) in kinds.into_iter().skip(turn % 2).step_by(2) {
            compiled.insert(k);
            specs.push(spec);
        }
    }
    assert_eq!(compiled, all, "kinds that keep Y resident but were not compiled");
    eprintln!("{} Y-resident kernels of {} kinds", specs.len(), all.len());
    assert_all_compile_without_spills(&specs, &Target::sm90());
}

/// A K split over a cluster (a grid of one tile per block on a deep K: 512x512x8192 has 16 or
/// fewer tiles) compiles for sm_90a without spills, for each operand width in tn (bf16 holds f16's
/// registers), an f16 accumulator and MN-major operands (nn, nt), with every kind of config that
/// splits considered, each at its largest tile a thread, and the two kinds of each case with the
/// most accumulators a thread compiled.
#[test]
fn k_split_kernels_compile_without_spills() {
    let cases = [
        ("tn", "f16,f32,f16"),
        ("tn", "i8,i32,i32"),
        ("tn", "tf32,f32,f32"),
        ("nn", "f16,f16,f16"),
        ("nt", "f16,f32,f32"),
    ];
    // K splits only in a grid of one tile per block (not persistent, not stream-K), with
    // cooperative consumers storing from registers.
    let one_tile_a_block = |c: &Config| {
        c.int("persistent").ok() == Some(0)
            && c.int("stream_k").ok() == Some(0)
            && c.name("schedule").ok() == Some("cooperative")
            && c.name("epilogue").ok() == Some("direct")
    };
    let found = generated_where("m512n512k8192", &cases, one_tile_a_block, |src| header_int(src, "SPLIT") > 1);
    let mut specs: Vec<KernelSpec> = Vec::new();
    let mut splits = std::collections::BTreeSet::new();
    for ((layout, types), split) in cases.iter().zip(found) {
        let mut kinds = std::collections::BTreeMap::new();
        for (c, spec) in split {
            splits.insert(header_int(&spec.source, "SPLIT"));
            // Per kind, the config with the most accumulators a thread (where spills would show,
            // whatever its consumers).
            let acc = c.int("block_m").unwrap() * c.int("block_n").unwrap() / c.int("consumers").unwrap();
            let entry = kinds.entry(kind(&c)).or_insert((0, spec.clone()));
            if acc > entry.0 {
                *entry = (acc, spec);
            }
        }
        assert!(kinds.len() >= 4, "{layout} {types}: only {} kinds split K: {:?}", kinds.len(), kinds.keys());
        // The two kinds with the most accumulators a thread are compiled (spills show there first).
        let mut most: Vec<(i64, KernelSpec)> = kinds.into_values().collect();
        most.sort_by_key(|(acc, _)| std::cmp::Reverse(*acc));
        specs.extend(most.into_iter().take(2).map(|(_, spec)| spec));
    }
    assert!(splits.len() >= 2, "split sizes seen: {splits:?}");
    eprintln!("{} K-split kernels ({splits:?})", specs.len());
    assert_all_compile_without_spills(&specs, &Target::sm90());
}

/// An operand no other tile reads carries the L2 evict-first hint where the data overflows the L2
/// (50 MiB for sm90), and those kernels compile for sm_90a: X (the user's B) in a one-column grid
/// (M fits one tile), Y (the user's A) in a one-row grid (N fits one tile), each K-major (tn) and
/// MN-major (nn), one config per producer, schedule and cluster that has such a grid (every config
/// of those grids is checked for the hint in its source). A grid with both dimensions over one
/// tile reads each operand more than once, and a one-column grid whose data fits in the L2 pushes
/// nothing out: both keep the plain copies. (Spills are not asserted here: three stream-K configs with
/// the inline producer on these grids spill 4-256 bytes with or without the hint.)
#[test]
fn operands_read_once_carry_the_evict_first_hint_and_compile() {
    let mut specs: Vec<KernelSpec> = Vec::new();
    // One tile along M (128) takes a block_m of 128 or more; one along N (64), a block_n of 64 or
    // more (narrower ones swap the view: N becomes the columns) in a cluster of one.
    let one_column = |c: &Config| c.int("block_m").is_ok_and(|h| h >= 128);
    let one_row = |c: &Config| c.int("block_n").is_ok_and(|w| w >= 64) && c.int("cluster").ok() == Some(1);
    type OneTile = fn(&Config) -> bool;
    let grids: [(&str, &str, &str, OneTile); 2] =
        [("m128n65536k512", "TILES_Q", "X_ONCE", one_column), ("m65536n64k512", "TILES_P", "Y_ONCE", one_row)];
    for (shape, axis, hint, one_tile) in grids {
        let cases = [("tn", "f16,f32,f16"), ("nn", "f16,f32,f32")];
        let found = generated_where(shape, &cases, one_tile, |src| header_int(src, axis) == 1);
        for ((layout, types), once) in cases.iter().zip(found) {
            // Every config's source carries the hint; one kernel per producer, schedule and cluster
            // (what decides how the operand is copied) is compiled.
            let mut kinds = std::collections::BTreeMap::new();
            for (c, spec) in once {
                assert!(header_flag(&spec.source, hint), "{shape} {layout} {types} {c:?}: no {hint}");
                let copy_kind: Vec<String> = kind(&c).split('/').take(3).map(str::to_owned).collect();
                kinds.entry(copy_kind).or_insert(spec);
            }
            assert!(kinds.len() >= 2, "{shape} {layout} {types}: only {} kinds have one {axis}", kinds.len());
            specs.extend(kinds.into_values());
        }
    }
    // Both dimensions over one tile (117 MB in all, past the L2): neither operand takes the hint.
    let w = Workload::from_key("matmul/m4096n8192k2048/tn/f16,f32,f16/alpha=1,beta=0").unwrap();
    let target = Target::sm90();
    for (_, c) in valid_configs(&WgmmaGemm, &w, &target).unwrap().into_iter().take(20) {
        let src = WgmmaGemm.generate(&w, &c, &target).unwrap().source;
        assert!(header_int(&src, "TILES_P") > 1 && header_int(&src, "TILES_Q") > 1, "{c:?}");
        assert!(!header_flag(&src, "X_ONCE") && !header_flag(&src, "Y_ONCE"), "{c:?}");
    }
    // 8.5 MB in all: no hint on any config, one column of tiles or not (and `one_column` is one).
    let w = Workload::from_key("matmul/m128n8192k512/tn/f16,f32,f16/alpha=1,beta=0").unwrap();
    let mut columns = 0;
    for (_, c) in valid_configs(&WgmmaGemm, &w, &target).unwrap() {
        let src = WgmmaGemm.generate(&w, &c, &target).unwrap().source;
        if one_column(&c) {
            assert_eq!(header_int(&src, "TILES_Q"), 1, "{c:?}");
            columns += 1;
        }
        assert!(!header_flag(&src, "X_ONCE") && !header_flag(&src, "Y_ONCE"), "{c:?}");
    }
    assert!(columns > 0);
    eprintln!("{} kernels with evict-first copies", specs.len());
    assert_all_compile(&specs, &target);
}

/// The machine code NVRTC makes of each single-block golden kernel (`kernels/tests/data/
/// wgmma_gemm_v*`, whose config has CLUSTER == 1) is the one recorded beside the sources, as a
/// hash of the kernel's `.text` section. A body change meant for clusters alone must leave these
/// alone: v14's first cut added a `__syncwarp` after the producer's tail, a no-op in the source of
/// a single block, and ptxas answered with a YIELD in the producer's barrier waits that made a
/// 7x7 layer 20% slower (H100, 2026-11-27). After an intended change, `TT_UPDATE_GOLDEN=1 cargo
/// test -p tensortune-kernels --test compile wgmma_compile` rewrites the record; its diff names the kernels
/// whose machine code moved.
#[test]
fn single_block_golden_kernels_keep_their_recorded_machine_code() {
    let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let dir = std::fs::read_dir(&data)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with("wgmma_gemm_v"))
        .expect("a wgmma_gemm golden directory");
    let mut sources: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .collect();
    sources.sort();
    let include = common::include_dir();
    let version = tensortune_nvrtc::version().unwrap_or_default();
    let mut lines = vec![format!(
        "# SHA-256 (first 16 hex digits) of each single-block golden kernel's .text (NVRTC {version}, sm_90a);\n\
             # written by TT_UPDATE_GOLDEN=1 cargo test -p tensortune-kernels --test compile wgmma_compile"
    )];
    for path in &sources {
        let source = std::fs::read_to_string(path).unwrap();
        if !source.contains("constexpr int CLUSTER = 1;") {
            continue;
        }
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        let out =
            tensortune_nvrtc::compile(&source, &name, "sm_90a", &include).unwrap_or_else(|e| panic!("{name}: {e}"));
        let text = text_sections(&out.cubin);
        assert!(!text.is_empty(), "{name}: no .text section in the cubin");
        let digest: String = Sha256::digest(&text).iter().take(8).map(|b| format!("{b:02x}")).collect();
        lines.push(format!("{name} {digest}"));
    }
    assert!(lines.len() >= 5, "only {} single-block golden kernels", lines.len() - 1);
    let record = dir.join("single_block_text.txt");
    let now = lines.join("\n") + "\n";
    if std::env::var_os("TT_UPDATE_GOLDEN").is_some() {
        std::fs::write(&record, &now).unwrap();
        return;
    }
    let was = std::fs::read_to_string(&record).unwrap_or_default();
    assert!(
        was == now,
        "the machine code of single-block golden kernels differs from {}:\nwas:\n{was}\nnow:\n{now}\n\
         (a different NVRTC also changes it: the header names the one recorded)",
        record.display()
    );
}

/// The bytes of every `.text*` section of an ELF64 little-endian cubin, in section order.
fn text_sections(elf: &[u8]) -> Vec<u8> {
    let u16_at = |o: usize| u16::from_le_bytes(elf[o..o + 2].try_into().unwrap()) as usize;
    let u32_at = |o: usize| u32::from_le_bytes(elf[o..o + 4].try_into().unwrap()) as usize;
    let u64_at = |o: usize| u64::from_le_bytes(elf[o..o + 8].try_into().unwrap()) as usize;
    assert_eq!(&elf[..5], b"\x7fELF\x02", "not an ELF64 cubin");
    let (shoff, shentsize, shnum, shstrndx) = (u64_at(0x28), u16_at(0x3a), u16_at(0x3c), u16_at(0x3e));
    let section = |i: usize| shoff + i * shentsize;
    let strtab = u64_at(section(shstrndx) + 0x18);
    let mut text = Vec::new();
    for i in 0..shnum {
        let h = section(i);
        let name_at = strtab + u32_at(h);
        let end = elf[name_at..].iter().position(|&b| b == 0).unwrap();
        if elf[name_at..name_at + end].starts_with(b".text") {
            let (offset, size) = (u64_at(h + 0x18), u64_at(h + 0x20));
            text.extend_from_slice(&elf[offset..offset + size]);
        }
    }
    text
}
