//! `tensortune-tracker`: serves the tracker on an address until Ctrl-C or SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use tensortune_tracker::{Role, ServerTls, TrackerConfig};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

/// The tensortune tracker: tuning jobs, leased dispatch to workers, the SQLite record store.
///
/// Without a subcommand it serves; `token` manages the bearer tokens callers present.
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

#[derive(Args, Debug)]
struct ServeArgs {
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
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        // A log line that cannot be written (its disk is full, a file-size limit) is dropped; by
        // default the subscriber would report that with eprintln!, which panics on the same
        // failure and would take the call being served down with it.
        .log_internal_errors(false)
        .init();
    match cli.command {
        None => serve(cli.serve).await,
        Some(Command::Serve(args)) => serve(args).await,
        Some(Command::Token { action }) => token(action).await,
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
