//! `tensortune-load`: load and fault tests of a tracker on loopback (see `tensortune_tracker::load`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use tensortune_tracker::load::{self, Fault, GroupConfig, LoadConfig};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

/// Load and fault tests: a tracker process on 127.0.0.1, many `sim` workers in a few processes,
/// concurrent jobs, faults while they run, and the database checked afterwards.
#[derive(Parser, Debug)]
#[command(version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a load test and print its figures (exit status 1 when a job did not end, a task was
    /// lost, a record duplicated, or a fault or start-up check failed).
    Run(RunArgs),
    /// One worker group (started by `run`; not for direct use).
    Group(GroupArgs),
}

#[derive(Args, Debug)]
struct RunArgs {
    /// Working directory (database, logs, stats); made if missing.
    #[arg(long)]
    dir: PathBuf,
    /// The tensortune-tracker executable; default: beside this one.
    #[arg(long)]
    tracker_bin: Option<PathBuf>,
    /// Workers in all, 1 ..= 10000.
    #[arg(long, default_value_t = 200)]
    workers: u32,
    /// Processes the workers are spread over (a fault kills or stops one).
    #[arg(long, default_value_t = 10)]
    groups: u32,
    /// Jobs submitted at once (one workload each).
    #[arg(long, default_value_t = 10)]
    jobs: u32,
    /// Trials per job.
    #[arg(long, default_value_t = 500)]
    trials: u32,
    /// Milliseconds a worker "measures" a task.
    #[arg(long, default_value_t = 20)]
    measure_ms: u64,
    /// The tracker's lease, seconds.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=600))]
    lease_secs: u64,
    /// The tracker's heartbeat interval, seconds (less than the lease).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=600))]
    heartbeat_secs: u64,
    /// Every job must end within this many seconds of submission.
    #[arg(long, default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    deadline_secs: u64,
    /// Faults, comma-separated, fired one after another during the load (corrupt-db and
    /// readonly-db are checked before it): kill-workers, stop-workers, kill-tracker, garbage,
    /// disk-full, fsize, corrupt-db, readonly-db.
    #[arg(long, value_delimiter = ',')]
    fault: Vec<Fault>,
    /// Seconds from submission to the first fault and from each fault's recovery to the next
    /// (they fire in the order given: list first those that could find the jobs ended, last
    /// kill-workers and stop-workers, which hold tasks until their lease ends and so keep the run
    /// going until they recover). 0: the i-th of n faults fires once (i + 1) / (n + 2) of the
    /// trials are in, which a fast run can end before its last faults fire.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(0..=600))]
    fault_gap_secs: u64,
    /// Seconds disk-full and fsize hold their fault.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=600))]
    hold_secs: u64,
    /// Put the database on a tmpfs of this many MiB (needs root; disk-full needs it).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=65_536))]
    tmpfs_mib: Option<u64>,
    /// Seed of the jobs.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Also write the figures as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Run on this PostgreSQL server (postgres://USER@HOST:PORT/DB) instead of a SQLite file: a
    /// fresh database `tensortune_load` is made there for the run.
    #[arg(long)]
    pg: Option<String>,
    /// Tracker processes sharing the database (more than one needs --pg); kill-tracker then
    /// SIGKILLs the first and never restarts it.
    #[arg(long, default_value_t = 1)]
    trackers: u32,
    /// Tasks a worker leases per call and reports per call at most (batched reports); 1 speaks
    /// the single-task calls of trackers before batching.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=1024))]
    batch: u32,
    /// Tasks each job keeps outstanding (its batch_size, 1 ..= 4096); the tracker's default (64)
    /// when not given, which keeps at most 64 workers per job busy.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    job_batch: Option<u32>,
    /// Milliseconds a worker's report waits after its first result for more before it is sent,
    /// while it holds more tasks and the tracker did not run out of pending ones (the worker
    /// daemon's way since load15: its `GATHER` is 25 ms); 0 sends what finished while the last
    /// report was on its way (the daemon's way before).
    #[arg(long, default_value_t = 25, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    report_gather_ms: u64,
}

#[derive(Args, Debug)]
struct GroupArgs {
    #[arg(long)]
    tracker: String,
    #[arg(long)]
    name: String,
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    workers: u32,
    #[arg(long)]
    measure_ms: u64,
    #[arg(long)]
    stats: PathBuf,
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    batch: u32,
    #[arg(long, default_value_t = 0)]
    report_gather_ms: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    match cli.command {
        Command::Run(args) => run(args).await,
        Command::Group(args) => {
            let shutdown = CancellationToken::new();
            tokio::spawn(stop_on_term(shutdown.clone()));
            let config = GroupConfig {
                tracker: args.tracker,
                workers: args.workers,
                name: args.name,
                measure: Duration::from_millis(args.measure_ms),
                stats: args.stats,
                batch: args.batch,
                report_gather: Duration::from_millis(args.report_gather_ms),
            };
            load::run_group(config, shutdown).await
        }
    }
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    if args.fault.contains(&Fault::DiskFull) && args.tmpfs_mib.is_none() {
        anyhow::bail!("--fault disk-full needs --tmpfs-mib (the database goes on a tmpfs that is filled)");
    }
    if args.heartbeat_secs >= args.lease_secs {
        anyhow::bail!(
            "invalid --heartbeat-secs {}: must be less than --lease-secs ({})",
            args.heartbeat_secs,
            args.lease_secs
        );
    }
    let me = std::env::current_exe().context("finding this executable")?;
    let tracker_bin = match args.tracker_bin {
        Some(p) => p,
        None => me.with_file_name("tensortune-tracker"),
    };
    let config = LoadConfig {
        dir: args.dir,
        tracker_bin,
        load_bin: me,
        workers: args.workers,
        groups: args.groups,
        jobs: args.jobs,
        trials: args.trials,
        measure: Duration::from_millis(args.measure_ms),
        lease_secs: args.lease_secs,
        heartbeat_secs: args.heartbeat_secs,
        deadline: Duration::from_secs(args.deadline_secs),
        faults: args.fault,
        fault_gap: (args.fault_gap_secs > 0).then(|| Duration::from_secs(args.fault_gap_secs)),
        hold: Duration::from_secs(args.hold_secs),
        tmpfs_mib: args.tmpfs_mib,
        seed: args.seed,
        pg: args.pg,
        trackers: args.trackers,
        batch: args.batch,
        job_batch: args.job_batch.unwrap_or(0),
        report_gather: Duration::from_millis(args.report_gather_ms),
    };
    let summary = load::run(config).await?;
    println!("{summary}");
    if let Some(path) = args.json {
        std::fs::write(&path, serde_json::to_string_pretty(&summary)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if !summary.ok() {
        std::process::exit(1);
    }
    Ok(())
}

/// Cancels `shutdown` on SIGTERM or Ctrl-C.
async fn stop_on_term(shutdown: CancellationToken) {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
    shutdown.cancel();
}
