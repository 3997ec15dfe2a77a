//! The search bars on the ground truth of today's spaces (`testdata/sweep-h200-union-v14-*.jsonl.gz`:
//! 3,000 random configs of each workload's union space, or the whole space where smaller,
//! measured on an H200 with the templates the product searches: wmma_gemm v6 + wgmma_gemm v14,
//! wmma_conv2d v1 + wgmma_conv2d v14). Leave one workload out, 20 seeds, batches of 16: the
//! model tuner whose prior is every other workload of the file against random search over the
//! whole recorded space; and the cold start, a fresh tracker's: the prior is every other workload
//! of every shipped file (`testdata/*.jsonl.gz`, the record packs `tracker/src/packs.rs` ships),
//! on the held-out split. Replay is deterministic for a seed, so where the cold start's prior is
//! the file's (today, `tuner::covering`), its runs are the file's and are not repeated: it costs
//! the reading of every shipped file once, about 2.7 CPU-s (2026-11-29; both tests 90 CPU-s).
//!
//! The held-out split (`suites/sweeps/union-v14.json`, fixed by position before anything was
//! measured) is never used to choose a constant; the bars are asserted on every workload.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use tensortune_search::replay::{Dataset, Summary, summarise};
use tensortune_search::tuner::Prior;

const SEEDS: u64 = 20;
const BATCH: usize = 16;
const BUDGET: usize = 300;

/// The workloads of the held-out split.
const HELD_OUT: [&str; 8] = [
    "matmul/m512n512k512/nt/",
    "matmul/m8192n8192k1024/tn/",
    "matmul/m2048n11008k4096/tn/",
    "matmul/m2048n2048k2048/tn/i8",
    "matmul/m776n2312k512/tt/",
    "conv2d/n16h28w28c128/k512r1s1/",
    "conv2d/n1h112w112c64/k64r3s3/",
    "conv2d/n64h7w7c2048/k512r1s1/",
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

fn rows(file: &str) -> Vec<Row> {
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
        let cold_prior = held_out(&w.key).then(|| {
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

/// The bars on `runs` (workload key, random's summary, the tuner's): median trials to
/// within 2% of the best <= 32; every workload within 2% by 100 trials; median gain over random
/// to 5% >= 5x, no workload below 2x. Where a bar is not met today, the assertion states what is
/// (and docs/BENCHMARKS.md says by how much): it fails if the tuner gets worse, and must be
/// tightened when it gets better.
fn bars(what: &str, runs: &[(&str, &Summary, &Summary)], over_100: &[&str], below_2x: &[(&str, f64)]) {
    let to_2 = median(runs.iter().map(|r| r.2.to_2 as f64).collect());
    assert!(to_2 <= 32.0, "{what}: median trials to 2% {to_2}");
    let gains = median(runs.iter().map(|r| gain(r.1, r.2)).collect());
    assert!(gains >= 5.0, "{what}: median gain to 5% {gains:.1}x");
    for (key, random, tuner) in runs {
        let floor = below_2x.iter().find(|w| key.starts_with(w.0)).map_or(2.0, |w| w.1);
        if !over_100.iter().any(|w| key.starts_with(w)) {
            assert!(tuner.to_2 <= 100, "{what}: {key}: {} trials to 2%", tuner.to_2);
        }
        let g = gain(random, tuner);
        assert!(g >= floor, "{what}: {key}: gain {g:.2}x (its floor {floor}x)");
    }
}

/// The bars on every workload of `file` with the file's prior, then on its held-out workloads
/// with the cold start's ([`rows`]).
fn check(file: &str, over_100: &[&str], below_2x: &[(&str, f64)]) {
    let rows = rows(file);
    assert!(rows.len() >= 8, "{file}: {} workloads", rows.len());
    let runs: Vec<_> = rows.iter().map(|r| (r.key.as_str(), &r.random, &r.transfer)).collect();
    bars(file, &runs, over_100, below_2x);
    let cold: Vec<_> = rows.iter().filter_map(|r| Some((r.key.as_str(), &r.random, r.cold.as_ref()?))).collect();
    assert!(cold.len() >= 3, "{file}: {} held-out workloads", cold.len());
    bars(&format!("{file}, cold start on the held-out split"), &cold, over_100, below_2x);
}

#[test]
fn matmul_union_v14_meets_the_search_bars() {
    check("sweep-h200-union-v14-matmul.jsonl.gz", MATMUL_OVER_100, MATMUL_BELOW_2X);
}

#[test]
fn conv2d_union_v14_meets_the_search_bars() {
    check("sweep-h200-union-v14-conv2d.jsonl.gz", CONV_OVER_100, CONV_BELOW_2X);
}

/// Workloads that miss a per-workload bar today (20 seeds, 2026-11-29, search9; the cold start the
/// same, its prior being the file's), each a debt that docs/BENCHMARKS.md states, with the gain it
/// must keep (the 2x bar where it is met): the held-out bf16 tt m776n2312k512 needs 124 trials to
/// 2% (197 before `wgmma_gemm`'s `fill_share` column) and gains 2.8x (1.6x). Its 4 configs within
/// 2% (of 3,000) are 128x64 persistent tiles with the TMA epilogue, about two tiles a block; before
/// that column the prior ranked them 299-650th and began with 64x256 tiles in clusters of 2
/// (1.27-1.45x the best). The conv layers meet every bar.
const MATMUL_OVER_100: &[&str] = &["matmul/m776n2312k512/tt/"];
const MATMUL_BELOW_2X: &[(&str, f64)] = &[];
const CONV_OVER_100: &[&str] = &[];
const CONV_BELOW_2X: &[(&str, f64)] = &[];
