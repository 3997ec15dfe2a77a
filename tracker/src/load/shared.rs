//! A load run on PostgreSQL: several tracker processes on one fresh database, the worker groups
//! spread over them (each worker given every tracker, its own first, and failing over to the next
//! on transient errors), the `kill-tracker` fault as a SIGKILL of the first tracker that is never
//! restarted (the others carry every job to the end), and the database checked afterwards with
//! the same counts as a SQLite run's.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use sqlx::{AssertSqlSafe, Connection, PgConnection};
use tensortune_proto::pb::tuning_client::TuningClient;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::check::DbCheck;
use super::procs::{GroupProc, TrackerProc, TrackerSpec};
use super::{Fault, FaultRound, LoadConfig, Summary, TICK, free_port, gather, job_request};

/// Runs the load on `server` (a PostgreSQL URL) as `config` says, filling `summary`.
pub(crate) async fn run_shared(config: &LoadConfig, server: &str, summary: &mut Summary) -> anyhow::Result<()> {
    if let Some(f) = config.faults.iter().find(|f| **f != Fault::KillTracker) {
        anyhow::bail!(
            "--fault {f} is not supported with --pg; on PostgreSQL only kill-tracker is (SIGKILL of one tracker)"
        );
    }
    let db = fresh_database(server).await?;
    let mut trackers = Vec::new();
    let mut urls = Vec::new();
    for k in 0..config.trackers {
        let dir = config.dir.join(format!("tracker{k}"));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let spec = TrackerSpec {
            bin: config.tracker_bin.clone(),
            db: PathBuf::from(&db),
            port: free_port()?,
            lease_secs: config.lease_secs,
            heartbeat_secs: config.heartbeat_secs,
            dir,
        };
        urls.push(spec.url());
        trackers.push(TrackerProc::start(spec).await?);
    }
    let mut groups = Vec::new();
    for g in 0..config.groups {
        let n = config.workers / config.groups + u32::from(g < config.workers % config.groups);
        // Group g's workers call tracker g mod K first and the others in turn after it.
        let first = g as usize % urls.len();
        let list = [&urls[first..], &urls[..first]].concat().join(",");
        groups.push(GroupProc::spawn(config, &list, &format!("g{g}"), n)?);
    }
    let mut conn = PgConnection::connect(&db).await.context("connecting to the load database")?;
    wait_for_workers(&mut conn, config.workers).await?;

    let started = Instant::now();
    let mut submits = JoinSet::new();
    for j in 0..config.jobs {
        // Jobs are submitted through every tracker in turn.
        let mut tuning = TuningClient::connect(urls[j as usize % urls.len()].clone()).await?;
        let request = job_request(j, config);
        submits.spawn(async move { tuning.submit_job(request).await });
    }
    while let Some(r) = submits.join_next().await {
        r?.context("submitting a job")?;
    }
    let total = i64::from(config.jobs) * i64::from(config.trials);
    let mut kill = config.faults.contains(&Fault::KillTracker);
    let deadline = started + config.deadline;
    let mut finished = false;
    let db_cpu_before = server_cpu_seconds();
    while Instant::now() < deadline {
        for t in &mut trackers {
            t.sample();
        }
        let (ended, records) = progress(&mut conn).await?;
        if ended >= i64::from(config.jobs) {
            finished = true;
            break;
        }
        // As on SQLite, the one fault fires once a third of the trials are in.
        if kill && records * 3 >= total {
            kill = false;
            let round = kill_first(&mut trackers, &mut conn, started, deadline).await?;
            tracing::info!(recovered = round.recovered, recovery_s = round.recovery_s, note = %round.note, "fault round");
            summary.faults.push(round);
            continue;
        }
        tokio::time::sleep(TICK).await;
    }
    summary.wall_s = started.elapsed().as_secs_f64();
    summary.finished = finished;
    if kill {
        summary.faults.push(FaultRound::not_fired(Fault::KillTracker));
    }
    summary.db_server_cpu_s = match (db_cpu_before, server_cpu_seconds()) {
        (Some(a), Some(b)) => Some(b - a),
        _ => None,
    };
    for g in groups {
        g.stop().await;
    }
    for t in &mut trackers {
        t.sample();
    }
    summary.tracker_cpu_s = trackers.iter().map(|t| t.usage().0).sum();
    summary.tracker_peak_rss_mib = trackers.iter().map(|t| t.usage().1).max().unwrap_or(0) as f64 / 1024.0;
    for mut t in trackers {
        if t.alive() {
            t.stop().await?;
        }
    }
    gather(config, summary)?;
    let (_, records) = progress(&mut conn).await?;
    summary.tasks_per_s = records as f64 / summary.wall_s.max(1e-9);
    summary.tracker_ms_per_task = super::per_task_ms(summary.tracker_cpu_s, records);
    summary.db = check(&mut conn).await?;
    conn.close().await?;
    Ok(())
}

/// Makes an empty database for the run on `server` (dropping one a previous run left); returns
/// its URL.
async fn fresh_database(server: &str) -> anyhow::Result<String> {
    let name = "tensortune_load";
    let mut admin = PgConnection::connect(server)
        .await
        .with_context(|| format!("connecting to --pg {}", crate::store::redact(server)))?;
    sqlx::query(AssertSqlSafe(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))).execute(&mut admin).await?;
    sqlx::query(AssertSqlSafe(format!("CREATE DATABASE {name}"))).execute(&mut admin).await?;
    admin.close().await?;
    let (scheme, rest) = server.split_once("://").context("--pg must be a postgres:// URL")?;
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    Ok(format!("{scheme}://{authority}/{name}"))
}

/// SIGKILLs the first tracker (never restarted) and waits until every task leased at the kill is
/// done through the others.
async fn kill_first(
    trackers: &mut [TrackerProc],
    conn: &mut PgConnection,
    started: Instant,
    deadline: Instant,
) -> anyhow::Result<FaultRound> {
    let mut round = FaultRound::not_fired(Fault::KillTracker);
    round.at_s = started.elapsed().as_secs_f64();
    let held: Vec<i64> =
        sqlx::query_scalar("SELECT id FROM tasks WHERE state = 'leased'").fetch_all(&mut *conn).await?;
    let t0 = Instant::now();
    trackers[0].kill().await?;
    round.tasks_hit = held.len();
    let ids = serde_json::to_string(&held)?;
    let done = loop {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM tasks
             WHERE state = 'done' AND id IN (SELECT value::bigint FROM json_array_elements_text($1::json))",
        )
        .bind(&ids)
        .fetch_one(&mut *conn)
        .await?;
        if n == held.len() as i64 {
            break Some(Instant::now());
        }
        if Instant::now() >= deadline {
            break None;
        }
        tokio::time::sleep(TICK).await;
    };
    round.recovered = done.is_some();
    round.recovery_s = done.map_or(0.0, |t| (t - t0).as_secs_f64());
    round.note = format!(
        "SIGKILL of tracker 0 of {} with {} tasks leased, not restarted; recovery: until every task leased at the kill \
         was done through the others",
        trackers.len(),
        held.len()
    );
    Ok(round)
}

/// Waits until `workers` workers are registered.
async fn wait_for_workers(conn: &mut PgConnection, workers: u32) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM workers").fetch_one(&mut *conn).await?;
        if n >= i64::from(workers) {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "only {n} of {workers} workers registered within 60 s");
        tokio::time::sleep(TICK).await;
    }
}

/// Jobs ended and records stored.
async fn progress(conn: &mut PgConnection) -> sqlx::Result<(i64, i64)> {
    sqlx::query_as(
        "SELECT (SELECT count(*) FROM jobs WHERE state NOT IN ('queued', 'running')), (SELECT count(*) FROM records)",
    )
    .fetch_one(conn)
    .await
}

/// The counts of `check::check`, on PostgreSQL.
async fn check(c: &mut PgConnection) -> anyhow::Result<DbCheck> {
    let one = |sql: &'static str| sqlx::query_scalar::<_, i64>(sql);
    Ok(DbCheck {
        jobs: one("SELECT count(*) FROM jobs").fetch_one(&mut *c).await?,
        jobs_not_done: one("SELECT count(*) FROM jobs WHERE state <> 'done'").fetch_one(&mut *c).await?,
        tasks: one("SELECT count(*) FROM tasks").fetch_one(&mut *c).await?,
        tasks_not_done: one("SELECT count(*) FROM tasks WHERE state <> 'done'").fetch_one(&mut *c).await?,
        tasks_without_record: one(
            "SELECT count(*) FROM tasks t WHERE t.kind = 'tuning' AND t.state = 'done' AND NOT t.reused \
             AND NOT EXISTS (SELECT 1 FROM records r WHERE r.task_id = t.id AND r.id = t.record_id)",
        )
        .fetch_one(&mut *c)
        .await?,
        records: one("SELECT count(*) FROM records").fetch_one(&mut *c).await?,
        device_lost: one("SELECT count(*) FROM records WHERE status = 'device_lost'").fetch_one(&mut *c).await?,
        duplicate_task_records: one(
            "SELECT count(*) FROM (SELECT 1 FROM records GROUP BY task_id, finalist_pos HAVING count(*) > 1) AS d",
        )
        .fetch_one(&mut *c)
        .await?,
        duplicate_measurements: one("SELECT count(*) FROM (SELECT 1 FROM records \
             GROUP BY job_id, workload_key, template, template_version, config_index, finalist_pos \
             HAVING count(*) > 1) AS d")
        .fetch_one(&mut *c)
        .await?,
        trials_expected: one("SELECT coalesce(sum(least(trials_target, space_size)), 0)::bigint FROM job_workloads")
            .fetch_one(&mut *c)
            .await?,
        workloads_short: one("SELECT count(*) FROM job_workloads w WHERE least(w.trials_target, w.space_size) <> \
             (SELECT count(*) FROM records r JOIN tasks t ON t.id = r.task_id \
              WHERE t.job_id = w.job_id AND t.workload_idx = w.idx AND t.kind = 'tuning')")
        .fetch_one(&mut *c)
        .await?,
        workloads_miscounted: one(super::check::MISCOUNTED).fetch_one(&mut *c).await?,
    })
}

/// CPU seconds (user + system) of every `postgres` process on this machine now: the server the
/// trackers share, when it runs here. Processes that exit between two readings are missed, so a
/// difference is a lower bound.
fn server_cpu_seconds() -> Option<f64> {
    let mut total = 0.0;
    let mut found = false;
    for entry in std::fs::read_dir("/proc").ok()? {
        let Ok(entry) = entry else { continue };
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let Ok(comm) = std::fs::read_to_string(format!("/proc/{pid}/comm")) else { continue };
        if comm.trim() == "postgres"
            && let Some(cpu) = super::procs::cpu_seconds(pid)
        {
            total += cpu;
            found = true;
        }
    }
    found.then_some(total)
}
