//! The tensortune tracker: holds tuning jobs, proposes configs to measure, leases measurement tasks
//! to worker daemons and keeps every measurement record in SQLite. It serves two gRPC services on
//! one listener: `Tuning` (people and scripts) and `Dispatch` (workers).
//!
//! # Layout
//!
//! - [`TrackerConfig`] (`config.rs`): database path, lease, heartbeat and retry settings.
//! - [`run`] (here): opens the store, resumes unfinished jobs, serves until shutdown.
//! - `tracker.rs`: the shared state and `Write`, the unit of change (writer lock + transaction +
//!   the in-memory searches it keeps in step).
//! - `jobs.rs`: submission and cancellation, job snapshots, best records and exports.
//! - `progress.rs`: proposing tasks (with reuse of identical records), counting finished trials and
//!   feeding their outcomes to the search, a job-wide trial budget shared by expected gain
//!   (`tensortune_search::schedule`), early stopping, finishing workloads and jobs.
//! - `finalists.rs`: noise-aware winners: a workload whose tuning ended re-measures its fastest
//!   configs in one finalist task, and the fastest re-measurement wins.
//! - `dispatch.rs`: worker registration, leasing with long polls, heartbeats, reports.
//! - `drift.rs`: workers' times of the shared reference kernel against their class's median;
//!   drifting workers are flagged (and logged), never stopped.
//! - `leases.rs`: the lease reaper and the resume step at start.
//! - `tuner.rs`: the `Tuner` trait and the `random`, `grid` and `model` tuners (the last is
//!   `tensortune_search`'s model-guided tuner).
//! - `search.rs`: per-workload valid configs (with feature rows for a model), tuner state and
//!   finished trials' outcomes, and transfer priors, computed on blocking threads.
//! - `events.rs`: change notifications for job watchers and waiting workers.
//! - `store/`: the SQLite queries, one function each, per table.
//! - `service/`: the tonic services and the wire <-> domain conversions.
//! - `model.rs`, `error.rs`: domain types and the error enum with its one `tonic::Status` mapping.
//!
//! The database is the source of truth: a tracker killed at any point and started again on the
//! same file resumes every unfinished job and loses no acknowledged record.

mod config;
mod dispatch;
mod drift;
mod error;
mod events;
mod finalists;
mod jobs;
mod leases;
mod model;
mod progress;
mod search;
mod service;
mod store;
mod tracker;
mod tuner;

use std::sync::Arc;

use anyhow::Context;
use tensortune_proto::pb::dispatch_server::DispatchServer;
use tensortune_proto::pb::tuning_server::TuningServer;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;

pub use config::TrackerConfig;

use service::dispatch::DispatchService;
use service::tuning::TuningService;
use tracker::Tracker;

/// Runs a tracker on `listener` until `shutdown` is cancelled, then stops gracefully: in-flight
/// calls finish, streams and long polls end, background tasks stop, the database is closed.
pub async fn run(config: TrackerConfig, listener: TcpListener, shutdown: CancellationToken) -> anyhow::Result<()> {
    config.validate()?;
    let pool = store::open(&config.db).await?;
    let local = listener.local_addr().context("reading the listener's address")?;
    // Everything this call started stops with `stop`: the caller's token, or a failure to serve.
    let stop = shutdown.child_token();
    let tracker = Tracker::new(pool.clone(), config, stop.clone());
    tracker.resume().await.context("resuming unfinished jobs")?;

    let tasks = TaskTracker::new();
    tasks.spawn(leases::reaper(Arc::clone(&tracker), stop.clone()));
    let db = tracker.config.db.display().to_string();
    tracing::info!(addr = %local, db = %db, "tracker serving");

    let served = Server::builder()
        .add_service(TuningServer::new(TuningService::new(Arc::clone(&tracker), tasks.clone())))
        .add_service(DispatchServer::new(DispatchService::new(Arc::clone(&tracker))))
        .serve_with_incoming_shutdown(
            TcpIncoming::from(listener).with_nodelay(Some(true)),
            stop.clone().cancelled_owned(),
        )
        .await;

    stop.cancel();
    tasks.close();
    tasks.wait().await;
    drop(tracker);
    pool.close().await;
    tracing::info!(addr = %local, "tracker stopped");
    served.context("serving gRPC")
}
