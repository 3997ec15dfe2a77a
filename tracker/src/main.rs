//! `tensortune-tracker`: serves the tracker on an address until Ctrl-C or SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use tensortune_tracker::TrackerConfig;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

/// The tensortune tracker: tuning jobs, leased dispatch to workers, the SQLite record store.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Address to serve gRPC on.
    #[arg(long, default_value = "127.0.0.1:7070")]
    listen: SocketAddr,
    /// SQLite database file (created when missing).
    #[arg(long, default_value = "tensortune.db")]
    db: PathBuf,
    /// Seconds a worker holds a task without a heartbeat.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    lease_secs: u64,
    /// Seconds between a worker's heartbeats; less than the lease.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    heartbeat_secs: u64,
    /// Expired leases after which a task is recorded as device_lost.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    max_attempts: u32,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();

    let config = TrackerConfig {
        db: args.db,
        lease: Duration::from_secs(args.lease_secs),
        heartbeat: Duration::from_secs(args.heartbeat_secs),
        max_attempts: args.max_attempts,
    };
    let listener =
        tokio::net::TcpListener::bind(args.listen).await.with_context(|| format!("binding {}", args.listen))?;
    let shutdown = CancellationToken::new();
    tokio::spawn(stop_on_signal(shutdown.clone()));
    tensortune_tracker::run(config, listener, shutdown).await
}

/// Cancels `shutdown` on Ctrl-C or SIGTERM.
async fn stop_on_signal(shutdown: CancellationToken) {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM; only Ctrl-C stops the tracker");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        result = ctrl_c => if let Err(e) = result { tracing::warn!(error = %e, "cannot listen for Ctrl-C") },
        () = terminate => {}
    }
    tracing::info!("shutting down");
    shutdown.cancel();
}
