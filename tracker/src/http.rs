//! The tracker's read-only HTTP side (`--http ADDR`): a dashboard page, the JSON it polls, and
//! Prometheus metrics. Nothing here changes state; everything is read from the store (and a few
//! counters kept in memory) when asked, so the page and the metrics never disagree with gRPC.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use serde::Serialize;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::jobs::JobView;
use crate::model::{JobState, Status, now_ms};
use crate::store::{self, on};
use crate::tracker::Tracker;

/// Jobs the dashboard lists (the most recent).
const DASHBOARD_JOBS: u32 = 50;

/// The page; it polls the JSON below.
const DASHBOARD: &str = include_str!("dashboard.html");

/// Serves the HTTP side on `listener` until `stop`.
pub(crate) async fn serve(tracker: Arc<Tracker>, listener: TcpListener, stop: CancellationToken) -> anyhow::Result<()> {
    let app = Router::new()
        .route("/", get(|| async { Html(DASHBOARD) }))
        .route("/metrics", get(metrics))
        .route("/api/jobs", get(jobs))
        .route("/api/jobs/{id}/trials", get(trials))
        .route("/api/workers", get(workers))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(tracker);
    axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned()).await?;
    Ok(())
}

/// 200 when the tracker can do its work (every migration applied, the database writable), else
/// 503 with the reason.
async fn readyz(State(tracker): State<Arc<Tracker>>) -> Response {
    match crate::health::ready(&tracker).await {
        Ok(()) => "ready\n".into_response(),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {why}\n")).into_response(),
    }
}

/// A failure as a plain-text 500 (the detail is logged).
fn failed(e: impl std::fmt::Display) -> Response {
    tracing::warn!(error = %e, "http request failed");
    (StatusCode::INTERNAL_SERVER_ERROR, "the tracker could not read its database; see its log").into_response()
}

#[derive(Serialize)]
struct JobJson {
    id: i64,
    label: String,
    state: &'static str,
    template: String,
    tuner: &'static str,
    device_class: String,
    created_ms: i64,
    trials_done: u64,
    trials_target: u64,
    error: String,
    /// `burst` or `sustained`.
    regime: String,
    /// `time`, `energy` or `edp`.
    objective: String,
    /// The least-energy pick within this fraction of the fastest (0: off).
    max_slowdown: f64,
    workloads: Vec<WorkloadJson>,
}

#[derive(Serialize)]
struct WorkloadJson {
    idx: u32,
    key: String,
    state: &'static str,
    trials_done: u32,
    trials_target: u32,
    best_us: Option<f64>,
    vendor_us: Option<f64>,
    speedup: Option<f64>,
    best_template: Option<String>,
    best_config: Option<String>,
    /// The best record's energy per launch (mJ) and mean power (W), when read.
    best_energy_mj: Option<f64>,
    best_power_w: Option<f64>,
}

fn job_json(v: JobView) -> JobJson {
    let workloads: Vec<WorkloadJson> = v
        .workloads
        .into_iter()
        .map(|w| {
            let best = w.best.as_ref();
            WorkloadJson {
                idx: w.row.idx,
                key: w.row.workload_key,
                state: w.row.state.name(),
                trials_done: w.row.done,
                trials_target: w.row.trials_target,
                best_us: best.map(|r| r.median_us),
                vendor_us: best.and_then(|r| r.baseline_us),
                speedup: best.map(|r| r.speedup).filter(|s| *s > 0.0),
                best_template: best.map(|r| format!("{} v{}", r.template, r.template_version)),
                best_config: best.map(|r| r.config.clone()),
                best_energy_mj: best.and_then(|r| r.energy_mj),
                best_power_w: best.and_then(|r| r.power_w),
            }
        })
        .collect();
    JobJson {
        id: v.job.id,
        label: v.job.label,
        state: v.job.state.name(),
        template: v.job.template,
        tuner: v.job.tuner.name(),
        device_class: v.job.device_class,
        created_ms: v.job.created_ms,
        trials_done: workloads.iter().map(|w| u64::from(w.trials_done)).sum(),
        trials_target: workloads.iter().map(|w| u64::from(w.trials_target)).sum(),
        error: v.job.error,
        regime: v.job.regime,
        objective: v.job.objective,
        max_slowdown: v.job.max_slowdown,
        workloads,
    }
}

async fn jobs(State(tracker): State<Arc<Tracker>>) -> Response {
    match tracker.jobs(&[], DASHBOARD_JOBS).await {
        Ok(views) => axum::Json(views.into_iter().map(job_json).collect::<Vec<_>>()).into_response(),
        Err(e) => failed(e),
    }
}

#[derive(Serialize)]
struct TrialsJson {
    job: i64,
    workloads: Vec<WorkloadTrials>,
}

#[derive(Serialize)]
struct WorkloadTrials {
    idx: u32,
    key: String,
    vendor_us: Option<f64>,
    /// Each finished trial's time in the order they finished (`null`: failed or untrusted).
    times_us: Vec<Option<f64>>,
    /// Each finished trial's energy per launch, mJ, beside `times_us` (`null`: unknown, failed
    /// or untrusted): the page's time-energy front.
    energies_mj: Vec<Option<f64>>,
    /// The vendor's energy per launch beside the best record, when read.
    vendor_energy_mj: Option<f64>,
}

async fn trials(State(tracker): State<Arc<Tracker>>, Path(id): Path<i64>) -> Response {
    let view = match tracker.job(id).await {
        Ok(v) => v,
        Err(crate::error::Error::JobNotFound(_)) => {
            return (StatusCode::NOT_FOUND, format!("job {id} does not exist")).into_response();
        }
        Err(e) => return failed(e),
    };
    let mut out = Vec::with_capacity(view.workloads.len());
    for w in &view.workloads {
        let outcomes = match store::records::trial_outcomes(&tracker.pool, id, w.row.idx).await {
            Ok(o) => o,
            Err(e) => return failed(e),
        };
        let ok = |t: &store::records::TrialOutcome| t.status == Status::Ok && t.trusted && t.median_us > 0.0;
        let times_us = outcomes.iter().map(|t| ok(t).then_some(t.median_us)).collect();
        let energies_mj = outcomes.iter().map(|t| if ok(t) { t.energy_mj } else { None }).collect();
        out.push(WorkloadTrials {
            idx: w.row.idx,
            key: w.row.workload_key.clone(),
            vendor_us: w.best.as_ref().and_then(|r| r.baseline_us),
            times_us,
            energies_mj,
            vendor_energy_mj: w.best.as_ref().and_then(|r| r.baseline_energy_mj),
        });
    }
    axum::Json(TrialsJson { job: id, workloads: out }).into_response()
}

#[derive(Serialize)]
struct WorkerJson {
    id: i64,
    name: String,
    device_class: String,
    state: String,
    leased: u32,
    reported: i64,
    last_seen_ms: i64,
    drift: f64,
    flagged: bool,
    quarantined: Option<String>,
}

async fn workers(State(tracker): State<Arc<Tracker>>) -> Response {
    match tracker.workers().await {
        Ok(rows) => {
            let out: Vec<WorkerJson> = rows
                .into_iter()
                .map(|(w, d)| WorkerJson {
                    id: w.id,
                    name: w.name,
                    device_class: w.device_class,
                    state: w.state,
                    leased: w.leased,
                    reported: w.reported,
                    last_seen_ms: w.last_seen_ms,
                    drift: d.drift,
                    flagged: d.flagged,
                    quarantined: w.quarantined,
                })
                .collect();
            axum::Json(out).into_response()
        }
        Err(e) => failed(e),
    }
}

async fn metrics(State(tracker): State<Arc<Tracker>>) -> Response {
    match render_metrics(&tracker).await {
        Ok(text) => ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response(),
        Err(e) => failed(e),
    }
}

/// Prometheus text exposition of the tracker's state.
async fn render_metrics(tracker: &Tracker) -> crate::error::Result<String> {
    let pool = &tracker.pool;
    let mut out = String::new();
    let tasks: Vec<(String, String, i64)> =
        on!(pool, |c, pg| sqlx::query_as("SELECT state, kind, COUNT(*) FROM tasks GROUP BY state, kind")
            .fetch_all(c)
            .await)?;
    family(&mut out, "tensortune_tasks", "gauge", "Tasks by state (pending is the queue) and kind.");
    for state in ["pending", "leased", "done", "cancelled"] {
        for kind in ["tuning", "finalist"] {
            let n = tasks.iter().find(|(s, k, _)| s == state && k == kind).map_or(0, |t| t.2);
            sample(&mut out, "tensortune_tasks", &[("state", state), ("kind", kind)], n as f64);
        }
    }
    let records: Vec<(String, bool, i64)> = on!(pool, |c, pg| {
        sqlx::query_as("SELECT status, untrusted IS NULL, COUNT(*) FROM records GROUP BY status, untrusted IS NULL")
            .fetch_all(c)
            .await
    })?;
    family(&mut out, "tensortune_records", "gauge", "Records in the store by status and trust.");
    for (status, trusted, n) in &records {
        let trust = if *trusted { "trusted" } else { "untrusted" };
        sample(&mut out, "tensortune_records", &[("status", status), ("trust", trust)], *n as f64);
    }
    let minute_ago = now_ms() - 60_000;
    let recent: i64 = on!(pool, |c, pg| {
        sqlx::query_scalar("SELECT COUNT(*) FROM records WHERE created_ms >= $1").bind(minute_ago).fetch_one(c).await
    })?;
    family(&mut out, "tensortune_records_per_second", "gauge", "Records stored per second over the last minute.");
    sample(&mut out, "tensortune_records_per_second", &[], recent as f64 / 60.0);

    let workers = tracker.workers().await?;
    family(&mut out, "tensortune_workers", "gauge", "Registered workers by state.");
    for state in ["online", "offline"] {
        let n = workers.iter().filter(|(w, _)| w.state == state).count();
        sample(&mut out, "tensortune_workers", &[("state", state)], n as f64);
    }
    family(
        &mut out,
        "tensortune_workers_drift_flagged",
        "gauge",
        "Online workers whose reference timing drifts from their class.",
    );
    let flagged = workers.iter().filter(|(w, d)| w.state == "online" && d.flagged).count();
    sample(&mut out, "tensortune_workers_drift_flagged", &[], flagged as f64);
    family(&mut out, "tensortune_workers_quarantined", "gauge", "Workers an admin quarantined.");
    let quarantined = workers.iter().filter(|(w, _)| w.quarantined.is_some()).count();
    sample(&mut out, "tensortune_workers_quarantined", &[], quarantined as f64);
    family(&mut out, "tensortune_leases_held", "gauge", "Tasks leased to workers now.");
    let held: u32 = workers.iter().map(|(w, _)| w.leased).sum();
    sample(&mut out, "tensortune_leases_held", &[], f64::from(held));

    let c = &tracker.counters;
    for (name, help, counter) in [
        ("tensortune_leases_expired_total", "Leases that ran out without a heartbeat since start.", &c.leases_expired),
        ("tensortune_reports_stored_total", "Reports stored since start.", &c.reports_stored),
        (
            "tensortune_reports_duplicate_total",
            "Repeated reports acknowledged and dropped since start.",
            &c.reports_duplicate,
        ),
        ("tensortune_reports_untrusted_total", "Reports stored as untrusted since start.", &c.reports_untrusted),
    ] {
        family(&mut out, name, "counter", help);
        sample(&mut out, name, &[], counter.load(Ordering::Relaxed) as f64);
    }

    let jobs: Vec<(String, i64)> =
        on!(pool, |c, pg| sqlx::query_as("SELECT state, COUNT(*) FROM jobs GROUP BY state").fetch_all(c).await)?;
    family(&mut out, "tensortune_jobs", "gauge", "Jobs by state.");
    for state in [JobState::Queued, JobState::Running, JobState::Done, JobState::Cancelled, JobState::Failed] {
        let n = jobs.iter().find(|(s, _)| s == state.name()).map_or(0, |j| j.1);
        sample(&mut out, "tensortune_jobs", &[("state", state.name())], n as f64);
    }
    // Per-job progress of the jobs still going (bounded: finished jobs leave the series).
    let active = tracker.jobs(&[JobState::Queued, JobState::Running], DASHBOARD_JOBS).await?;
    family(&mut out, "tensortune_job_trials_done", "gauge", "Finished trials of each queued or running job.");
    let mut targets = String::new();
    family(&mut targets, "tensortune_job_trials_target", "gauge", "Trials each queued or running job asks for.");
    for v in active {
        let j = job_json(v);
        let id = j.id.to_string();
        let labels = [("job", id.as_str()), ("label", j.label.as_str())];
        sample(&mut out, "tensortune_job_trials_done", &labels, j.trials_done as f64);
        sample(&mut targets, "tensortune_job_trials_target", &labels, j.trials_target as f64);
    }
    out.push_str(&targets);
    Ok(out)
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn sample(out: &mut String, name: &str, labels: &[(&str, &str)], value: f64) {
    out.push_str(name);
    if !labels.is_empty() {
        out.push('{');
        for (i, (k, v)) in labels.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let _ = write!(out, "{k}=\"{}\"", escape(v));
        }
        out.push('}');
    }
    let _ = writeln!(out, " {value}");
}

/// A label value as the text format wants it: backslash, quote and newline escaped.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_escape_their_labels() {
        let mut out = String::new();
        sample(&mut out, "m", &[("label", "a \"b\"\\\nc")], 2.5);
        assert_eq!(out, "m{label=\"a \\\"b\\\"\\\\\\nc\"} 2.5\n");
        let mut bare = String::new();
        sample(&mut bare, "m", &[], 3.0);
        assert_eq!(bare, "m 3\n");
    }
}
