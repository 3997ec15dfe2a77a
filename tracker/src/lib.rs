//! The tensortune tracker: holds tuning jobs, proposes configs to measure, leases measurement tasks
//! to worker daemons and keeps every measurement record in SQLite. It serves two gRPC services on
//! one listener: `Tuning` (people and scripts) and `Dispatch` (workers).
//!
//! # Layout
//!
//! - [`TrackerConfig`] (`config.rs`): database (path or URL), lease, heartbeat and retry settings.
//! - [`run`] (here): opens the store, resumes unfinished jobs, serves until shutdown.
//! - `tracker.rs`: the shared state and `Write`, the unit of change (writer lock + transaction +
//!   the in-memory searches it keeps in step).
//! - `jobs.rs`: submission and cancellation, job snapshots, best records and exports.
//! - `progress.rs`: proposing tasks (with reuse of identical records), counting finished trials and
//!   feeding their outcomes to the search, a job-wide trial budget shared by expected gain
//!   (`tensortune_search::schedule`), early stopping, finishing workloads and jobs.
//! - `finalists.rs`: noise-aware winners: a workload whose tuning ended re-measures its fastest
//!   configs in one finalist task, and the fastest re-measurement wins.
//! - `dispatch.rs`: worker registration, leasing with long polls, heartbeats, reports (one or a
//!   batch per call).
//! - `commits.rs`: group commit: the leases, heartbeats and reports of many calls share one write.
//! - `changes.rs`: what those calls ask of a group (`Op`), what it did (`Done`), the queue they wait
//!   in, and the lease renewals of heartbeats answered without a write (stored by the reaper).
//! - `drift.rs`: workers' times of the shared reference kernel against their class's median;
//!   drifting workers are flagged (and logged), never stopped.
//! - `leases.rs`: the lease reaper and the resume step at start.
//! - `tuner.rs`: the `Tuner` trait and the `random`, `grid` and `model` tuners (the last is
//!   `tensortune_search`'s model-guided tuner).
//! - `search.rs`: per-workload valid configs (with feature rows for a model), tuner state and
//!   finished trials' outcomes, and transfer priors, computed on blocking threads.
//! - `auth.rs`: bearer tokens with roles, the interceptor that checks them on every call, and the
//!   `token` commands' store functions. `limits.rs`: per-token rate limits.
//! - `counters.rs`: counters of what happened since start (leases expired, reports stored).
//! - `http.rs`: the read-only HTTP side: the dashboard (`dashboard.html`), its JSON, `/metrics`.
//! - `http.rs`: the read-only HTTP side: the dashboard (`dashboard.html`), its JSON, `/metrics`,
//!   and the probes `/healthz` and `/readyz`.
//! - `health.rs`: readiness (migrations applied, store writable) for `/readyz` and the gRPC
//!   health-checking service. `version.rs`: the protocol version check in front of every call.
//! - `backup.rs`, `prune.rs`: the `backup` (a consistent SQLite copy while serving) and `prune`
//!   (superseded records of ended jobs) commands.
//! - `events.rs`: change notifications for job watchers and waiting workers.
//! - `store/`: the queries, one function each, per table, on SQLite or PostgreSQL (several trackers
//!   may share one PostgreSQL database).
//! - `service/`: the tonic services and the wire <-> domain conversions.
//! - `model.rs`, `error.rs`: domain types and the error enum with its one `tonic::Status` mapping.
//! - [`load`]: the `tensortune-load` tool: many `sim` workers and faults (killed and stopped
//!   workers, a killed tracker, garbage on the port, a full or unwritable disk) against a tracker
//!   process on loopback, checked in its database afterwards.
//!
//! The database is the source of truth: a tracker killed at any point and started again on the
//! same file resumes every unfinished job and loses no acknowledged record.

mod auth;
mod backup;
mod changes;
mod commits;
mod config;
mod counters;
mod dispatch;
mod drift;
mod error;
mod events;
mod finalists;
mod health;
mod http;
mod jobs;
mod leases;
mod limits;
pub mod load;
mod model;
mod packs;
mod plausible;
mod progress;
mod prune;
mod search;
mod service;
mod store;
mod tracker;
mod tuner;
mod version;

use std::sync::Arc;

use anyhow::Context;
use tensortune_proto::pb::dispatch_server::DispatchServer;
use tensortune_proto::pb::tuning_server::TuningServer;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};

pub use auth::{Role, TokenInfo, add_token, list_tokens, revoke_token};
pub use backup::{BackupSummary, backup, verify as verify_backup};
pub use config::{SUBMIT_BURST, ServerTls, TrackerConfig};
pub use packs::warm as warm_record_packs;
pub use prune::{PruneSummary, prune};

use auth::Gate;
use version::Versioned;

use service::dispatch::DispatchService;
use service::tuning::TuningService;
use tracker::Tracker;

/// Runs a tracker on `listener` until `shutdown` is cancelled, then stops gracefully: in-flight
/// calls finish, streams and long polls end, background tasks stop, the database is closed.
pub async fn run(config: TrackerConfig, listener: TcpListener, shutdown: CancellationToken) -> anyhow::Result<()> {
    run_with_http(config, listener, None, shutdown).await
}

/// [`run`], also serving the read-only HTTP side (dashboard at `/`, JSON under `/api/`,
/// Prometheus metrics at `/metrics`) on `http` when given.
pub async fn run_with_http(
    config: TrackerConfig,
    listener: TcpListener,
    http: Option<TcpListener>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    config.validate()?;
    let pool = store::open_serving(&config.db).await?;
    let local = listener.local_addr().context("reading the listener's address")?;
    // Everything this call started stops with `stop`: the caller's token, or a failure to serve.
    let stop = shutdown.child_token();
    let tracker = Tracker::new(pool.clone(), config, stop.clone());
    tracker.tokens.load(&pool).await.context("reading the tokens table")?;
    let open = !tracker.tokens.required();
    let tls = tracker.config.tls.clone();
    if !local.ip().is_loopback() && (open || tls.is_none()) && !tracker.config.insecure {
        let missing = match (open, tls.is_none()) {
            (true, true) => "without tokens and without TLS",
            (true, false) => "without tokens",
            _ => "without TLS (tokens would cross the network in clear)",
        };
        anyhow::bail!(
            "refusing to serve on {local} {missing}: anyone who reaches it could submit jobs or report results. \
             Make tokens with `tensortune-tracker token add`, give --tls-cert/--tls-key, or listen on 127.0.0.1; \
             --insecure serves anyway"
        );
    }
    tracker.resume().await.context("resuming unfinished jobs")?;

    let tasks = TaskTracker::new();
    // The shipped record packs are parsed now where a GPU's class is in the store already, else
    // when the first one registers (`packs::warm`).
    if tracker.config.prior_pack
        && store::classes::keys(&pool)
            .await
            .context("reading the device classes")?
            .iter()
            .any(|c| packs::takes_shipped(c))
    {
        packs::warm();
    }
    tasks.spawn(commits::committer(Arc::clone(&tracker), stop.clone()));
    tasks.spawn(tracker::proposer(Arc::clone(&tracker), stop.clone()));
    tasks.spawn(leases::reaper(Arc::clone(&tracker), stop.clone()));
    tasks.spawn(relay_notifications(Arc::clone(&tracker), stop.clone()));
    tasks.spawn(Arc::clone(&tracker.tokens).refresh(pool.clone(), stop.clone()));
    tasks.spawn(prune::every_period(Arc::clone(&tracker), stop.clone()));
    tasks.spawn(store::statistics::keep_current(pool.clone(), stop.clone()));
    if let Some(http) = http {
        let addr = http.local_addr().context("reading the HTTP listener's address")?;
        tracing::info!(%addr, "dashboard and /metrics serving");
        let (tracker, stop) = (Arc::clone(&tracker), stop.clone());
        tasks.spawn(async move {
            if let Err(e) = http::serve(tracker, http, stop.clone()).await {
                tracing::error!(error = %e, "the HTTP side stopped; gRPC goes on");
            }
        });
    }
    let db = store::redact(&tracker.config.db.to_string_lossy());
    tracing::info!(
        addr = %local,
        db = %db,
        auth = if open { "none (no tokens in the database)" } else { "tokens" },
        tls = match &tls { None => "off", Some(t) if t.client_ca_pem.is_some() => "on, workers present certificates", Some(_) => "on" },
        "tracker serving"
    );

    let mut builder = Server::builder();
    let worker_certs = tls.as_ref().is_some_and(|t| t.client_ca_pem.is_some());
    if let Some(tls) = &tls {
        let mut config = ServerTlsConfig::new().identity(Identity::from_pem(&tls.cert_pem, &tls.key_pem));
        if let Some(ca) = &tls.client_ca_pem {
            // Verified when presented; required by the Dispatch gate, optional for Tuning callers.
            config = config.client_ca_root(Certificate::from_pem(ca)).client_auth_optional(true);
        }
        builder = builder.tls_config(config).context("configuring TLS (--tls-cert/--tls-key/--tls-client-ca)")?;
    }
    let tuning_gate =
        Versioned::new("Tuning", Gate::new(Arc::clone(&tracker.tokens), "Tuning", &[Role::Client, Role::Admin], false));
    let dispatch_gate = Versioned::new(
        "Dispatch",
        Gate::new(Arc::clone(&tracker.tokens), "Dispatch", &[Role::Worker, Role::Admin], worker_certs),
    );
    // The health service takes no token and no version: probes have neither.
    let (reporter, health_service) = tonic_health::server::health_reporter();
    // Until the first readiness check answers, a probe reads NOT_SERVING (not "service not
    // registered", which a probe before that check got).
    for service in health::SERVICES {
        reporter.set_service_status(service, tonic_health::ServingStatus::NotServing).await;
    }
    tasks.spawn(health::report_grpc(Arc::clone(&tracker), reporter, stop.clone()));
    let serve = builder
        .add_service(health_service)
        .add_service(TuningServer::with_interceptor(
            TuningService::new(Arc::clone(&tracker), tasks.clone()),
            tuning_gate,
        ))
        .add_service(DispatchServer::with_interceptor(DispatchService::new(Arc::clone(&tracker)), dispatch_gate))
        .serve_with_incoming_shutdown(
            TcpIncoming::from(listener).with_nodelay(Some(true)),
            stop.clone().cancelled_owned(),
        );
    tokio::pin!(serve);
    // Once stopped, the listener accepts nothing more and streams and long polls end at once;
    // other calls get the grace to finish. Whatever still runs after it is dropped: its
    // transaction rolls back, and since its caller never got an answer, nothing acknowledged is
    // lost (the caller retries against the next tracker run).
    let grace = tracker.config.shutdown_grace;
    let served = tokio::select! {
        served = &mut serve => served,
        () = async { stop.cancelled().await; tokio::time::sleep(grace).await } => {
            tracing::warn!(grace_s = grace.as_secs_f64(), "calls still in flight after the shutdown grace; dropping them");
            Ok(())
        }
    };

    stop.cancel();
    tasks.close();
    // Calls cut off above may still hold database connections on their own tasks: closing the
    // pool waits for them, within the grace again. Past it the process ends; SQLite (or
    // PostgreSQL) rolls back whatever they had not committed.
    let drained = async move {
        tasks.wait().await;
        drop(tracker);
        pool.close().await;
    };
    if tokio::time::timeout(grace.max(std::time::Duration::from_secs(1)), drained).await.is_err() {
        tracing::warn!("calls still held database connections after the shutdown grace; leaving them");
    }
    tracing::info!(addr = %local, "tracker stopped");
    served.context("serving gRPC")
}

/// On PostgreSQL, wakes this tracker's long-polling leases when another tracker on the database
/// made tasks pending, and its job watchers when another changed their job (the `pg_notify`s of
/// `Write::commit`), until `stop`. A notification lost while the listening connection is down
/// costs a waiting worker at most its long poll, after which it asks again, and a watcher the
/// change (the next one shows it). Nothing to do on SQLite, where this tracker makes every change
/// itself.
async fn relay_notifications(tracker: Arc<Tracker>, stop: CancellationToken) {
    let store::Pool::Postgres(pool) = &tracker.pool else { return };
    loop {
        let relay = async {
            let mut listener = sqlx::postgres::PgListener::connect_with(pool).await?;
            listener.listen_all([store::TASKS_CHANNEL, store::JOBS_CHANNEL]).await?;
            let me = tracker.instance.to_string();
            loop {
                let n = listener.recv().await?;
                let (from, jobs) = n.payload().split_once(':').unwrap_or((n.payload(), ""));
                if from == me {
                    continue;
                }
                if n.channel() == store::TASKS_CHANNEL {
                    // How many became pending, when the writer said (`Write::commit`); every
                    // waiter is woken otherwise.
                    tracker.events.tasks_ready(jobs.parse().ok());
                } else {
                    for id in jobs.split(',').filter_map(|id| id.parse().ok()) {
                        tracker.events.job_changed(id);
                    }
                }
            }
            #[allow(unreachable_code)]
            Ok::<(), sqlx::Error>(())
        };
        let relayed = tokio::select! {
            () = stop.cancelled() => return,
            r = relay => r,
        };
        let Err(failed) = relayed else { continue };
        tracing::warn!(error = %failed, "listening for other trackers' tasks failed; listening again in 1 s");
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
        }
    }
}
