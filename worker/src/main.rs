//! `tensortune-worker`: the worker daemon for one GPU, every GPU of the machine, or the `sim` device.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser};
use serde::Deserialize;
use tensortune_proto::access::Access;
use tensortune_worker::{CHILD_ARG, DeviceSpec, WorkerConfig};
use tokio_util::sync::CancellationToken;

/// Leases measurement tasks from a tensortune tracker, compiles them with NVRTC and times them on a
/// GPU, reporting one record per task.
#[derive(Parser, Debug, Clone, PartialEq)]
#[command(version)]
struct Args {
    /// A TOML file of settings: any flag below as a key, spelled as the flag without its dashes
    /// (device = "cuda:all", token-file = "/run/credentials/tensortune-worker.service/token").
    /// Flags and environment variables win over it; an unknown key is an error.
    #[arg(long)]
    config: Option<PathBuf>,
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

/// The `--config` file: a key per flag, spelled as the flag.
#[derive(Deserialize, Default, Debug, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct ConfigFile {
    tracker: Option<String>,
    device: Option<String>,
    name: Option<String>,
    compile_threads: Option<usize>,
    cache_dir: Option<PathBuf>,
    no_disk_cache: Option<bool>,
    measure_timeout_secs: Option<u64>,
    token_file: Option<PathBuf>,
    tls_ca: Option<PathBuf>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
}

impl Args {
    /// Parses the command line and merges `--config` under it.
    fn load() -> anyhow::Result<Args> {
        let matches = Args::command().get_matches();
        let args = Args::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
        args.merged(&matches)
    }

    /// The flags (and environment variables) given, the rest from `--config` when given, then the
    /// defaults.
    fn merged(mut self, matches: &ArgMatches) -> anyhow::Result<Args> {
        let Some(path) = self.config.clone() else { return Ok(self) };
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading --config {}", path.display()))?;
        let file: ConfigFile =
            toml::from_str(&text).map_err(|e| anyhow::anyhow!("--config {}: {e}", path.display()))?;
        let given =
            |id: &str| matches!(matches.value_source(id), Some(ValueSource::CommandLine | ValueSource::EnvVariable));
        tensortune_proto::take_settings!(
            self, file, given;
            value: tracker, compile_threads, no_disk_cache, measure_timeout_secs;
            optional: name, cache_dir, token_file, tls_ca, tls_cert, tls_key
        );
        if !given("device")
            && let Some(device) = file.device
        {
            self.device = device.parse().map_err(|e| anyhow::anyhow!("--config {}: device: {e}", path.display()))?;
        }
        if self.no_disk_cache && self.cache_dir.is_some() {
            anyhow::bail!("--config {}: cache-dir and no-disk-cache exclude each other", path.display());
        }
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            anyhow::bail!("--config {}: tls-cert and tls-key go together", path.display());
        }
        Ok(self)
    }
}

fn main() -> anyhow::Result<()> {
    if std::env::args().nth(1).as_deref() == Some(tensortune_worker::COMPILE_CHILD_ARG) {
        return tensortune_worker::compile_child_main();
    }
    if std::env::args().nth(1).as_deref() == Some(CHILD_ARG) {
        let device = std::env::args().nth(2).unwrap_or_else(|| "cuda:0".to_owned());
        return tensortune_worker::child_main(device.parse()?);
    }
    let args = Args::load()?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn args(argv: &[&str]) -> anyhow::Result<Args> {
        let matches =
            Args::command().try_get_matches_from(std::iter::once("tensortune-worker").chain(argv.iter().copied()))?;
        Args::from_arg_matches(&matches)?.merged(&matches)
    }

    #[test]
    fn every_key_of_the_file_is_taken_and_flags_win_over_it() {
        let dir = tempfile::TempDir::new().unwrap();
        let file = dir.path().join("worker.toml");
        std::fs::write(
            &file,
            r#"
            tracker = "https://tracker.example:7070"
            device = "cuda:all"
            name = "gpu-box-3"
            compile-threads = 12
            cache-dir = "/var/cache/tensortune"
            no-disk-cache = false
            measure-timeout-secs = 90
            token-file = "/run/credentials/tensortune-worker.service/token"
            tls-ca = "/etc/tensortune/ca.pem"
            tls-cert = "/etc/tensortune/worker.pem"
            tls-key = "/etc/tensortune/worker.key"
            "#,
        )
        .unwrap();
        let file = file.to_str().unwrap();
        // An environment variable of the machine running the test must not decide it.
        for var in ["TENSORTUNE_TRACKER", "TENSORTUNE_TLS_CA", "TENSORTUNE_TLS_CERT", "TENSORTUNE_TLS_KEY"] {
            assert!(std::env::var_os(var).is_none(), "unset {var} to run this test");
        }
        let got = args(&["--config", file]).unwrap();
        let expected = Args {
            config: Some(file.into()),
            tracker: "https://tracker.example:7070".into(),
            device: DeviceSpec::CudaAll,
            name: Some("gpu-box-3".into()),
            compile_threads: 12,
            cache_dir: Some("/var/cache/tensortune".into()),
            no_disk_cache: false,
            measure_timeout_secs: 90,
            token_file: Some("/run/credentials/tensortune-worker.service/token".into()),
            tls_ca: Some("/etc/tensortune/ca.pem".into()),
            tls_cert: Some("/etc/tensortune/worker.pem".into()),
            tls_key: Some("/etc/tensortune/worker.key".into()),
        };
        assert_eq!(got, expected);
        let over = args(&["--config", file, "--device", "sim", "--compile-threads", "0"]).unwrap();
        assert_eq!((over.device, over.compile_threads), (DeviceSpec::Sim, 0));
        assert_eq!(over.measure_timeout_secs, 90);
        assert_eq!(args(&[]).unwrap().device, DeviceSpec::Cuda(0));
    }

    #[test]
    fn the_shipped_example_config_is_valid() {
        let file: ConfigFile = toml::from_str(include_str!("../../deploy/worker.toml")).unwrap();
        assert_eq!(
            file.device.as_deref().map(str::parse::<DeviceSpec>).transpose().unwrap(),
            Some(DeviceSpec::CudaAll)
        );
    }

    #[test]
    fn an_unknown_key_or_a_bad_value_is_refused_naming_it_and_the_file() {
        let dir = tempfile::TempDir::new().unwrap();
        let file = dir.path().join("worker.toml");
        std::fs::write(&file, "device = \"sim\"\ngpu = 0\n").unwrap();
        let path = file.to_str().unwrap();
        let e = format!("{:#}", args(&["--config", path]).unwrap_err());
        assert!(e.contains("gpu") && e.contains("unknown field") && e.contains(path), "{e}");
        std::fs::write(&file, "device = \"gpu:0\"\n").unwrap();
        let e = format!("{:#}", args(&["--config", path]).unwrap_err());
        assert!(e.contains("device") && e.contains("gpu:0") && e.contains(path), "{e}");
    }
}
