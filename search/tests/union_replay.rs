//! The search bars on the ground truth of today's spaces (`testdata/sweep-h200-union-v14-*` and
//! `-union-v19-*.jsonl.gz`: 3,000 random configs of each workload's union space, or the whole space
//! where smaller, measured on H200s with the templates the product searches: wmma_gemm v6 +
//! wgmma_gemm v14 and v19, wmma_conv2d v1 + wgmma_conv2d v14 and v19). Leave one workload out, 20
//! seeds, batches of 16: the model tuner whose prior is every other workload of the file against
//! random search over the whole recorded space; and the cold start, a fresh tracker's: the prior is
//! every other workload of every shipped file (`testdata/*.jsonl.gz`, the record packs
//! `tracker/src/packs.rs` ships), on the held-out split. Replay is deterministic for a seed, so where
//! the cold start's prior is the file's, its runs are the file's and are not repeated.
//!
//! The held-out splits (`suites/sweeps/union-v14.json`, `union-v19.json`, each fixed by position
//! before anything was measured) are never used to choose a constant; the bars are asserted on every
//! workload. No constant of the tuner was chosen on any union-v19 record: its replay is a test of the
//! method on workloads it never saw.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use tensortune_search::replay::{Dataset, Summary, summarise};
use tensortune_search::tuner::Prior;

const SEEDS: u64 = 20;
const BATCH: usize = 16;
/// Trials a tuner run may take. The bars are read at 100 trials (every workload within 2% by then,
/// medians that are 32 or less); a run stops once within 2% and 5% of the best, and only runs that
/// have not got there go on to the budget, so a larger one refines figures the bars do not read, at
/// most of the test's cost (300 took union-v19's replay to about 500 CPU-s in CI's build).
const BUDGET: usize = 128;

/// The workloads of the held-out split.
const HELD_OUT: [&str; 16] = [
    // union-v14
    "matmul/m512n512k512/nt/",
    "matmul/m8192n8192k1024/tn/",
    "matmul/m2048n11008k4096/tn/",
    "matmul/m2048n2048k2048/tn/i8",
    "matmul/m776n2312k512/tt/",
    "conv2d/n16h28w28c128/k512r1s1/",
    "conv2d/n1h112w112c64/k64r3s3/",
    "conv2d/n64h7w7c2048/k512r1s1/",
    // union-v19
    "matmul/m3072n3072k3072/tn/",
    "matmul/m1024n1024k16384/nt/",
    "matmul/m2304n768k1152/tn/i8",
    "matmul/m128n512k256/nn/",
    "matmul/m1536n1536k6144/nt/",
    "conv2d/n24h14w14c384/k768r1s1/",
    "conv2d/n16h7w7c512/k2048r1s1/",
    "conv2d/n8h20w20c160/k320r5s5/",
];

struct Row {
    key: String,
    random: Summary,
    transfer: Summary,
    /// A held-out workload's run with the cold start's prior (every shipped file).
    cold: Option<Summary>,
}

fn gain(random: &Summary, tuner: &Summary) -> f64 {
    random.to_5 as f64 / tuner.to_5.max(1) as f64
}

fn held_out(key: &str) -> bool {
    HELD_OUT.iter().any(|h| key.starts_with(h))
}

fn testdata() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata")
}

/// Every shipped record file, read once for both tests: what a fresh tracker's prior reads.
fn shipped() -> &'static Dataset {
    static DATA: OnceLock<Dataset> = OnceLock::new();
    DATA.get_or_init(|| {
        let mut files: Vec<PathBuf> = std::fs::read_dir(testdata())
            .expect("testdata is listed")
            .map(|e| e.expect("a testdata entry").path())
            .filter(|p| p.to_string_lossy().ends_with(".jsonl.gz"))
            .collect();
        files.sort();
        assert!(files.len() >= 6, "{} shipped files", files.len());
        Dataset::load_all(&files).expect("the shipped records load")
    })
}

/// Whether two priors hold the same rows and targets, from the same workloads, in the same order
/// (bit for bit: a missing column is NaN): a model tuner then proposes the same configs.
fn same(a: &Prior, b: &Prior) -> bool {
    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    a.rows.len() == b.rows.len()
        && bits(&a.y) == bits(&b.y)
        && a.sources.iter().zip(&b.sources).all(|(x, y)| bits(x) == bits(y))
        && a.rows.iter().zip(&b.rows).all(|(x, y)| bits(x) == bits(y))
}

fn rows(file: &str, with_cold: bool) -> Vec<Row> {
    let data = Dataset::load(&testdata().join(file)).expect("the shipped records load");
    let mut out = Vec::new();
    for w in &data.workloads {
        let random = summarise(w, "random", None, SEEDS, w.candidates.len(), BATCH).unwrap();
        let prior = data.prior_for(w);
        assert!(!prior.is_empty(), "{}: no other workload in the file", w.key);
        // The cold start: the same workload's records in every shipped file, every other workload
        // of them as the prior. Replay is deterministic for a seed, so where that prior is the
        // file's (today: the older files' workloads were measured with wmma templates alone, and
        // `tuner::covering` leaves them out), the runs are the same runs and are not repeated.
        let cold_prior = (with_cold && held_out(&w.key)).then(|| {
            let cold = shipped().workloads.iter().find(|c| c.key == w.key).expect("the file is shipped");
            assert_eq!(cold.truth.len(), w.truth.len(), "{}: another file holds records of it", w.key);
            shipped().prior_for(cold)
        });
        let repeat = cold_prior.as_ref().is_some_and(|c| !same(c, &prior));
        let transfer = summarise(w, "model", Some(Arc::new(prior)), SEEDS, BUDGET, BATCH).unwrap();
        let cold = match cold_prior {
            Some(c) if repeat => Some(summarise(w, "model", Some(Arc::new(c)), SEEDS, BUDGET, BATCH).unwrap()),
            Some(_) => Some(transfer.clone()),
            None => None,
        };
        let held = if held_out(&w.key) { "held-out" } else { "" };
        eprintln!(
            "{:<72} {held:<8} space {:>4} random {:>4}/{:<4} transfer {:>3}/{:<3} gain {:.1}x{}",
            w.key,
            w.candidates.len(),
            random.to_5,
            random.to_2,
            transfer.to_5,
            transfer.to_2,
            gain(&random, &transfer),
            cold.as_ref().map_or(String::new(), |c| format!(
                "; cold start {:>3}/{:<3} gain {:.1}x ({})",
                c.to_5,
                c.to_2,
                gain(&random, c),
                if repeat { "its own prior" } else { "the file's prior" }
            ))
        );
        out.push(Row { key: w.key.clone(), random, transfer, cold });
    }
    out
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// What a file's replay falls short of today, each a debt that docs/BENCHMARKS.md states: the
/// median trials to 2% it reaches where that is above the bar's 32 (for the file's prior, then for
/// the cold start on its held-out split), the workloads that need more than 100 trials to 2%, and
/// the gain to 5% a workload below 2x must keep. The assertions fail if the tuner gets worse, and
/// must be tightened when it gets better.
struct Debts {
    median_to_2: f64,
    /// `None`: the file's held-out split is not run from the cold start here (see [`MATMUL_V14`]).
    cold_median_to_2: Option<f64>,
    over_100: &'static [&'static str],
    below_2x: &'static [(&'static str, f64)],
}

/// The bars on `runs` (workload key, random's summary, the tuner's): median trials to
/// within 2% of the best <= 32 (or the median `debts` states); every workload within 2% by 100
/// trials; median gain over random to 5% >= 5x, no workload below 2x.
fn bars(what: &str, runs: &[(&str, &Summary, &Summary)], median_floor: f64, debts: &Debts) {
    let to_2 = median(runs.iter().map(|r| r.2.to_2 as f64).collect());
    assert!(to_2 <= median_floor.max(32.0), "{what}: median trials to 2% {to_2}");
    let gains = median(runs.iter().map(|r| gain(r.1, r.2)).collect());
    assert!(gains >= 5.0, "{what}: median gain to 5% {gains:.1}x");
    for (key, random, tuner) in runs {
        let floor = debts.below_2x.iter().find(|w| key.starts_with(w.0)).map_or(2.0, |w| w.1);
        if !debts.over_100.iter().any(|w| key.starts_with(w)) {
            assert!(tuner.to_2 <= 100, "{what}: {key}: {} trials to 2%", tuner.to_2);
        }
        let g = gain(random, tuner);
        assert!(g >= floor, "{what}: {key}: gain {g:.2}x (its floor {floor}x)");
    }
}

/// The bars on every workload of `file` with the file's prior, then (where `debts` has a cold start)
/// on its held-out workloads with the cold start's ([`rows`]).
fn check(file: &str, debts: &Debts) {
    let rows = rows(file, debts.cold_median_to_2.is_some());
    assert!(rows.len() >= 8, "{file}: {} workloads", rows.len());
    let runs: Vec<_> = rows.iter().map(|r| (r.key.as_str(), &r.random, &r.transfer)).collect();
    bars(file, &runs, debts.median_to_2, debts);
    let Some(cold_median) = debts.cold_median_to_2 else { return };
    let cold: Vec<_> = rows.iter().filter_map(|r| Some((r.key.as_str(), &r.random, r.cold.as_ref()?))).collect();
    assert!(cold.len() >= 3, "{file}: {} held-out workloads", cold.len());
    bars(&format!("{file}, cold start on the held-out split"), &cold, cold_median, debts);
}

// union-v14 samples v14's space, a part of today's: its replay (75 CPU-s) runs on demand,
// `cargo test -p tensortune-search --release --test union_replay -- --ignored`, so that CI (2 cores,
// 15 minutes) carries the current space's, union-v19's, whole.
#[test]
#[ignore = "the previous space's ground truth: run with --ignored (75 CPU-s); CI asserts union-v19's"]
fn matmul_union_v14_meets_the_search_bars() {
    check("sweep-h200-union-v14-matmul.jsonl.gz", &MATMUL_V14);
}

#[test]
#[ignore = "the previous space's ground truth: run with --ignored; CI asserts union-v19's"]
fn conv2d_union_v14_meets_the_search_bars() {
    check("sweep-h200-union-v14-conv2d.jsonl.gz", &CONV_V14);
}

#[test]
fn matmul_union_v19_meets_the_search_bars() {
    check("sweep-h200-union-v19-matmul.jsonl.gz", &MATMUL_V19);
}

#[test]
fn conv2d_union_v19_meets_the_search_bars() {
    check("sweep-h200-union-v19-conv2d.jsonl.gz", &CONV_V19);
}

/// union-v14's debts (20 seeds, 2026-11-29, search9), each a debt that docs/BENCHMARKS.md states, with the gain it
/// must keep (the 2x bar where it is met): the held-out bf16 tt m776n2312k512 needs 124 trials to
/// 2% (197 before `wgmma_gemm`'s `fill_share` column) and gains 2.8x (1.6x); since the prior's
/// offset (search18) 101, gain 5.8x. Its 4 configs within
/// 2% (of 3,000) are 128x64 persistent tiles with the TMA epilogue, about two tiles a block; before
/// that column the prior ranked them 299-650th and began with 64x256 tiles in clusters of 2
/// (1.27-1.45x the best). The conv layers meet every bar.
///
/// The cold start is asserted on the newest ground truth's held-out split (union-v19's) alone: with
/// union-v19 shipped, a union-v14 workload's cold-start prior is no longer its file's, so its runs
/// would be repeated on a prior of every shipped file, about 100 CPU-s more of CI. Measured on
/// 2026-11-29 all the same (docs/BENCHMARKS.md): m776 93 trials to 2%, m2048n11008k4096 89, the
/// held-out matmul median 9, conv 4.
const MATMUL_V14: Debts =
    Debts { median_to_2: 32.0, cold_median_to_2: None, over_100: &["matmul/m776n2312k512/tt/"], below_2x: &[] };
const CONV_V14: Debts = Debts { median_to_2: 32.0, cold_median_to_2: None, over_100: &[], below_2x: &[] };

/// union-v19 (2026-11-29, 20 seeds, the tuner of 70dce6d): the first replay of workloads none of
/// whose records any constant of the tuner was chosen on, in v19's larger space (its new heights
/// win 8 of the 24). Matmul with the file's prior: median 14 trials to 2%, but the two held-out
/// workloads whose best is a small tile, m128n512k256 (a wmma 32x32 tile) and i8 m2304n768k1152
/// (a 128x64 ping-pong), are not within 2% by 300 trials (128 in this test) (gains 6.9x and 2.7x); their cold start
/// (every shipped file's prior) reaches it in 65 and 83, and the held-out cold-start median is 42
/// (83, 42, 2, 65, 3). Conv: median 54 with the file's prior (n4h64w64c128 stride 2 177 trials,
/// n1h160w160c32 stride 2 129 with a gain of 1.8x, its best a wmma tile; n2h28w28c384 114); cold
/// start on the held-out split 85, 49, 50 (median 50).
///
/// Since the templates in contention (`tuner::contending`, search16; this test's budget of 128, 20
/// seeds): the development split's n1h160w160c32 129 -> 97 trials to 2% (gain 1.8x -> 2.8x) and
/// n2h28w28c384 114 -> 99; n4h64w64c128 still past 128. The file's median is 55 (54 before): the
/// held-out i8 n16h7w7c512 54 -> 55 sits at it. Cold start 69, 49, 50 (median 50). Matmul's
/// held-out cold start m128n512k256 65 -> 109 trials to 2% (28 to 5%, 65 before), the median 42.
///
/// Since local moves (`tuner::local_moves`, search17: once a batch of trials finds nothing faster,
/// half of the greedy picks go to configs a knob or two from the fastest measured): conv's
/// development split n4h64w64c128 past 128 -> 51 trials to 2%, n2h28w28c384 99 -> 52,
/// n1h160w160c32 97 -> 81 (dev median 97 -> 51); the file's median 55 -> 52. Held out (read after
/// the constants were chosen): n24h14w14c384 43 -> 35, but n8h20w20c160 49 -> 65 and i8
/// n16h7w7c512 55 -> 59; cold start 75 (69 before), 49, 50 (median 50). Matmul: dev m3584n896k2560
/// tt 59 -> 73 (gain 6.0x -> 4.3x), m8192n2048k2048 81 -> 72, m4096n4096k512 69 -> 66; medians
/// unchanged; held-out cold start i8 m2304n768k1152 83 -> 73.
///
/// Since the prior's offset (`tuner`'s `PriorOffset`: a workload's own model fits what its
/// outcomes add to the prior's prediction) and `wgmma_conv2d`'s work columns (search18, chosen on
/// the development splits, no constant): conv's development split n4h64w64c128 51 -> 12 trials to
/// 2% (dev median 51 -> 12), the others within a few trials. Held out (read after): n24h14w14c384
/// 35 -> 10, i8 n16h7w7c512 59 -> 40 (gain 13.0x -> 5.3x), but n8h20w20c160 (5x5) 65 -> past 128
/// (gain 7.1x -> 2.0x): its best configs (stream-K, one consumer, 160-192x64) are three or four
/// knobs from the 160x128 cooperative tiles the search settles on at 1.11x, ranked 190th and on by
/// the prior (258th before), and it reached them before in about half of its seeds only. The file's median 52 ->
/// 40; cold start 72, 27, past 128 (median 50 -> 72). Matmul: dev m384n12288k768 55 -> 22,
/// m3584n896k2560 73 -> 50, m8192n2048k2048 72 -> 55 (medians unchanged); held out m128n512k256
/// 129 -> 124; cold start m128n512k256 109 -> 49, m1024n1024k16384 42 -> 51, i8 m2304n768k1152 73
/// -> 72 (median 42 -> 49).
const MATMUL_V19: Debts = Debts {
    median_to_2: 32.0,
    cold_median_to_2: Some(49.0),
    over_100: &["matmul/m128n512k256/nn/", "matmul/m2304n768k1152/tn/i8"],
    below_2x: &[],
};
const CONV_V19: Debts = Debts {
    median_to_2: 40.0,
    cold_median_to_2: Some(72.0),
    over_100: &["conv2d/n8h20w20c160/k320r5s5/"],
    below_2x: &[],
};
