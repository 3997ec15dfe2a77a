//! Load and fault tests of a tracker on loopback (the `tensortune-load` tool).
//!
//! # Layout
//!
//! - [`run`] (here): starts a `tensortune-tracker` process on 127.0.0.1 and worker groups, submits
//!   jobs, fires the faults asked for while they run, waits for every job to end under a deadline,
//!   stops everything and checks the database; returns a [`Summary`].
//! - `group.rs`: [`run_group`], a process hosting many in-process `sim` workers, each with its own
//!   connection; what they saw goes to a stats file.
//! - `procs.rs`: the tracker and group processes, signals, `/proc` readings.
//! - `check.rs`: [`check`], the database read directly after a run.
//! - `faults.rs`: each fault: how it is made, how recovery is timed; the start-up checks.
//!
//! The workers are protocol-level: they register a `sim` device and speak `Dispatch` as the worker
//! daemon does (lease, heartbeat, report retried on transient failures), but "measure" by sleeping
//! and report a time that depends on the config alone. That keeps 200 of them on a small machine
//! and puts the load on the tracker, which is what is measured.

mod check;
mod faults;
mod group;
mod procs;
mod shared;

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use serde::Serialize;
use tensortune_proto::pb;
use tensortune_proto::pb::tuning_client::TuningClient;
use tokio::task::JoinSet;
use tokio::time::Instant;

pub use check::{DbCheck, check};
pub use faults::{Fault, FaultRound, StartCheck, garbage, start_check};
pub use group::{GroupConfig, GroupStats, run_group};
pub use procs::serving;

use procs::{GroupProc, TrackerProc, TrackerSpec};

/// How often a run looks at the database and the tracker's `/proc`.
const TICK: Duration = Duration::from_millis(200);

/// What a load run does.
#[derive(Clone, Debug)]
pub struct LoadConfig {
    /// Working directory: database, logs, group stats (a tmpfs is mounted under it for
    /// `disk-full`).
    pub dir: PathBuf,
    /// The `tensortune-tracker` executable.
    pub tracker_bin: PathBuf,
    /// The `tensortune-load` executable (worker groups run as its `group` command).
    pub load_bin: PathBuf,
    /// Workers in all.
    pub workers: u32,
    /// Processes the workers are spread over (a fault kills or stops one).
    pub groups: u32,
    /// Jobs submitted at once (one workload per job, all different).
    pub jobs: u32,
    /// Trials of each job.
    pub trials: u32,
    /// How long a worker "measures" a task.
    pub measure: Duration,
    /// The tracker's lease, seconds.
    pub lease_secs: u64,
    /// The tracker's heartbeat interval, seconds.
    pub heartbeat_secs: u64,
    /// Every job must end within this long of submission.
    pub deadline: Duration,
    /// Faults fired one after another while the jobs run, and checks made before.
    pub faults: Vec<Fault>,
    /// When the faults fire. `Some(gap)`: the first `gap` after submission, each next one `gap`
    /// after the one before recovered, in the order given. `None`: the i-th of n once (i + 1) /
    /// (n + 2) of the trials are in (and the one before recovered), which a fast run can end
    /// before its last faults fire (the faults that wait out a lease take ~1.5 leases each).
    pub fault_gap: Option<Duration>,
    /// How long `disk-full` and `fsize` hold their fault.
    pub hold: Duration,
    /// Size of the tmpfs the database lives on (needed by `disk-full`, which needs root).
    pub tmpfs_mib: Option<u64>,
    /// Seed of the jobs (a fault that stops or kills workers picks the group holding most tasks).
    pub seed: u64,
    /// A PostgreSQL server (`postgres://...`) to run on instead of a SQLite file: the run makes a
    /// fresh database `tensortune_load` there and starts `trackers` trackers on it.
    pub pg: Option<String>,
    /// Tracker processes on the one database (more than one needs `pg`).
    pub trackers: u32,
    /// Tasks a worker leases per call and reports per call at most (see [`GroupConfig::batch`]).
    pub batch: u32,
    /// How long a worker's report waits for more results (see [`GroupConfig::report_gather`]).
    pub report_gather: Duration,
    /// Tasks each job keeps outstanding (its `batch_size`); 0 leaves the tracker's default (64),
    /// which keeps at most 64 workers per job busy.
    pub job_batch: u32,
}

/// Latency of one rpc, microseconds.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Latency {
    /// Calls measured.
    pub calls: usize,
    /// Median.
    pub p50_us: u32,
    /// 99th percentile.
    pub p99_us: u32,
    /// Slowest.
    pub max_us: u32,
}

impl Latency {
    fn of(mut samples: Vec<u32>) -> Latency {
        if samples.is_empty() {
            return Latency::default();
        }
        samples.sort_unstable();
        let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
        Latency { calls: samples.len(), p50_us: at(0.5), p99_us: at(0.99), max_us: at(1.0) }
    }
}

/// What a load run measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Summary {
    /// Workers in all.
    pub workers: u32,
    /// Worker processes.
    pub groups: u32,
    /// Tracker processes (sharing one PostgreSQL database when more than one).
    pub trackers: u32,
    /// `sqlite` or `postgres`.
    pub database: String,
    /// Jobs.
    pub jobs: u32,
    /// Trials per job.
    pub trials: u32,
    /// From submission until every job ended, seconds.
    pub wall_s: f64,
    /// Tuning records stored per second over `wall_s`.
    pub tasks_per_s: f64,
    /// The tracker's CPU seconds (user + system, every incarnation).
    pub tracker_cpu_s: f64,
    /// The trackers' CPU per tuning record stored, milliseconds.
    pub tracker_ms_per_task: f64,
    /// CPU seconds of the worker groups (the load tool's protocol workers), apart from the
    /// tracker's: on a small machine they compete with it for the same cores.
    pub workers_cpu_s: f64,
    /// The tracker's peak resident memory over its incarnations, MiB (the largest of the
    /// trackers when several).
    pub tracker_peak_rss_mib: f64,
    /// On PostgreSQL, the CPU seconds of the server's processes on this machine over the load
    /// (a lower bound: processes that ended meanwhile are missed).
    pub db_server_cpu_s: Option<f64>,
    /// Client-side latency of the workers' calls, by rpc, and of all but the lease long polls
    /// (which include waiting for work).
    pub latency: BTreeMap<String, Latency>,
    /// Reports the tracker stored.
    pub reports_stored: u64,
    /// Reports acknowledged as already done (dropped).
    pub reports_duplicate: u64,
    /// Reports refused for good (late: the lease went to another worker).
    pub reports_refused: u64,
    /// Failed calls that were retried, by rpc and status code.
    pub retried: BTreeMap<String, u64>,
    /// A message the tracker sent with each kind of failed call.
    pub messages: BTreeMap<String, String>,
    /// The faults fired during the load.
    pub faults: Vec<FaultRound>,
    /// The start-up checks made before it.
    pub start_checks: Vec<StartCheck>,
    /// The database's account.
    pub db: DbCheck,
    /// Whether every job ended before the deadline.
    pub finished: bool,
}

impl Summary {
    /// Every job ended in time, nothing lost or duplicated, every fault recovered, every start-up
    /// check passed.
    pub fn ok(&self) -> bool {
        self.finished
            && self.db.clean()
            && self.faults.iter().all(|f| f.recovered)
            && self.start_checks.iter().all(|c| c.passed)
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = &self.db;
        writeln!(
            f,
            "workers x jobs x trials     {} ({} processes) x {} x {}",
            self.workers, self.groups, self.jobs, self.trials
        )?;
        writeln!(f, "trackers, database          {} on {}", self.trackers, self.database)?;
        writeln!(
            f,
            "every job ended             {} ({} of {} done, {:.1} s)",
            yes(self.finished && d.jobs_not_done == 0),
            d.jobs - d.jobs_not_done,
            d.jobs,
            self.wall_s
        )?;
        writeln!(
            f,
            "tasks lost                  {} (not done {}, done without record {})",
            d.lost(),
            d.tasks_not_done,
            d.tasks_without_record
        )?;
        writeln!(
            f,
            "duplicate records           {} (same task {}, same measurement {})",
            d.duplicates(),
            d.duplicate_task_records,
            d.duplicate_measurements
        )?;
        writeln!(
            f,
            "records / trials asked      {} / {} (workloads short {}, device_lost {})",
            d.records, d.trials_expected, d.workloads_short, d.device_lost
        )?;
        writeln!(f, "workloads miscounted        {} (progress or trial numbers off)", d.workloads_miscounted)?;
        writeln!(f, "tasks/s sustained           {:.1}", self.tasks_per_s)?;
        for (rpc, l) in &self.latency {
            writeln!(
                f,
                "latency {rpc:<19} p50 {:.2} ms  p99 {:.2} ms  max {:.1} ms  ({} calls)",
                ms(l.p50_us),
                ms(l.p99_us),
                ms(l.max_us),
                l.calls
            )?;
        }
        writeln!(
            f,
            "tracker cpu, peak rss       {:.1} s ({:.3} ms per task), {:.1} MiB",
            self.tracker_cpu_s, self.tracker_ms_per_task, self.tracker_peak_rss_mib
        )?;
        writeln!(f, "load workers' cpu           {:.1} s (apart from the tracker's)", self.workers_cpu_s)?;
        if let Some(cpu) = self.db_server_cpu_s {
            writeln!(f, "database server cpu         {cpu:.1} s")?;
        }
        writeln!(
            f,
            "reports                     stored {}, duplicate {}, refused {}",
            self.reports_stored, self.reports_duplicate, self.reports_refused
        )?;
        for (what, n) in &self.retried {
            writeln!(f, "retried {what:<19} {n}  ({})", self.messages.get(what).map_or("", String::as_str))?;
        }
        for r in &self.faults {
            writeln!(
                f,
                "fault {:<21} at {:.1} s: recovered {} in {:.2} s; {}",
                r.fault.to_string(),
                r.at_s,
                yes(r.recovered),
                r.recovery_s,
                r.note
            )?;
        }
        for c in &self.start_checks {
            writeln!(f, "start {:<21} passed {}: {}", c.fault.to_string(), yes(c.passed), c.said)?;
        }
        write!(f, "result                      {}", if self.ok() { "PASS" } else { "FAIL" })
    }
}

fn yes(b: bool) -> &'static str {
    if b { "yes" } else { "NO" }
}

fn ms(us: u32) -> f64 {
    f64::from(us) / 1000.0
}

/// Runs a load test as `config` says.
pub async fn run(config: LoadConfig) -> anyhow::Result<Summary> {
    anyhow::ensure!(
        config.workers >= 1 && config.workers <= 10_000,
        "invalid --workers {}: allowed 1 ..= 10000",
        config.workers
    );
    anyhow::ensure!(
        config.groups >= 1 && config.groups <= config.workers,
        "invalid --groups {}: allowed 1 ..= --workers ({})",
        config.groups,
        config.workers
    );
    anyhow::ensure!(config.jobs >= 1 && config.jobs <= 100, "invalid --jobs {}: allowed 1 ..= 100", config.jobs);
    anyhow::ensure!(
        config.trials >= 1 && config.trials <= 10_000,
        "invalid --trials {}: allowed 1 ..= 10000",
        config.trials
    );
    anyhow::ensure!((1..=1024).contains(&config.batch), "invalid --batch {}: allowed 1 ..= 1024", config.batch);
    anyhow::ensure!((1..=8).contains(&config.trackers), "invalid --trackers {}: allowed 1 ..= 8", config.trackers);
    anyhow::ensure!(
        config.trackers == 1 || config.pg.is_some(),
        "--trackers {} needs --pg: trackers share a PostgreSQL database (a SQLite file has one tracker)",
        config.trackers
    );
    std::fs::create_dir_all(&config.dir).with_context(|| format!("creating {}", config.dir.display()))?;
    let mut summary = Summary {
        workers: config.workers,
        groups: config.groups,
        trackers: config.trackers,
        database: if config.pg.is_some() { "postgres" } else { "sqlite" }.into(),
        jobs: config.jobs,
        trials: config.trials,
        ..Summary::default()
    };
    if let Some(server) = &config.pg {
        shared::run_shared(&config, server, &mut summary).await?;
        return Ok(summary);
    }
    for fault in config.faults.iter().filter(|f| f.at_start()) {
        summary.start_checks.push(faults::start_check(*fault, &config.tracker_bin, &config.dir).await?);
    }
    let tmpfs = match config.tmpfs_mib {
        Some(mib) => Some(faults::Tmpfs::mount(&config.dir.join("dbfs"), mib).await?),
        None => None,
    };
    let db_dir = tmpfs.as_ref().map_or_else(|| config.dir.clone(), |t| t.path.clone());
    let db = db_dir.join("load.db");
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(db_dir.join(format!("load.db{suffix}")));
    }
    let result = run_load(&config, &db, tmpfs.as_ref(), &mut summary).await;
    if let Some(t) = tmpfs {
        // The checks read the database before it goes, and a copy is kept beside the logs.
        if result.is_ok() {
            summary.db = check(&db).await?;
            std::fs::copy(&db, config.dir.join("load.db")).context("copying the database off the tmpfs")?;
        }
        t.unmount().await?;
    } else if result.is_ok() {
        summary.db = check(&db).await?;
    }
    result?;
    Ok(summary)
}

async fn run_load(
    config: &LoadConfig,
    db: &std::path::Path,
    tmpfs: Option<&faults::Tmpfs>,
    summary: &mut Summary,
) -> anyhow::Result<()> {
    let port = free_port()?;
    let spec = TrackerSpec {
        bin: config.tracker_bin.clone(),
        db: db.to_path_buf(),
        port,
        lease_secs: config.lease_secs,
        heartbeat_secs: config.heartbeat_secs,
        dir: config.dir.clone(),
    };
    let url = spec.url();
    let mut tracker = TrackerProc::start(spec).await?;
    let mut groups = Vec::new();
    for g in 0..config.groups {
        let n = config.workers / config.groups + u32::from(g < config.workers % config.groups);
        groups.push(GroupProc::spawn(config, &url, &format!("g{g}"), n)?);
    }
    let mut conn = wait_for_workers(db, config.workers).await?;

    let started = Instant::now();
    let tuning = TuningClient::connect(url.clone()).await?;
    let mut submits = JoinSet::new();
    for j in 0..config.jobs {
        let mut tuning = tuning.clone();
        let request = job_request(j, config);
        submits.spawn(async move { tuning.submit_job(request).await });
    }
    while let Some(r) = submits.join_next().await {
        r?.context("submitting a job")?;
    }
    let total = i64::from(config.jobs) * i64::from(config.trials);
    let mut env = faults::Env {
        config,
        url: &url,
        tmpfs,
        conn: &mut conn,
        groups: &mut groups,
        tracker: &mut tracker,
        started,
        restarts: 0,
    };
    let mut pending: Vec<Fault> = config.faults.iter().copied().filter(|f| !f.at_start()).collect();
    pending.reverse();
    let count = pending.len() as i64;
    let deadline = started + config.deadline;
    let mut finished = false;
    let mut next_at = started + config.fault_gap.unwrap_or_default();
    while Instant::now() < deadline {
        env.tracker.sample();
        let (ended, records) = faults::progress(env.conn).await?;
        if ended >= i64::from(config.jobs) {
            finished = true;
            break;
        }
        let fired = count - pending.len() as i64;
        let due = match config.fault_gap {
            // By time: `gap` after submission, then `gap` after the last one recovered.
            Some(_) => Instant::now() >= next_at,
            // By trials: the i-th fault (of n) once (i + 1) / (n + 2) of the trials are in.
            None => records * (count + 2) >= total * (fired + 1),
        };
        if let Some(fault) = pending.last().copied()
            && due
        {
            pending.pop();
            let round = faults::fire(fault, &mut env, deadline).await?;
            next_at = Instant::now() + config.fault_gap.unwrap_or_default();
            tracing::info!(fault = %round.fault, recovered = round.recovered, recovery_s = round.recovery_s, note = %round.note, "fault round");
            summary.faults.push(round);
            continue;
        }
        tokio::time::sleep(TICK).await;
    }
    summary.wall_s = started.elapsed().as_secs_f64();
    summary.finished = finished;
    for fault in pending.into_iter().rev() {
        summary.faults.push(FaultRound::not_fired(fault));
    }
    for g in groups {
        g.stop().await;
    }
    let (cpu, rss) = {
        tracker.sample();
        tracker.usage()
    };
    summary.tracker_cpu_s = cpu;
    summary.tracker_peak_rss_mib = rss as f64 / 1024.0;
    drop(conn);
    tracker.stop().await?;
    gather(config, summary)?;
    let records = check::connect(db).await;
    if let Ok(mut c) = records {
        let (_, n) = check::progress(&mut c).await?;
        summary.tasks_per_s = n as f64 / summary.wall_s.max(1e-9);
        summary.tracker_ms_per_task = per_task_ms(summary.tracker_cpu_s, n);
    }
    Ok(())
}

/// CPU milliseconds per record: `cpu_s` over `records` (0 without records).
pub(crate) fn per_task_ms(cpu_s: f64, records: impl TryInto<u32>) -> f64 {
    let n = f64::from(records.try_into().unwrap_or(u32::MAX));
    if n > 0.0 { cpu_s * 1e3 / n } else { 0.0 }
}

/// Reads every group's stats file (killed groups' last flush included).
fn gather(config: &LoadConfig, summary: &mut Summary) -> anyhow::Result<()> {
    let mut latency: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for entry in std::fs::read_dir(&config.dir)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if !(name.starts_with("group-") && name.ends_with(".json")) {
            continue;
        }
        let stats: GroupStats =
            serde_json::from_slice(&std::fs::read(&path)?).with_context(|| format!("reading {}", path.display()))?;
        for (rpc, samples) in stats.latency_us {
            // A lease is a long poll, timed with its wait for work: kept out of the overall figure.
            if rpc != "lease" {
                latency.entry("all but lease".into()).or_default().extend(&samples);
            }
            latency.entry(rpc).or_default().extend(samples);
        }
        summary.workers_cpu_s += stats.cpu_s;
        summary.reports_stored += stats.stored;
        summary.reports_duplicate += stats.duplicate;
        summary.reports_refused += stats.refused;
        for (k, n) in stats.retried {
            *summary.retried.entry(k).or_default() += n;
        }
        for (k, m) in stats.messages {
            summary.messages.entry(k).or_insert(m);
        }
    }
    summary.latency = latency.into_iter().map(|(k, v)| (k, Latency::of(v))).collect();
    Ok(())
}

/// Waits until `workers` workers are registered; returns a read-only connection to the database.
async fn wait_for_workers(db: &std::path::Path, workers: u32) -> anyhow::Result<sqlx::SqliteConnection> {
    let mut conn = check::connect(db).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM workers").fetch_one(&mut conn).await?;
        if n >= i64::from(workers) {
            return Ok(conn);
        }
        anyhow::ensure!(Instant::now() < deadline, "only {n} of {workers} workers registered within 60 s");
        tokio::time::sleep(TICK).await;
    }
}

/// Job `j`: one f16 matmul workload of its own (so that no job reuses another's records), the
/// random tuner over `wmma_gemm`, no early stop and no finalists (every trial is one record).
fn job_request(j: u32, config: &LoadConfig) -> pb::SubmitJobRequest {
    let workload = pb::Workload {
        op: Some(pb::workload::Op::Matmul(pb::Matmul {
            m: 256 + 64 * u64::from(j),
            n: 512,
            k: 512,
            layout: pb::Layout::Nn as i32,
            input: pb::Dtype::F16 as i32,
            ..Default::default()
        })),
    };
    pb::SubmitJobRequest {
        workloads: vec![workload],
        template: "wmma_gemm".into(),
        tuner: "random".into(),
        trials: config.trials,
        device_class: "sim".into(),
        seed: config.seed + u64::from(j),
        label: format!("load {j}"),
        finalists: Some(0),
        batch_size: config.job_batch,
        ..Default::default()
    }
}

/// A free loopback port (bound and released; the tracker binds it again, and a restarted tracker
/// takes the same one).
fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free loopback port")?;
    Ok(listener.local_addr()?.port())
}
