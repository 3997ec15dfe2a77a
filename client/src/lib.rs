//! The `tensortune` command line: tune a shape on the local GPU in one command, or drive a tracker
//! of a cluster (submit, follow, query, export).
//!
//! As a library, [`api::Client`] submits jobs, follows them and answers best-kernel queries.
//!
//! # Layout
//!
//! - [`api`]: the client as a library.
//! - [`cli`]: flags, parsed and validated first.
//! - [`session`]: a remote tracker, or an embedded tracker (and local worker) for one command.
//! - [`commands`]: one function per command.
//! - [`bench`]: `tensortune bench`, suites of workloads tuned one after another.
//! - [`export`]: `tensortune export`, best kernels as a bundle a program loads.
//! - [`model`]: `tensortune tune --suite`, a model's workloads as one job and its predicted time.
//! - [`extract`]: `tensortune extract`, an ONNX model's workloads as a suite.
//! - [`onnx`]: the messages of onnx.proto that `extract` reads.
//! - [`replay`]: `tensortune replay`, tuners against recorded measurements.
//! - [`plot`]: `tensortune plot`, convergence, speedup and replay pictures.
//! - [`report`]: JSON views of jobs and records, and the tables printed.
//! - [`selftest`]: `tensortune selftest`, every template checked on the local GPU.

pub mod api;
pub mod bench;
pub mod cli;
pub mod commands;
pub mod export;
pub mod extract;
pub mod model;
pub mod onnx;
pub mod plot;
pub mod replay;
pub mod report;
pub mod selftest;
pub mod session;

use cli::{Cli, Command};

/// Runs one parsed command line.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    let access = tensortune_proto::access::Access::load(
        cli.token_file.as_deref(),
        cli.tls_ca.as_deref(),
        cli.tls_cert.as_deref(),
        cli.tls_key.as_deref(),
    )?;
    session::set_access(access.clone());
    let tracker = cli.tracker.as_deref();
    let db = cli.db_path();
    match &cli.command {
        Command::Tune(t) => match &t.workload {
            Some(w) => commands::tune(tracker, db, w).await,
            None => model::tune(tracker, db, t).await,
        },
        Command::Extract(e) => extract::run(e),
        Command::Bench(b) => bench::run(tracker, cli.db.as_deref(), b).await,
        Command::Best { workload, device_class, json } => {
            commands::best(tracker, db, workload, device_class.as_deref(), *json).await
        }
        Command::Jobs { state, limit, json } => commands::jobs(tracker, db, state, *limit, *json).await,
        Command::Job { id, json } => commands::job(tracker, db, *id, "show", *json).await,
        Command::Watch { id, json } => commands::job(tracker, db, *id, "watch", *json).await,
        Command::Cancel { id } => commands::job(tracker, db, *id, "cancel", false).await,
        Command::Workers { json } => commands::workers(tracker, db, *json).await,
        Command::Records { command } => commands::records(tracker, db, command).await,
        Command::Export(e) => export::run(tracker, db, e).await,
        Command::Replay(r) => replay::run(r),
        Command::Selftest(s) => commands::selftest(s).await,
        Command::Plot(p) => plot::run(tracker, db, p).await,
        Command::Quarantine { worker, reason } => commands::quarantine(tracker, db, *worker, reason).await,
        Command::Worker(w) => {
            let Some(url) = tracker else {
                anyhow::bail!("tensortune worker needs --tracker URL (the tracker it serves)");
            };
            let device: tensortune_worker::DeviceSpec = w.device.parse()?;
            let mut config = tensortune_worker::WorkerConfig::new(url, device);
            config.name = w.name.clone();
            config.compile_threads = w.compile_threads;
            config.access = access;
            if w.cache_dir.is_some() {
                config.cache_dir = w.cache_dir.clone();
            }
            let token = tokio_util::sync::CancellationToken::new();
            let stop = token.clone();
            tokio::spawn(async move {
                let _ = tokio::signal::ctrl_c().await;
                stop.cancel();
            });
            tensortune_worker::run(config, token).await
        }
    }
}
