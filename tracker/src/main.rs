//! `tensortune-tracker`: serves the tracker on an address until Ctrl-C or SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::parser::ValueSource;
use clap::{ArgMatches, Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use serde::Deserialize;
use tensortune_tracker::{Role, ServerTls, TrackerConfig};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

/// The tensortune tracker: tuning jobs, leased dispatch to workers, the SQLite record store.
///
/// Without a subcommand it serves; `token` manages the bearer tokens callers present, `backup`
/// copies a serving database, `prune` drops superseded records of ended jobs.
#[derive(Parser, Debug)]
#[command(version, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve gRPC (the default).
    Serve(ServeArgs),
    /// Make, list and revoke the tokens workers and clients present (stored hashed in the
    /// database; a running tracker picks changes up within a second).
    Token {
        #[command(subcommand)]
        action: TokenAction,
    },
    /// Copy a SQLite database consistently, also while a tracker serves it, and check the copy
    /// (PostgreSQL: use pg_dump).
    Backup {
        /// The new file to write (it must not exist).
        #[arg(long)]
        to: PathBuf,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Delete the records of jobs that ended more than N days ago, keeping every workload's best,
    /// its finalists and records other jobs reused. Safe while a tracker serves the database.
    Prune {
        /// Keep everything of jobs that ended within this many days (0: prune every ended job).
        #[arg(long)]
        retain_days: u32,
        #[command(flatten)]
        db: DbArgs,
    },
}

/// The database of a maintenance command: --db, else the `db` key of --config, else the default.
#[derive(Args, Debug)]
struct DbArgs {
    /// The database: a SQLite file (PATH or sqlite://PATH) or postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE
    /// [default: the db key of --config, else tensortune.db].
    #[arg(long)]
    db: Option<PathBuf>,
    /// The tracker's TOML config file, whose db key names the database when --db is not given.
    #[arg(long)]
    config: Option<PathBuf>,
}

impl DbArgs {
    fn resolve(self) -> anyhow::Result<PathBuf> {
        if let Some(db) = self.db {
            return Ok(db);
        }
        let file = match &self.config {
            Some(path) => ServeFile::read(path)?,
            None => ServeFile::default(),
        };
        Ok(file.db.unwrap_or_else(|| PathBuf::from("tensortune.db")))
    }
}

#[derive(Subcommand, Debug)]
enum TokenAction {
    /// Make a token and print it (once: only its hash is kept). Once a database holds a token,
    /// every call needs one.
    Add {
        /// A unique name, e.g. the worker's host or the person's login.
        #[arg(long)]
        name: String,
        /// worker (register, lease, report), client (submit and cancel its own jobs, read) or
        /// admin (everything).
        #[arg(long)]
        role: Role,
        /// Write the token to this file (created readable by its owner only) instead of stdout.
        #[arg(long)]
        out: Option<PathBuf>,
        /// The database: a SQLite file (PATH or sqlite://PATH) or postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE.
        #[arg(long, default_value = "tensortune.db")]
        db: PathBuf,
    },
    /// List tokens (names, roles, dates; never secrets).
    List {
        /// The database: a SQLite file (PATH or sqlite://PATH) or postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE.
        #[arg(long, default_value = "tensortune.db")]
        db: PathBuf,
    },
    /// Revoke a token by name or id.
    Revoke {
        /// The token's name or id.
        name: String,
        /// The database: a SQLite file (PATH or sqlite://PATH) or postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE.
        #[arg(long, default_value = "tensortune.db")]
        db: PathBuf,
    },
}

#[derive(Args, Debug, Clone, PartialEq)]
struct ServeArgs {
    /// A TOML file of settings: any flag below as a key, spelled as the flag without its dashes
    /// (lease-secs = 30, listen = "0.0.0.0:7070"). Flags given on the command line win over it; an
    /// unknown key is an error.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Address to serve gRPC on. Addresses other than loopback need tokens and TLS (or --insecure).
    #[arg(long, default_value = "127.0.0.1:7070")]
    listen: SocketAddr,
    /// The database: a SQLite file (PATH or sqlite://PATH, created when missing) or a PostgreSQL
    /// database (postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE), which several trackers may share.
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
    /// PEM certificate chain to serve TLS with (with --tls-key).
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// PEM CA: workers must present a client certificate it signed (mutual TLS); clients may.
    #[arg(long, requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    /// Serve on a non-loopback address even without tokens or TLS.
    #[arg(long)]
    insecure: bool,
    /// Serve the read-only dashboard (/) and Prometheus metrics (/metrics) over HTTP here.
    #[arg(long)]
    http: Option<SocketAddr>,
    /// Allow --http on a non-loopback address: the page and metrics need no token and show every
    /// job's workloads, labels and results.
    #[arg(long)]
    http_public: bool,
    /// Jobs one token may submit per second on average (bursts of 50 pass at once).
    #[arg(long, default_value_t = 5.0)]
    submit_rate: f64,
    /// Do not load the record packs this build ships as the model tuner's transfer prior (a new
    /// database then starts its first model job from the templates' analytic models).
    #[arg(long)]
    no_prior_pack: bool,
    /// On SIGTERM, seconds that calls in flight may take to finish before the tracker exits
    /// (whatever it acknowledged is committed either way).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(0..=600))]
    shutdown_grace_secs: u64,
    /// Prune superseded records of jobs that ended more than this many days ago, at start and
    /// every hour (as the prune command does); unset keeps everything.
    #[arg(long)]
    retain_days: Option<u32>,
}

/// The `--config` file of `serve`: a key per flag, spelled as the flag.
#[derive(Deserialize, Default, Debug, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct ServeFile {
    listen: Option<SocketAddr>,
    db: Option<PathBuf>,
    lease_secs: Option<u64>,
    heartbeat_secs: Option<u64>,
    max_attempts: Option<u32>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    tls_client_ca: Option<PathBuf>,
    insecure: Option<bool>,
    http: Option<SocketAddr>,
    http_public: Option<bool>,
    submit_rate: Option<f64>,
    shutdown_grace_secs: Option<u64>,
    retain_days: Option<u32>,
    no_prior_pack: Option<bool>,
}

impl ServeFile {
    /// Reads and parses `path`; an unknown key or a value of the wrong type is an error naming the
    /// file, the key and its line.
    fn read(path: &std::path::Path) -> anyhow::Result<ServeFile> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading --config {}", path.display()))?;
        toml::from_str(&text).map_err(|e| anyhow::anyhow!("--config {}: {e}", path.display()))
    }
}

impl ServeArgs {
    /// The flags given on the command line (per `matches`), the rest from `--config` when given,
    /// then the defaults.
    fn merged(mut self, matches: &ArgMatches) -> anyhow::Result<ServeArgs> {
        let Some(path) = &self.config else { return Ok(self) };
        let file = ServeFile::read(path)?;
        let given =
            |id: &str| matches!(matches.value_source(id), Some(ValueSource::CommandLine | ValueSource::EnvVariable));
        tensortune_proto::take_settings!(
            self, file, given;
            value: listen, db, lease_secs, heartbeat_secs, max_attempts, insecure, http_public, submit_rate,
                shutdown_grace_secs, no_prior_pack;
            optional: tls_cert, tls_key, tls_client_ca, http, retain_days
        );
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            anyhow::bail!("--config {}: tls-cert and tls-key go together (flags or keys)", path.display());
        }
        Ok(self)
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        // A log line that cannot be written (its disk is full, a file-size limit) is dropped; by
        // default the subscriber would report that with eprintln!, which panics on the same
        // failure and would take the call being served down with it.
        .log_internal_errors(false)
        .init();
    match cli.command {
        None | Some(Command::Serve(_)) => serve(serve_args(cli, &matches)?).await,
        Some(Command::Token { action }) => token(action).await,
        Some(Command::Backup { to, db }) => {
            let summary = tensortune_tracker::backup(&db.resolve()?, &to).await?;
            println!(
                "backup {} written and checked: {} bytes, {} jobs, {} records",
                summary.path.display(),
                summary.bytes,
                summary.jobs,
                summary.records
            );
            Ok(())
        }
        Some(Command::Prune { retain_days, db }) => {
            let summary = tensortune_tracker::prune(&db.resolve()?, retain_days).await?;
            println!("pruned {} records of jobs that ended more than {retain_days} days ago", summary.records);
            Ok(())
        }
    }
}

/// The settings of a command line that serves (with or without `serve`), merged with its
/// `--config`.
fn serve_args(cli: Cli, matches: &ArgMatches) -> anyhow::Result<ServeArgs> {
    match cli.command {
        Some(Command::Serve(args)) => args.merged(matches.subcommand_matches("serve").unwrap_or(matches)),
        _ => cli.serve.merged(matches),
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let read =
        |path: &PathBuf, what: &str| std::fs::read(path).with_context(|| format!("reading {what} {}", path.display()));
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(ServerTls {
            cert_pem: read(cert, "--tls-cert")?,
            key_pem: read(key, "--tls-key")?,
            client_ca_pem: args.tls_client_ca.as_ref().map(|ca| read(ca, "--tls-client-ca")).transpose()?,
        }),
        _ => None,
    };
    let config = TrackerConfig {
        db: args.db,
        lease: Duration::from_secs(args.lease_secs),
        heartbeat: Duration::from_secs(args.heartbeat_secs),
        max_attempts: args.max_attempts,
        tls,
        insecure: args.insecure,
        submit_rate: args.submit_rate,
        prior_pack: !args.no_prior_pack,
        shutdown_grace: Duration::from_secs(args.shutdown_grace_secs),
        retain_days: args.retain_days,
    };
    let http = match args.http {
        Some(addr) if !addr.ip().is_loopback() && !args.http_public => anyhow::bail!(
            "refusing --http {addr}: the dashboard and metrics need no token; add --http-public to serve them there, \
             or use 127.0.0.1"
        ),
        Some(addr) => {
            Some(tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding --http {addr}"))?)
        }
        None => None,
    };
    let listener =
        tokio::net::TcpListener::bind(args.listen).await.with_context(|| format!("binding {}", args.listen))?;
    let shutdown = CancellationToken::new();
    tokio::spawn(stop_on_signal(shutdown.clone()));
    #[cfg(target_os = "linux")]
    tokio::spawn(note_file_size_limit());
    tensortune_tracker::run_with_http(config, listener, http, shutdown).await
}

async fn token(action: TokenAction) -> anyhow::Result<()> {
    match action {
        TokenAction::Add { name, role, out, db } => {
            let token = tensortune_tracker::add_token(&db, &name, role).await?;
            match out {
                Some(path) => {
                    write_private(&path, &token)?;
                    eprintln!("{role} token {name:?} written to {} (readable by you only)", path.display());
                }
                None => {
                    println!("{token}");
                    eprintln!(
                        "{role} token {name:?} made; it is shown only now. Keep it in a file readable by its user \
                         and point TENSORTUNE_TOKEN_FILE at it"
                    );
                }
            }
        }
        TokenAction::List { db } => {
            let tokens = tensortune_tracker::list_tokens(&db).await?;
            if tokens.is_empty() {
                println!("no tokens: the tracker on {} takes calls from anyone who reaches it", db.display());
            }
            for t in tokens {
                let state = match t.revoked_ms {
                    Some(ms) => format!("revoked {}", ms / 1000),
                    None => "active".to_owned(),
                };
                println!("{:>4}  {:<24} {:<7} created {}  {state}", t.id, t.name, t.role, t.created_ms / 1000);
            }
        }
        TokenAction::Revoke { name, db } => {
            if tensortune_tracker::revoke_token(&db, &name).await? {
                println!("revoked {name:?}; a running tracker refuses it within a second");
            } else {
                println!("{name:?} was revoked already");
            }
        }
    }
    Ok(())
}

/// Writes `text` to a new file only its owner can read.
fn write_private(path: &std::path::Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file =
        options.open(path).with_context(|| format!("creating {} (it must not exist yet)", path.display()))?;
    writeln!(file, "{text}").with_context(|| format!("writing {}", path.display()))?;
    Ok(())
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

/// Handles SIGXFSZ, whose default action kills the process: a write beyond the file-size limit
/// (RLIMIT_FSIZE) then fails with an error that reaches the caller as "nothing stored, retry",
/// like a full disk, instead of killing the tracker with its callers' results unacknowledged.
#[cfg(target_os = "linux")]
async fn note_file_size_limit() {
    /// SIGXFSZ on Linux.
    const SIGXFSZ: i32 = 25;
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::from_raw(SIGXFSZ)) {
        Ok(mut signal) => {
            while signal.recv().await.is_some() {
                tracing::error!("a database write went past the file-size limit (RLIMIT_FSIZE) and was refused");
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot handle SIGXFSZ; a file-size limit would kill the tracker"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `serve` args from `argv` (after the program name) merged with their --config.
    fn serve_args(argv: &[&str]) -> anyhow::Result<ServeArgs> {
        let matches =
            Cli::command().try_get_matches_from(std::iter::once("tensortune-tracker").chain(argv.iter().copied()))?;
        super::serve_args(Cli::from_arg_matches(&matches)?, &matches)
    }

    fn write(dir: &tempfile::TempDir, text: &str) -> String {
        let path = dir.path().join("tracker.toml");
        std::fs::write(&path, text).unwrap();
        path.to_string_lossy().into_owned()
    }

    #[test]
    fn every_key_of_the_file_is_taken_and_flags_win_over_it() {
        let dir = tempfile::TempDir::new().unwrap();
        let file = write(
            &dir,
            r#"
            listen = "127.0.0.1:7171"
            db = "/var/lib/tensortune/tracker.db"
            lease-secs = 45
            heartbeat-secs = 9
            max-attempts = 5
            tls-cert = "/etc/tt/cert.pem"
            tls-key = "/etc/tt/key.pem"
            tls-client-ca = "/etc/tt/ca.pem"
            insecure = true
            http = "127.0.0.1:7172"
            http-public = true
            submit-rate = 2.5
            shutdown-grace-secs = 20
            retain-days = 90
            "#,
        );
        let from_file = serve_args(&["--config", &file]).unwrap();
        let expected = ServeArgs {
            config: Some(PathBuf::from(&file)),
            listen: "127.0.0.1:7171".parse().unwrap(),
            db: "/var/lib/tensortune/tracker.db".into(),
            lease_secs: 45,
            heartbeat_secs: 9,
            max_attempts: 5,
            tls_cert: Some("/etc/tt/cert.pem".into()),
            tls_key: Some("/etc/tt/key.pem".into()),
            tls_client_ca: Some("/etc/tt/ca.pem".into()),
            insecure: true,
            http: Some("127.0.0.1:7172".parse().unwrap()),
            http_public: true,
            submit_rate: 2.5,
            shutdown_grace_secs: 20,
            retain_days: Some(90),
            no_prior_pack: false,
        };
        assert_eq!(from_file, expected);
        // The serve subcommand reads the same file, and its flags win the same way.
        assert_eq!(serve_args(&["serve", "--config", &file]).unwrap(), expected);
        assert_eq!(serve_args(&["serve", "--config", &file, "--max-attempts", "2"]).unwrap().max_attempts, 2);
        let over = serve_args(&["--config", &file, "--lease-secs", "60", "--db", "other.db"]).unwrap();
        assert_eq!((over.lease_secs, over.db.clone()), (60, PathBuf::from("other.db")));
        assert_eq!(over.heartbeat_secs, 9, "keys the command line leaves alone still come from the file");
        // A flag given with its default value still wins over the file.
        assert_eq!(serve_args(&["--config", &file, "--lease-secs", "30"]).unwrap().lease_secs, 30);
        // Without a file: the defaults.
        let plain = serve_args(&[]).unwrap();
        assert_eq!((plain.lease_secs, plain.retain_days, plain.shutdown_grace_secs), (30, None, 10));
    }

    #[test]
    fn the_shipped_example_config_is_valid() {
        let file: ServeFile = toml::from_str(include_str!("../../deploy/tracker.toml")).unwrap();
        assert_eq!(file.db.as_deref(), Some(std::path::Path::new("/var/lib/tensortune/tracker.db")));
        assert!(file.listen.is_some() && file.retain_days.is_some());
    }

    #[test]
    fn an_unknown_key_or_a_wrong_type_is_refused_naming_it_and_the_file() {
        let dir = tempfile::TempDir::new().unwrap();
        let file = write(&dir, "lease-secs = 30\nlease_seconds = 30\n");
        let e = format!("{:#}", serve_args(&["--config", &file]).unwrap_err());
        assert!(e.contains("lease_seconds") && e.contains(&file) && e.contains("unknown field"), "{e}");
        let file = write(&dir, "lease-secs = \"thirty\"\n");
        let e = format!("{:#}", serve_args(&["--config", &file]).unwrap_err());
        assert!(e.contains("lease-secs") && e.contains(&file), "{e}");
        let e = format!("{:#}", serve_args(&["--config", "/nonexistent/tracker.toml"]).unwrap_err());
        assert!(e.contains("/nonexistent/tracker.toml"), "{e}");
    }
}
