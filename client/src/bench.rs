//! `tensortune bench`: tunes each workload of a suite, one job after another, and reports the best
//! kernel against the vendor library, the achieved rate, and how fast the service measured.
//!
//! In embedded mode the bench uses a fresh database (next to its JSON output), so every number is
//! a measurement of this run, never a record reused from an earlier one.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use tensortune_kernels::Workload;
use tensortune_proto::pb;

use crate::cli::{BenchArgs, JobArgs};
use crate::commands::{self, submit_and_watch, submit_request};
use crate::report::{self, JobView};
use crate::session::Session;

/// The suite shipped with the binary (`suites/default.json`).
pub const DEFAULT_SUITE: &str = include_str!("../../suites/default.json");
/// The suite of `bench --throughput` (`suites/throughput.json`).
pub const THROUGHPUT_SUITE: &str = include_str!("../../suites/throughput.json");

/// A suite file.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Suite {
    /// Suite name.
    pub name: String,
    /// What it covers.
    #[serde(default)]
    pub description: String,
    /// The workloads, in order.
    pub workloads: Vec<SuiteEntry>,
}

/// One workload of a suite.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SuiteEntry {
    /// Workload key (`tensortune_kernels::Workload::key`).
    pub workload: String,
    /// Trials for this workload; default: --trials.
    #[serde(default)]
    pub trials: Option<u32>,
    /// How many times a model runs it per forward pass (a captured or extracted suite); default 1.
    /// `tune --suite` weighs the workload by it and sums the model's time with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// Matrices of a batched matmul (each one the workload's shape); default 1. The job tunes one
    /// matrix and counts it `batch` times.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<u64>,
    /// What follows the op in the model and could be fused into it (`bias`, `relu`, `gelu`,
    /// `bias+relu`, ...), recorded for the reader: what `extract` finds after an ONNX Gemm or
    /// MatMul, a batched product's activation from `capture`. What is tuned is the key's epilogue
    /// (`capture` puts a linear layer's and a conv's there: `alpha=1,beta=1,epi=bias`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epilogue: Option<String>,
    /// Where the model runs it (module names or ONNX node names), for the reader.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ops: Vec<String>,
}

impl SuiteEntry {
    /// How many times a model runs the workload's shape per forward pass: `count` x `batch`.
    pub fn occurrences(&self) -> u64 {
        self.count.unwrap_or(1).saturating_mul(self.batch.unwrap_or(1))
    }
}

impl Suite {
    /// Parses and validates a suite: every key must be a valid workload.
    pub fn parse(text: &str, origin: &str) -> anyhow::Result<(Suite, Vec<Workload>)> {
        let suite: Suite = serde_json::from_str(text).with_context(|| format!("{origin} is not a suite file"))?;
        if suite.workloads.is_empty() {
            bail!("{origin}: the suite has no workloads");
        }
        let workloads = suite
            .workloads
            .iter()
            .enumerate()
            .map(|(i, e)| {
                for (field, v) in [("count", e.count), ("batch", e.batch)] {
                    if v == Some(0) {
                        bail!(
                            "{origin}: workloads[{i}].{field} is 0; it counts occurrences, at least 1 (or leave it out)"
                        );
                    }
                }
                Workload::from_key(&e.workload).map_err(|err| anyhow::anyhow!("{origin}: workloads[{i}]: {err}"))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok((suite, workloads))
    }
}

/// One row of the bench table.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BenchRow {
    /// Workload key.
    pub workload: String,
    /// Best kernel time.
    pub best_us: Option<f64>,
    /// Vendor time, same method, same run.
    pub vendor_us: Option<f64>,
    /// Vendor call.
    pub vendor_kind: String,
    /// The algorithm the vendor ran where it beat the best (`report::vendor_edge`); empty where
    /// the best won or the vendor does not say.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub vendor_beat_with: String,
    /// vendor / best.
    pub speedup: Option<f64>,
    /// Achieved TFLOP/s of the best kernel.
    pub tflops: Option<f64>,
    /// Trials finished.
    pub trials: u32,
    /// Of which reused from the store.
    pub reused: u32,
    /// Trials per status.
    pub status_counts: std::collections::BTreeMap<String, u32>,
    /// Submission to end of the job, seconds.
    pub wall_s: f64,
    /// Measured (not reused) configs per second of wall time.
    pub configs_per_s: f64,
    /// The job.
    pub job: JobView,
}

/// The JSON a bench writes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BenchReport {
    /// Suite name.
    pub suite: String,
    /// Device class measured on.
    pub device_class: String,
    /// When (seconds since the epoch).
    pub unix_time: u64,
    /// The command line.
    pub command: String,
    /// One row per workload.
    pub rows: Vec<BenchRow>,
}

fn row(workload: &Workload, job: &pb::Job, wall_s: f64) -> BenchRow {
    let view = JobView::from(job);
    let w = view.workloads.first().cloned();
    let best = w.as_ref().and_then(|w| w.best.clone());
    let trials = w.as_ref().map_or(0, |w| w.trials_done);
    let reused = w.as_ref().map_or(0, |w| w.reused);
    BenchRow {
        workload: workload.key(),
        best_us: best.as_ref().map(|b| b.median_us),
        vendor_us: best.as_ref().and_then(|b| b.baseline_us),
        vendor_kind: best.as_ref().map(|b| b.baseline_kind.clone()).unwrap_or_default(),
        vendor_beat_with: best.as_ref().and_then(report::vendor_edge).unwrap_or_default().to_owned(),
        speedup: best.as_ref().filter(|b| b.speedup > 0.0).map(|b| b.speedup),
        tflops: best.as_ref().map(|b| b.tflops),
        trials,
        reused,
        status_counts: w.map(|w| w.status_counts).unwrap_or_default(),
        wall_s,
        configs_per_s: if wall_s > 0.0 { (trials - reused) as f64 / wall_s } else { 0.0 },
        job: view,
    }
}

/// The table printed at the end; where the vendor beat the best, the algorithm it ran follows.
pub fn table(rows: &[BenchRow]) -> String {
    let opt = |v: Option<f64>, f: &dyn Fn(f64) -> String| v.map(f).unwrap_or_else(|| "-".into());
    let mut s = format!(
        "{:<52} {:>11} {:>11} {:>8} {:>8} {:>7} {:>8} {:>7}  {}\n",
        "workload", "best", "vendor", "speedup", "TFLOP/s", "trials", "wall", "cfg/s", "template"
    );
    for r in rows {
        let template = r.job.workloads.first().and_then(|w| w.best.as_ref()).map_or("-", |b| b.template.as_str());
        s.push_str(&format!(
            "{:<52} {:>11} {:>11} {:>8} {:>8} {:>7} {:>7.1}s {:>7.1}  {template}\n",
            r.workload,
            opt(r.best_us, &report::fmt_us),
            opt(r.vendor_us, &report::fmt_us),
            opt(r.speedup, &|v| format!("{v:.2}x")),
            opt(r.tflops, &|v| format!("{v:.1}")),
            r.trials,
            r.wall_s,
            r.configs_per_s
        ));
        if !r.vendor_beat_with.is_empty() {
            s.push_str(&format!("{:<52} vendor ran: {}\n", "", r.vendor_beat_with));
        }
    }
    s
}

/// The database an embedded bench uses: next to the JSON output, recreated each run.
fn fresh_db(json: &Path) -> anyhow::Result<PathBuf> {
    let db = json.with_extension("db");
    for suffix in ["", "-wal", "-shm"] {
        let p = PathBuf::from(format!("{}{suffix}", db.display()));
        if p.exists() {
            std::fs::remove_file(&p)
                .with_context(|| format!("cannot remove the old bench database {}", p.display()))?;
        }
    }
    Ok(db)
}

/// The job `bench --throughput` runs for `job`: configs per second is a property of the measuring
/// pipeline, so the tuner is random unless named (random proposals keep the pipeline full, where a
/// model waits for each batch before the next) and there are no finalists unless asked for (their
/// half-second re-measurements are not tuning; at 4096^3 they took longer than 200 trials), and
/// no energy is read.
fn throughput_job(job: &JobArgs) -> JobArgs {
    let mut job = job.clone();
    job.tuner.get_or_insert_with(|| "random".into());
    job.finalists.get_or_insert(0);
    // The energy window is a second or more a trial: it would measure NVML, not the pipeline.
    job.no_energy = true;
    job
}

/// `tensortune bench`. Embedded, it uses `db` when one was named (so earlier records of the
/// same configs are reused, as in any job) and otherwise a fresh database beside its JSON.
pub async fn run(tracker: Option<&str>, db: Option<&Path>, args: &BenchArgs) -> anyhow::Result<()> {
    let (text, origin) = match &args.suite {
        Some(p) => (
            std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))?,
            p.display().to_string(),
        ),
        None if args.throughput => (THROUGHPUT_SUITE.to_owned(), "the throughput suite".to_owned()),
        None => (DEFAULT_SUITE.to_owned(), "the default suite".to_owned()),
    };
    let (suite, workloads) = Suite::parse(&text, &origin)?;
    let selected: Vec<(usize, &Workload)> = workloads
        .iter()
        .enumerate()
        .filter(|(_, w)| args.filter.as_ref().is_none_or(|f| w.key().contains(f.as_str())))
        .collect();
    if selected.is_empty() {
        bail!("--filter {:?} matches no workload of {origin}", args.filter.as_deref().unwrap_or(""));
    }
    let mut session = match tracker {
        Some(url) => Session::remote(url).await?,
        None => {
            let db = match db {
                Some(db) => db.to_path_buf(),
                None => fresh_db(&args.json)?,
            };
            eprintln!("bench database: {}", db.display());
            let mut local = args.local.clone();
            // A throughput figure must include the compiles: no image may come from an earlier run.
            local.no_disk_cache |= args.throughput;
            Session::embedded(&db, Some(&local)).await?
        }
    };
    let class = args.job.device_class.clone().or_else(|| session.local_class.clone());
    let mut rows = Vec::new();
    let mut outcome = Ok(());
    for (i, w) in selected {
        let mut job = if args.throughput { throughput_job(&args.job) } else { args.job.clone() };
        if let Some(t) = suite.workloads[i].trials {
            job.trials = t;
        }
        eprintln!("[{}/{}] {}", rows.len() + 1, suite.workloads.len(), w.key());
        let start = Instant::now();
        match submit_and_watch(
            &mut session,
            submit_request(&[*w], &job, class.clone(), &format!("bench {}", suite.name)),
        )
        .await
        {
            Ok(j) => rows.push(row(w, &j, start.elapsed().as_secs_f64())),
            Err(e) => {
                outcome = Err(e);
                break;
            }
        }
    }
    let device_class = rows.first().map(|r| r.job.device_class.clone()).unwrap_or_default();
    session.close().await?;
    let report = BenchReport {
        suite: suite.name.clone(),
        device_class,
        unix_time: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        rows,
    };
    commands::write_json(&args.json, &report)?;
    println!("suite {} on {}", report.suite, report.device_class);
    print!("{}", table(&report.rows));
    println!("written to {}", args.json.display());
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_throughput_job_tunes_at_random_without_finalists_unless_told_otherwise() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            job: JobArgs,
        }
        let job =
            |args: &[&str]| throughput_job(&Cli::parse_from(std::iter::once("t").chain(args.iter().copied())).job);
        let plain = job(&[]);
        assert_eq!((plain.tuner.as_deref(), plain.finalists), (Some("random"), Some(0)));
        let told = job(&["--tuner", "model", "--finalists", "2", "--trials", "7"]);
        assert_eq!((told.tuner.as_deref(), told.finalists, told.trials), (Some("model"), Some(2), 7));
    }

    #[test]
    fn the_table_names_the_vendor_algorithm_under_a_row_the_vendor_won() {
        let w = Workload::from_key("matmul/m512n64k512/nn/f16,f32,f32/alpha=1,beta=0").unwrap();
        let job = |vendor_us: f64| pb::Job {
            workloads: vec![pb::WorkloadProgress {
                best: Some(pb::Record {
                    template: "wgmma_gemm".into(),
                    speedup: vendor_us / 12.0,
                    measurement: Some(pb::Measurement {
                        median_us: 12.0,
                        baseline_us: Some(vendor_us),
                        baseline_kind: "cublasLt heuristic #1 of 8".into(),
                        vendor_algo: "algo=66 tile=128x64x64 stages=4".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        };
        let (lost, won) = (row(&w, &job(11.5), 1.0), row(&w, &job(13.0), 1.0));
        assert_eq!(lost.vendor_beat_with, "algo=66 tile=128x64x64 stages=4");
        assert_eq!(won.vendor_beat_with, "", "the best won: nothing to show");
        let text = table(&[lost, won]);
        assert_eq!(text.matches("vendor ran: algo=66 tile=128x64x64 stages=4").count(), 1, "{text}");
    }

    #[test]
    fn throughput_suite_is_valid() {
        let (_, workloads) = Suite::parse(THROUGHPUT_SUITE, "throughput").unwrap();
        assert_eq!(workloads.len(), 2);
    }

    #[test]
    fn default_suite_is_valid_and_complete() {
        let (suite, workloads) = Suite::parse(DEFAULT_SUITE, "default").unwrap();
        assert_eq!(suite.workloads.len(), workloads.len());
        let keys: Vec<String> = workloads.iter().map(|w| w.key()).collect();
        for want in ["m512n64k512/nn/f16", "m4096n4096k4096/nn/bf16", "m512n16k512/tn/i8"] {
            assert!(keys.iter().any(|k| k.contains(want)), "{want} missing");
        }
        assert!(workloads.iter().any(|w| matches!(w, Workload::Matmul(m) if m.m % 16 != 0 && m.n % 16 != 0)));
    }

    #[test]
    fn conv_suite_holds_the_conv_bars_layers_with_a_valid_space() {
        let (_, workloads) = Suite::parse(include_str!("../../suites/conv.json"), "conv").unwrap();
        assert_eq!(workloads.len(), 13);
        for w in &workloads {
            assert!(matches!(w, Workload::Conv2d(_)), "{}", w.key());
            // Each conv template of sm_90 has a real space for every layer.
            for name in ["wmma_conv2d", "wgmma_conv2d"] {
                let template = tensortune_kernels::registry::by_name(name).unwrap();
                let valid = template.valid_indices(w, &tensortune_kernels::Target::sm90()).unwrap();
                assert!(valid.len() >= 100, "{} with {name}: {} valid configs", w.key(), valid.len());
            }
        }
    }

    #[test]
    fn cnn_suite_holds_resnet50s_fused_layers_with_a_wgmma_space() {
        let (_, workloads) = Suite::parse(include_str!("../../suites/cnn.json"), "cnn").unwrap();
        assert_eq!(workloads.len(), 52, "26 distinct (layer, epilogue) pairs at N=1 and N=32");
        let template = tensortune_kernels::registry::by_name("wgmma_conv2d").unwrap();
        let mut block_ends = 0;
        for w in &workloads {
            let Workload::Conv2d(c) = w else { panic!("{}", w.key()) };
            assert!(c.epilogue.bias && [1, 32].contains(&c.n), "{}", w.key());
            block_ends += usize::from(c.residual);
            let valid = template.valid_indices(w, &tensortune_kernels::Target::sm90()).unwrap();
            assert!(valid.len() >= 100, "{}: {} valid configs", w.key(), valid.len());
        }
        assert_eq!(block_ends, 2 * 7, "per N: layer1's block end, and the downsample's and last 1x1's of layers 2-4");
    }

    #[test]
    fn types_conv_suite_pairs_exact_f32_and_tf32_layers() {
        use tensortune_kernels::DType;
        let (_, workloads) = Suite::parse(include_str!("../../suites/types-conv.json"), "types-conv").unwrap();
        assert_eq!(workloads.len(), 6);
        let inputs: Vec<_> = workloads.iter().map(|w| w.types().input).collect();
        assert_eq!(inputs.iter().filter(|d| **d == DType::F32).count(), 3);
        assert_eq!(inputs.iter().filter(|d| **d == DType::Tf32).count(), 3);
        // Every tf32 layer has a real space in both tensor-core conv templates on sm_90.
        for w in workloads.iter().filter(|w| w.types().input == DType::Tf32) {
            for name in ["wmma_conv2d", "wgmma_conv2d"] {
                let template = tensortune_kernels::registry::by_name(name).unwrap();
                let valid = template.valid_indices(w, &tensortune_kernels::Target::sm90()).unwrap();
                assert!(valid.len() >= 50, "{} with {name}: {} valid configs", w.key(), valid.len());
            }
        }
    }

    #[test]
    fn every_shipped_suite_parses_and_has_a_space_on_sm90() {
        // User suites at the top, held-out and sweep suites in their own folders.
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../suites");
        let mut paths = Vec::new();
        for sub in ["", "heldout", "sweeps"] {
            for entry in std::fs::read_dir(dir.join(sub)).unwrap() {
                let path = entry.unwrap().path();
                if path.extension().is_some_and(|e| e == "json") {
                    paths.push(path);
                }
            }
        }
        let mut seen = 0;
        for path in paths {
            let text = std::fs::read_to_string(&path).unwrap();
            let (_, workloads) = Suite::parse(&text, &path.display().to_string()).unwrap();
            for w in &workloads {
                let spaces = tensortune_kernels::registry::all()
                    .iter()
                    .filter_map(|t| t.valid_indices(w, &tensortune_kernels::Target::sm90()).ok())
                    .map(|v| v.len())
                    .sum::<usize>();
                assert!(spaces > 0, "{}: {} has no valid config on sm_90", path.display(), w.key());
            }
            seen += 1;
        }
        assert!(seen >= 10, "{seen} suites in {}", dir.display());
    }

    #[test]
    fn pointwise_heldout_layers_overflow_an_h200_l2() {
        // The suite tests the read-once L2 hint, which applies only past the L2 (60 MiB on an H200).
        let text = include_str!("../../suites/heldout/conv-pointwise-heldout.json");
        let (_, workloads) = Suite::parse(text, "conv-pointwise-heldout").unwrap();
        assert_eq!(workloads.len(), 6);
        for w in &workloads {
            let Workload::Conv2d(c) = w else { panic!("{} is not a conv", w.key()) };
            assert_eq!((c.r, c.s, c.stride), (1, 1, (1, 1)), "{}", w.key());
            let (e_in, e_out) = (c.types.input.bytes() as u64, c.types.output.bytes() as u64);
            let pixels = c.n * c.h * c.w;
            let bytes = pixels * c.c * e_in + c.k * c.c * e_in + pixels * c.k * e_out;
            assert!(bytes > 60 << 20, "{}: {bytes} bytes fit in 60 MiB", w.key());
        }
    }

    #[test]
    fn bad_suites_are_explained() {
        let e = Suite::parse(
            r#"{"name":"x","workloads":[{"workload":"matmul/m0n1k8/nn/f16,f32,f32/alpha=1,beta=0"}]}"#,
            "s.json",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("workloads[0]") && e.contains("invalid m"), "{e}");
        assert!(Suite::parse("{}", "s.json").is_err());
    }
}
