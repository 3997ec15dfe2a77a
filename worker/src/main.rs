//! `tensortune-worker`: the worker daemon for one GPU, every GPU of the machine, or the `sim` device.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use tensortune_proto::access::Access;
use tensortune_worker::{CHILD_ARG, DeviceSpec, WorkerConfig};
use tokio_util::sync::CancellationToken;

/// Leases measurement tasks from a tensortune tracker, compiles them with NVRTC and times them on a
/// GPU, reporting one record per task.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// The tracker's address, or several comma-separated (trackers sharing one PostgreSQL
    /// database): calls move to the next when one is unreachable.
    #[arg(long, env = "TENSORTUNE_TRACKER", default_value = "http://127.0.0.1:7070")]
    tracker: String,
    /// The device to measure on: cuda, cuda:N, sim, or several GPUs with one worker each:
    /// cuda:0,1 or cuda:all.
    #[arg(long, default_value = "cuda:0")]
    device: DeviceSpec,
    /// Name shown by the tracker [default: <hostname>/<device>]; with several GPUs each worker
    /// is <name>/cuda:N.
    #[arg(long)]
    name: Option<String>,
    /// NVRTC threads; 0 uses every core. With several GPUs, each worker gets an even share.
    #[arg(long, default_value_t = 0)]
    compile_threads: usize,
    /// Directory of the on-disk cubin cache [default: $XDG_CACHE_HOME/tensortune or ~/.cache/tensortune].
    #[arg(long, conflicts_with = "no_disk_cache")]
    cache_dir: Option<PathBuf>,
    /// Keep compiled images in memory only.
    #[arg(long)]
    no_disk_cache: bool,
    /// Seconds one measurement may take before its child is killed and the task reported as timeout.
    #[arg(long, default_value_t = 60)]
    measure_timeout_secs: u64,
    /// File holding the worker token (else $TENSORTUNE_TOKEN_FILE, else $TENSORTUNE_TOKEN). Never
    /// the token itself on the command line.
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// PEM CA that signed the tracker's certificate (for an https:// tracker).
    #[arg(long, env = "TENSORTUNE_TLS_CA")]
    tls_ca: Option<PathBuf>,
    /// PEM client certificate, for a tracker that requires mutual TLS (with --tls-key).
    #[arg(long, env = "TENSORTUNE_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM key of --tls-cert.
    #[arg(long, env = "TENSORTUNE_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    if std::env::args().nth(1).as_deref() == Some(tensortune_worker::COMPILE_CHILD_ARG) {
        return tensortune_worker::compile_child_main();
    }
    if std::env::args().nth(1).as_deref() == Some(CHILD_ARG) {
        let device = std::env::args().nth(2).unwrap_or_else(|| "cuda:0".to_owned());
        return tensortune_worker::child_main(device.parse()?);
    }
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();

    let mut config = WorkerConfig::new(args.tracker, args.device);
    config.access = Access::load(
        args.token_file.as_deref(),
        args.tls_ca.as_deref(),
        args.tls_cert.as_deref(),
        args.tls_key.as_deref(),
    )?;
    config.name = args.name;
    config.compile_threads = args.compile_threads;
    config.measure_timeout = Duration::from_secs(args.measure_timeout_secs.max(1));
    if args.no_disk_cache {
        config.cache_dir = None;
    } else if let Some(dir) = args.cache_dir {
        config.cache_dir = Some(dir);
    }

    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(async {
        let shutdown = CancellationToken::new();
        let run = tensortune_worker::run(config, shutdown.clone());
        tokio::pin!(run);
        tokio::select! {
            result = &mut run => return result,
            signal = terminated() => {
                signal?;
                tracing::info!("shutting down (again to stop at once)");
                shutdown.cancel();
            }
        }
        tokio::select! {
            result = &mut run => result,
            _ = terminated() => anyhow::bail!("stopped before the shutdown finished"),
        }
    })
}

/// Resolves on Ctrl-C or SIGTERM.
async fn terminated() -> anyhow::Result<()> {
    let mut term =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).context("listening for SIGTERM")?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r.context("listening for Ctrl-C"),
        _ = term.recv() => Ok(()),
    }
}
