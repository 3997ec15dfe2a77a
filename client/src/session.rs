//! A connection to a tracker: a remote one (`--tracker URL`), or an embedded tracker on the local
//! database, optionally with a local worker, started for the duration of one command.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};
use tensortune_proto::pb;
use tensortune_proto::pb::tuning_client::TuningClient;
use tensortune_tracker::TrackerConfig;

use crate::cli::LocalDevice;
use std::sync::OnceLock;
use tensortune_proto::access::{Access, Authed};
use tensortune_worker::{DeviceSpec, WorkerConfig};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How long an embedded worker may take to come up (a CUDA context and cuBLAS handle take a few
/// seconds on a cold GPU).
const WORKER_START: Duration = Duration::from_secs(120);

/// An open connection to a tracker.
pub struct Session {
    /// The Tuning service.
    pub client: TuningClient<Authed>,
    /// The device class of the embedded worker, when there is one.
    pub local_class: Option<String>,
    /// The tracker's URL when it runs elsewhere (`--tracker`): one that can go away and come back.
    pub remote_url: Option<String>,
    embedded: Option<Embedded>,
}

struct Embedded {
    token: CancellationToken,
    /// The worker's own stop (a child of `token`): the worker stops first, so that it can hand
    /// back what it holds to a tracker still serving.
    worker_token: CancellationToken,
    tracker: JoinHandle<anyhow::Result<()>>,
    worker: Option<JoinHandle<anyhow::Result<()>>>,
}

/// The token and TLS settings of this process's connections, set once at start.
static ACCESS: OnceLock<Access> = OnceLock::new();

/// Sets the token and TLS settings every connection of this process uses (the first call wins).
pub fn set_access(access: Access) {
    let _ = ACCESS.set(access);
}

fn access() -> Access {
    ACCESS.get().cloned().unwrap_or_default()
}

/// Connects to the first tracker of `url` that answers: one address, or several comma-separated
/// (trackers sharing one PostgreSQL database, any of which serves every job).
async fn connect(url: &str, access: &Access) -> anyhow::Result<TuningClient<Authed>> {
    let mut failures = Vec::new();
    for one in url.split(',').map(str::trim) {
        if one.is_empty() {
            bail!("invalid --tracker {url:?}: an empty address in the list; give URLs separated by commas");
        }
        let endpoint = access.endpoint(one).context("--tracker")?.connect_timeout(Duration::from_secs(10));
        match endpoint.connect().await {
            Ok(channel) => {
                return Ok(TuningClient::with_interceptor(channel, access.bearer()).max_decoding_message_size(64 << 20));
            }
            Err(e) => failures.push(format!("{one}: {e}")),
        }
    }
    match failures.as_slice() {
        [one] => bail!("cannot reach the tracker at {one}"),
        all => bail!("cannot reach any tracker of --tracker {url}: {}", all.join("; ")),
    }
}

impl Session {
    /// Connects to a running tracker.
    pub async fn remote(url: &str) -> anyhow::Result<Session> {
        Session::remote_with(url, &access()).await
    }

    /// Connects to a running tracker with these token and TLS settings.
    pub async fn remote_with(url: &str, access: &Access) -> anyhow::Result<Session> {
        let client = connect(url, access).await?;
        Ok(Session { client, local_class: None, remote_url: Some(url.to_owned()), embedded: None })
    }

    /// After the tracker went away: connects again to the first of the `--tracker` addresses that
    /// answers, when several were given (with one, the channel reconnects by itself).
    pub(crate) async fn fail_over(&mut self) {
        if let Some(url) = self.remote_url.as_deref().filter(|u| u.contains(','))
            && let Ok(client) = connect(url, &access()).await
        {
            self.client = client;
        }
    }

    /// Starts a tracker on `db` (loopback, ephemeral port) and, with `local`, a worker on it; waits
    /// until the worker has registered.
    pub async fn embedded(db: &Path, local: Option<&LocalDevice>) -> anyhow::Result<Session> {
        let token = CancellationToken::new();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding a loopback port for the embedded tracker")?;
        let url = format!("http://{}", listener.local_addr()?);
        let config = TrackerConfig { db: db.to_owned(), ..TrackerConfig::default() };
        let tracker = tokio::spawn(tensortune_tracker::run(config, listener, token.clone()));
        let mut session = Session {
            client: connect(&url, &access()).await?,
            local_class: None,
            remote_url: None,
            embedded: Some(Embedded { worker_token: token.child_token(), token: token.clone(), tracker, worker: None }),
        };
        if let Some(local) = local {
            let device = local.device.as_str();
            let spec: DeviceSpec = device.parse()?;
            // A GPU worker's jobs take the shipped record packs as their prior: parse them while
            // the worker starts, not once it has registered.
            if spec != DeviceSpec::Sim {
                tensortune_tracker::warm_record_packs();
            }
            let mut wc = WorkerConfig::new(url.clone(), spec);
            wc.access = access();
            wc.compile_threads = local.compile_threads;
            if local.no_disk_cache {
                wc.cache_dir = None;
            }
            // The database may list workers of earlier sessions, some still `online` within their
            // lease. The embedded tracker listens on a loopback port of its own that only this
            // session's worker is told, so the first worker to register after it starts is ours
            // (with cuda:all, one of the workers of this host's GPUs).
            let known = session.worker_ids().await?;
            if let Some(e) = session.embedded.as_mut() {
                e.worker = Some(tokio::spawn(tensortune_worker::run(wc, e.worker_token.clone())));
            }
            session.local_class = Some(session.wait_for_worker(device, known).await?);
        }
        Ok(session)
    }

    /// The highest worker id the tracker knows (0 when none).
    async fn worker_ids(&mut self) -> anyhow::Result<u64> {
        let workers = self.client.list_workers(pb::ListWorkersRequest {}).await?.into_inner().workers;
        Ok(workers.iter().map(|w| w.id).max().unwrap_or(0))
    }

    /// Waits until the embedded worker (registered with an id above `known`) is online and returns
    /// its device class; fails with the worker's own error when it stops first.
    async fn wait_for_worker(&mut self, device: &str, known: u64) -> anyhow::Result<String> {
        let deadline = tokio::time::Instant::now() + WORKER_START;
        loop {
            let workers = self.client.list_workers(pb::ListWorkersRequest {}).await?.into_inner().workers;
            if let Some(w) = workers.iter().find(|w| w.id > known && w.state == "online") {
                return Ok(w.device.as_ref().map(|d| d.class_key.clone()).unwrap_or_default());
            }
            let finished = self.embedded.as_ref().and_then(|e| e.worker.as_ref()).is_some_and(|w| w.is_finished());
            if finished {
                let handle = self.embedded.as_mut().and_then(|e| e.worker.take()).expect("checked above");
                let err = match handle.await {
                    Ok(Ok(())) => anyhow::anyhow!("the local worker on {device} stopped before registering"),
                    Ok(Err(e)) => e,
                    Err(e) => anyhow::anyhow!("the local worker on {device} panicked: {e}"),
                };
                let hint = if device.starts_with("cuda") { " (use --device sim to run without a GPU)" } else { "" };
                bail!("{err:#}{hint}");
            }
            if tokio::time::Instant::now() > deadline {
                bail!("the local worker on {device} did not register within {WORKER_START:?}");
            }
            // The job is submitted the moment the worker is there: a tune waits for this.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// When the embedded worker has stopped on its own: why. Its job would otherwise wait forever.
    pub async fn worker_stopped(&mut self) -> Option<anyhow::Error> {
        let e = self.embedded.as_mut()?;
        if !e.worker.as_ref()?.is_finished() {
            return None;
        }
        let handle = e.worker.take()?;
        Some(match handle.await {
            Ok(Ok(())) => anyhow::anyhow!("the local worker stopped"),
            Ok(Err(e)) => e.context("the local worker failed"),
            Err(e) => anyhow::anyhow!("the local worker panicked: {e}"),
        })
    }

    /// Stops what this session started (worker first, then tracker) and reports their errors.
    pub async fn close(self) -> anyhow::Result<()> {
        let Some(e) = self.embedded else { return Ok(()) };
        e.worker_token.cancel();
        let worker = match e.worker {
            Some(worker) => {
                worker.await.context("the local worker panicked").and_then(|r| r.context("the local worker failed"))
            }
            None => Ok(()),
        };
        e.token.cancel();
        worker?;
        e.tracker.await.context("the embedded tracker panicked")?.context("the embedded tracker failed")?;
        Ok(())
    }
}
