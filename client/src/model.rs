//! `tensortune tune --suite model.json`: a model's workloads (a suite `tensortune.torch.capture` or
//! `tensortune extract` wrote) tuned as one job. The job's trials (`--total-trials`) go where the
//! model gains most: the tracker weighs each workload by how many times the model runs it and caps
//! its curve at the vendor's time (`tensortune_search::schedule`). While the job runs, the progress
//! line is the model's predicted GEMM/conv time ([`ModelTime`]); at the end a table per workload.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use tensortune_kernels::Workload;
use tensortune_proto::pb;

use crate::bench::Suite;
use crate::cli::TuneArgs;
use crate::commands::{self, submit_request};
use crate::report::{ModelTime, fmt_us};
use crate::session::Session;

/// One workload of the model's table.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModelRow {
    /// Workload key.
    pub workload: String,
    /// How many times the model runs it per forward pass (the job's weight).
    pub count: f64,
    /// The vendor library's time, same worker session.
    pub vendor_us: Option<f64>,
    /// The best kernel found.
    pub best_us: Option<f64>,
    /// Its template.
    pub template: String,
    /// `ours` (the best kernel is faster than the vendor's), `vendor`, or `untuned` (no ok record).
    pub winner: String,
    /// count x the faster of the two: its part of the model's time.
    pub model_us: Option<f64>,
    /// Trials it took.
    pub trials: u32,
}

/// What `tune --suite --json` writes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModelReport {
    /// Suite name.
    pub suite: String,
    /// Device class measured on.
    pub device_class: String,
    /// The job.
    pub job: u64,
    /// When (seconds since the epoch).
    pub unix_time: u64,
    /// The command line.
    pub command: String,
    /// The job's trial budget (0: --trials per workload).
    pub total_trials: u32,
    /// Trials finished, over all workloads.
    pub trials: u32,
    /// Submission to the end of the job, seconds: the tuning wall time.
    pub wall_s: f64,
    /// The model's predicted time.
    pub model: ModelTime,
    /// Per workload, largest part of the model first.
    pub rows: Vec<ModelRow>,
}

/// The job's workloads: the suite's distinct keys in order, each weighted by its occurrences
/// (`count` x `batch`, summed over entries of the same key).
pub fn job_workloads(suite: &Suite, workloads: &[Workload]) -> (Vec<Workload>, Vec<f64>) {
    let mut order: Vec<Workload> = Vec::new();
    let mut weights: Vec<f64> = Vec::new();
    let mut at: BTreeMap<String, usize> = BTreeMap::new();
    for (entry, w) in suite.workloads.iter().zip(workloads) {
        let i = *at.entry(w.key()).or_insert_with(|| {
            order.push(*w);
            weights.push(0.0);
            order.len() - 1
        });
        weights[i] += entry.occurrences() as f64;
    }
    (order, weights)
}

/// Most configs a model job proposes at once when --batch is not given: the model tuner's batch.
const MODEL_BATCH: u32 = 16;
/// Fewest: below this a model tuner learns little per batch.
const MIN_BATCH: u32 = 4;

/// The job's batch: --batch when given; else small enough that the budget covers every workload
/// with at least one batch (a job with a budget proposes one whole batch at a time, to one
/// workload: 200 trials in batches of 16 reached only 13 of ResNet-50's 23 workloads on the H100,
/// 2026-11-28), at most the model tuner's 16.
fn batch_size(given: u32, total_trials: u32, workloads: usize) -> u32 {
    if given > 0 || total_trials == 0 {
        return given;
    }
    let share = total_trials / u32::try_from(workloads.max(1)).unwrap_or(u32::MAX);
    share.clamp(MIN_BATCH, MODEL_BATCH)
}

/// Submits the job and follows it; a workload the tracker refuses (no template takes it on the
/// job's GPU) is named and dropped, and the rest submitted again: the model keeps the vendor's op
/// there.
async fn submit_tunable(session: &mut Session, mut request: pb::SubmitJobRequest) -> anyhow::Result<pb::Job> {
    loop {
        let refused = match session.client.submit_job(request.clone()).await {
            Ok(answer) => {
                let answer = answer.into_inner();
                eprintln!("job {} submitted for {}", answer.job_id, answer.device_class);
                return commands::watch(session, answer.job_id).await;
            }
            Err(status) => status,
        };
        let index = refused_workload(refused.message()).filter(|i| *i < request.workloads.len());
        match index {
            Some(i) if refused.code() == tonic::Code::InvalidArgument && request.workloads.len() > 1 => {
                let key = Workload::try_from(&request.workloads[i])
                    .map(|w| w.key())
                    .unwrap_or_else(|_| format!("workloads[{i}]"));
                eprintln!("not tuned (the model keeps the vendor's op): {key}: {}", refused.message());
                request.workloads.remove(i);
                request.weights.remove(i);
            }
            _ => return Err(commands::status_error(refused)),
        }
    }
}

/// `3` from a refusal that reads `invalid workloads[3]...`.
fn refused_workload(message: &str) -> Option<usize> {
    let rest = &message[message.find("workloads[")? + "workloads[".len()..];
    rest[..rest.find(']')?].parse().ok()
}

/// Whether some template takes `w` on some GPU; else every template's reason.
fn tunable(w: &Workload) -> Result<(), String> {
    let templates = tensortune_kernels::registry::templates_for(w.op());
    let reasons: Vec<String> =
        templates.iter().filter_map(|t| t.check_workload(w).err().map(|e| format!("{}: {e}", t.name()))).collect();
    if reasons.len() < templates.len() { Ok(()) } else { Err(reasons.join("; ")) }
}

/// The model's table from the finished (or running) job.
pub fn report(suite: &str, job: &pb::Job, wall_s: f64) -> ModelReport {
    let mut rows: Vec<ModelRow> = job
        .workloads
        .iter()
        .map(|w| {
            let best = w.best.as_ref();
            let m = best.and_then(|b| b.measurement.as_ref()).filter(|m| m.median_us > 0.0);
            let best_us = m.map(|m| m.median_us);
            let vendor_us = m.and_then(|m| m.baseline_us).filter(|v| *v > 0.0);
            let count = if w.weight > 0.0 { w.weight } else { 1.0 };
            let (winner, time) = match (best_us, vendor_us) {
                (Some(b), Some(v)) if b < v => ("ours", Some(b)),
                (Some(_), Some(v)) => ("vendor", Some(v)),
                (Some(b), None) => ("ours", Some(b)),
                (None, _) => ("untuned", None),
            };
            ModelRow {
                workload: w.workload_key.clone(),
                count,
                vendor_us,
                best_us,
                template: best.map(|b| b.template.clone()).unwrap_or_default(),
                winner: winner.to_owned(),
                model_us: time.map(|t| t * count),
                trials: w.trials_done,
            }
        })
        .collect();
    rows.sort_by(|a, b| b.model_us.unwrap_or(0.0).total_cmp(&a.model_us.unwrap_or(0.0)));
    ModelReport {
        suite: suite.to_owned(),
        device_class: job.device_class.clone(),
        job: job.id,
        unix_time: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        total_trials: job.total_trials,
        trials: job.workloads.iter().map(|w| w.trials_done).sum(),
        wall_s,
        model: ModelTime::of(job),
        rows,
    }
}

/// The table as printed.
pub fn fmt_report(r: &ModelReport) -> String {
    let opt = |t: Option<f64>| t.map_or_else(|| "-".to_owned(), fmt_us);
    let mut out = format!("model {} on {} (job {})\n", r.suite, r.device_class, r.job);
    out += &format!(
        "{:<66} {:>6} {:>11} {:>11} {:>7} {:>12}\n",
        "workload", "count", "vendor", "best", "winner", "count x time"
    );
    for row in &r.rows {
        out += &format!(
            "{:<66} {:>6} {:>11} {:>11} {:>7} {:>12}\n",
            row.workload,
            row.count,
            opt(row.vendor_us),
            opt(row.best_us),
            row.winner,
            opt(row.model_us)
        );
    }
    let ours = r.rows.iter().filter(|row| row.winner == "ours").count();
    out += &format!(
        "{}\n{} workloads run our kernel, {} the vendor's; {} trials in {:.1} s ({:.1} trials/s)\n",
        r.model.line(),
        ours,
        r.rows.len() - ours,
        r.trials,
        r.wall_s,
        f64::from(r.trials) / r.wall_s.max(1e-9)
    );
    out
}

/// `tensortune tune --suite`.
pub async fn tune(tracker: Option<&str>, db: &Path, args: &TuneArgs) -> anyhow::Result<()> {
    let Some(path) = &args.suite else { bail!("tune needs a workload (matmul, conv2d) or --suite FILE") };
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let (suite, workloads) = Suite::parse(&text, &path.display().to_string())?;
    let (all, all_weights) = job_workloads(&suite, &workloads);
    let (mut workloads, mut weights) = (Vec::new(), Vec::new());
    for (w, weight) in all.into_iter().zip(all_weights) {
        match tunable(&w) {
            Ok(()) => {
                workloads.push(w);
                weights.push(weight);
            }
            Err(why) => eprintln!("not tuned (the model keeps the vendor's op): {}: {why}", w.key()),
        }
    }
    if workloads.is_empty() {
        bail!("{}: no workload of the suite is one a template takes", path.display());
    }
    let mut session = commands::open(tracker, db, Some(&args.local)).await?;
    let class = args.job.device_class.clone().or_else(|| session.local_class.clone());
    let mut request = submit_request(&workloads, &args.job, class, &format!("model {}", suite.name));
    request.batch_size = batch_size(args.job.batch, args.job.total_trials, workloads.len());
    request.weights = weights;
    eprintln!("{} distinct workloads of {}; {} trials in all", workloads.len(), suite.name, args.job.total_trials);
    let started = Instant::now();
    let result = submit_tunable(&mut session, request).await;
    let wall_s = started.elapsed().as_secs_f64();
    let closed = session.close().await;
    let job = result?;
    closed?;
    let report = report(&suite.name, &job, wall_s);
    print!("{}", fmt_report(&report));
    if let Some(json) = &args.json {
        commands::write_json(json, &report)?;
    }
    if job.state() != pb::JobState::Done {
        bail!("job {} ended {}: {}", job.id, job.state().as_str_name(), job.error);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress(key: &str, weight: f64, best: Option<(f64, f64)>) -> pb::WorkloadProgress {
        pb::WorkloadProgress {
            workload_key: key.to_owned(),
            weight,
            trials_done: 4,
            best: best.map(|(median_us, vendor)| pb::Record {
                template: "wmma_gemm".into(),
                measurement: Some(pb::Measurement { median_us, baseline_us: Some(vendor), ..Default::default() }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_model_time_takes_the_faster_of_ours_and_the_vendor() {
        let job = pb::Job {
            total_trials: 100,
            workloads: vec![
                progress("a", 3.0, Some((8.0, 10.0))),
                progress("b", 1.0, Some((30.0, 20.0))),
                progress("c", 2.0, None),
            ],
            ..Default::default()
        };
        let t = ModelTime::of(&job);
        assert_eq!((t.tuned_us, t.vendor_us, t.measured, t.workloads), (3.0 * 8.0 + 20.0, 3.0 * 10.0 + 20.0, 2, 3));
        assert!(crate::report::progress_message(&job).starts_with("model 44.00 us (vendor 50.00 us, 1.136x)"));
        let r = report("m", &job, 2.0);
        let winners: Vec<(&str, &str)> = r.rows.iter().map(|r| (r.workload.as_str(), r.winner.as_str())).collect();
        assert_eq!(winners, [("a", "ours"), ("b", "vendor"), ("c", "untuned")]);
        assert_eq!(r.rows[0].model_us, Some(24.0));
        assert!(fmt_report(&r).contains("1 workloads run our kernel, 2 the vendor's"));
    }

    #[test]
    fn repeated_keys_merge_and_counts_weigh() {
        let text = r#"{"name": "m", "workloads": [
            {"workload": "matmul/m64n64k64/tn/f16,f32,f16/alpha=1,beta=0", "count": 12},
            {"workload": "matmul/m64n64k64/nn/f16,f32,f16/alpha=1,beta=0", "count": 2, "batch": 8},
            {"workload": "matmul/m64n64k64/tn/f16,f32,f16/alpha=1,beta=0", "epilogue": "bias+gelu"}
        ]}"#;
        let (suite, workloads) = Suite::parse(text, "m.json").unwrap();
        let (order, weights) = job_workloads(&suite, &workloads);
        assert_eq!(order.len(), 2);
        assert_eq!(weights, [13.0, 16.0]);
        assert_eq!(refused_workload("invalid workloads[12].conv2d: no template takes this workload"), Some(12));
        assert_eq!(refused_workload("invalid trials: 0"), None);
        assert_eq!([batch_size(0, 200, 23), batch_size(0, 2000, 23), batch_size(0, 30, 23)], [8, 16, 4]);
        assert_eq!([batch_size(32, 200, 23), batch_size(0, 0, 23)], [32, 0]);
        let zero = text.replace("\"count\": 12", "\"count\": 0");
        let e = Suite::parse(&zero, "m.json").unwrap_err().to_string();
        assert!(e.contains("workloads[0].count is 0"), "{e}");
    }
}
