//! The worker's link to the tracker's `Dispatch` service: registration, and every call retried
//! with backoff while the tracker is unreachable, so a tracker restart loses nothing. When the
//! tracker no longer knows the worker (`NotFound`, e.g. after losing its state) the link registers
//! again with `previous_id`, once for all callers, and repeats the call.
//!
//! Several trackers sharing one PostgreSQL database may be given (`--tracker A,B`): the link calls
//! one and moves to the next, in turn, when a call fails with a transient error. They share the
//! worker's id and its leases, so nothing else changes.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tensortune_proto::access::{Access, Authed};
use tensortune_proto::pb;
use tensortune_proto::pb::dispatch_client::DispatchClient;
use tokio_util::sync::CancellationToken;
use tonic::{Code, Status};

use crate::stage::TaskResult;

/// How long a lease call may hold the tracker open waiting for work.
pub(crate) const LEASE_WAIT: Duration = Duration::from_millis(5000);
/// Deadline of a call on top of any long-poll wait: a tracker that does not answer in this time is
/// treated as unreachable and the call is retried.
const CALL_DEADLINE: Duration = Duration::from_secs(20);
/// Backoff between retries: doubles from the first value up to the cap.
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
const BACKOFF_CAP: Duration = Duration::from_secs(5);
/// Heartbeat interval used when the tracker suggests none.
const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(5);

/// Why a call gave up.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LinkError {
    /// Shutdown was requested while the call was being retried.
    #[error("shutting down")]
    Cancelled,
    /// The tracker refused the call for good (`FailedPrecondition`, `InvalidArgument`, ...).
    #[error("the tracker refused {call}: {code:?}: {message}")]
    Refused {
        /// The rpc.
        call: &'static str,
        /// The status code.
        code: Code,
        /// The tracker's message.
        message: String,
    },
    /// The tracker refused the registration; the worker cannot go on.
    #[error("the tracker refused the registration: {0}")]
    Register(String),
}

/// A registered connection to the tracker.
pub(crate) struct Link {
    /// One client per tracker address, in the order given.
    clients: Vec<DispatchClient<Authed>>,
    /// The tracker calls go to now (an index into `clients`).
    at: AtomicUsize,
    /// The addresses, for messages.
    urls: Vec<String>,
    /// What Register sends (with `previous_id` filled in on re-registration).
    registration: pb::RegisterRequest,
    worker_id: AtomicU64,
    heartbeat_ms: AtomicU64,
    /// Serialises re-registration: callers that saw the same stale id register once.
    reregister: tokio::sync::Mutex<()>,
    shutdown: CancellationToken,
}

impl Link {
    /// Connects (lazily: an unreachable tracker only delays the first call) and registers,
    /// retrying until a tracker answers or `shutdown` fires. `url` is one address or several,
    /// comma-separated (trackers sharing one database).
    pub(crate) async fn connect(
        url: &str,
        access: &Access,
        registration: pb::RegisterRequest,
        shutdown: CancellationToken,
    ) -> anyhow::Result<Link> {
        let urls: Vec<String> = url.split(',').map(|u| u.trim().to_owned()).collect();
        let mut clients = Vec::with_capacity(urls.len());
        for u in &urls {
            if u.is_empty() {
                anyhow::bail!("invalid --tracker {url:?}: an empty address in the list; give URLs separated by commas");
            }
            let endpoint = access.endpoint(u)?.connect_timeout(Duration::from_secs(5)).tcp_nodelay(true);
            clients.push(DispatchClient::with_interceptor(endpoint.connect_lazy(), access.bearer()));
        }
        let link = Link {
            clients,
            at: AtomicUsize::new(0),
            urls,
            registration,
            worker_id: AtomicU64::new(0),
            heartbeat_ms: AtomicU64::new(DEFAULT_HEARTBEAT.as_millis() as u64),
            reregister: tokio::sync::Mutex::new(()),
            shutdown,
        };
        link.register(0).await.map_err(|e| anyhow::anyhow!("registering with the tracker at {url}: {e}"))?;
        Ok(link)
    }

    /// The client of the tracker calls go to now, and its index.
    fn client(&self) -> (usize, DispatchClient<Authed>) {
        let at = self.at.load(Ordering::Acquire) % self.clients.len();
        (at, self.clients[at].clone())
    }

    /// After a transient failure on tracker `failed`: the next tracker, when there are several
    /// (once for all callers that saw the same one fail).
    fn fail_over(&self, failed: usize) {
        if self.clients.len() > 1 {
            let next = (failed + 1) % self.clients.len();
            if self.at.compare_exchange(failed, next, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                tracing::warn!(from = %self.urls[failed], to = %self.urls[next], "moving to the next tracker");
            }
        }
    }

    /// The id the tracker gave this worker.
    pub(crate) fn worker_id(&self) -> u64 {
        self.worker_id.load(Ordering::Acquire)
    }

    /// How often to heartbeat, as the tracker asked.
    pub(crate) fn heartbeat_interval(&self) -> Duration {
        Duration::from_millis(self.heartbeat_ms.load(Ordering::Relaxed))
    }

    /// Renews the leases of `task_ids` and tells the drift reference's latest time (0 when none);
    /// returns the tasks the tracker wants dropped.
    pub(crate) async fn heartbeat(&self, task_ids: Vec<u64>, reference_us: f64) -> Result<Vec<u64>, LinkError> {
        let response = self
            .call("Heartbeat", CALL_DEADLINE, |mut client, worker_id| {
                let request = pb::HeartbeatRequest { worker_id, task_ids: task_ids.clone(), reference_us };
                async move { client.heartbeat(request).await }
            })
            .await?;
        Ok(response.drop_task_ids)
    }

    /// Leases up to `max_tasks` tasks, waiting up to [`LEASE_WAIT`] for work.
    pub(crate) async fn lease(&self, max_tasks: u32) -> Result<Vec<pb::Task>, LinkError> {
        let wait_ms = LEASE_WAIT.as_millis() as u32;
        let response = self
            .call("LeaseTasks", LEASE_WAIT + CALL_DEADLINE, |mut client, worker_id| async move {
                client.lease_tasks(pb::LeaseTasksRequest { worker_id, max_tasks, wait_ms }).await
            })
            .await?;
        Ok(response.tasks)
    }

    /// Reports one task's result; `Ok(false)` when the tracker already had one (the report was
    /// dropped). Retried until delivered, refused, or shutdown (after at least one attempt).
    pub(crate) async fn report(&self, task_id: u64, lease_serial: u32, result: &TaskResult) -> Result<bool, LinkError> {
        let response = self
            .call("ReportResult", CALL_DEADLINE, |mut client, worker_id| {
                let request = result.request(worker_id, task_id, lease_serial);
                async move { client.report_result(request).await }
            })
            .await?;
        Ok(response.stored)
    }

    /// Reports many tasks' results in one call (`reports`: task id, lease serial, result), stored
    /// by the tracker in one transaction; returns each one's outcome in the order given. Retried
    /// as [`Link::report`]; a tracker that predates the call refuses it as `Unimplemented`.
    pub(crate) async fn report_batch(
        &self,
        reports: &[(u64, u32, &TaskResult)],
    ) -> Result<Vec<pb::ReportOutcome>, LinkError> {
        let requests: Vec<pb::ReportResultRequest> =
            reports.iter().map(|(task, serial, result)| result.request(0, *task, *serial)).collect();
        let response = self
            .call("ReportResults", CALL_DEADLINE, |mut client, worker_id| {
                let request = pb::ReportResultsRequest { worker_id, reports: requests.clone() };
                async move { client.report_results(request).await }
            })
            .await?;
        if response.outcomes.len() != reports.len() {
            return Err(LinkError::Refused {
                call: "ReportResults",
                code: Code::Internal,
                message: format!("{} outcomes answered {} reports", response.outcomes.len(), reports.len()),
            });
        }
        Ok(response.outcomes)
    }

    /// Hands back every task the tracker still counts as this worker's, in one call, when the
    /// worker stops: they go back to the queue at once instead of waiting out their leases.
    /// Returns how many; `Ok(None)` from a tracker that predates `Leave` (the leases then expire).
    /// One attempt, plus retries only while shutdown has not been requested.
    pub(crate) async fn leave(&self) -> Result<Option<u32>, LinkError> {
        let answered = self
            .call("Leave", CALL_DEADLINE, |mut client, worker_id| async move {
                client.leave(pb::LeaveRequest { worker_id }).await
            })
            .await;
        match answered {
            Ok(response) => Ok(Some(response.released)),
            Err(LinkError::Refused { code: Code::Unimplemented, .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Calls `rpc` until it succeeds, retrying transient failures with backoff and re-registering
    /// on `NotFound`. A second `NotFound` right after re-registering is returned as refused (the
    /// tracker knows the worker, so it is the task it does not know). At least one attempt is made
    /// even after shutdown, so finished results still get their chance to be delivered.
    async fn call<T, F, Fut>(&self, name: &'static str, deadline: Duration, mut rpc: F) -> Result<T, LinkError>
    where
        F: FnMut(DispatchClient<Authed>, u64) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let mut backoff = BACKOFF_FIRST;
        let mut failures = 0u32;
        let mut reregistered = false;
        loop {
            let worker_id = self.worker_id();
            let (at, client) = self.client();
            let status = match tokio::time::timeout(deadline, rpc(client, worker_id)).await {
                Ok(Ok(response)) => {
                    if failures > 0 {
                        tracing::info!("{name} went through after {failures} failed attempts");
                    }
                    return Ok(response.into_inner());
                }
                Ok(Err(status)) => status,
                Err(_) => Status::deadline_exceeded(format!("no answer within {} s", deadline.as_secs())),
            };
            match status.code() {
                Code::NotFound if !reregistered => {
                    tracing::warn!(
                        "the tracker does not know worker {worker_id} ({}); registering again",
                        status.message()
                    );
                    self.reregister_after(worker_id).await?;
                    reregistered = true;
                }
                code if tensortune_proto::transient(code) => {
                    failures += 1;
                    self.fail_over(at);
                    if self.shutdown.is_cancelled() {
                        return Err(LinkError::Cancelled);
                    }
                    if failures == 1 || failures.is_multiple_of(10) {
                        tracing::warn!("{name} failed ({code:?}: {}); retrying (attempt {failures})", status.message());
                    }
                    tokio::select! {
                        _ = self.shutdown.cancelled() => return Err(LinkError::Cancelled),
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(BACKOFF_CAP);
                }
                code => return Err(LinkError::Refused { call: name, code, message: status.message().to_owned() }),
            }
        }
    }

    /// Registers again unless another caller already replaced `stale_id`.
    async fn reregister_after(&self, stale_id: u64) -> Result<(), LinkError> {
        let _guard = self.reregister.lock().await;
        if self.worker_id() != stale_id {
            return Ok(());
        }
        self.register(stale_id).await
    }

    async fn register(&self, previous_id: u64) -> Result<(), LinkError> {
        let mut backoff = BACKOFF_FIRST;
        let mut failures = 0u32;
        let request = pb::RegisterRequest { previous_id, ..self.registration.clone() };
        loop {
            let (at, mut client) = self.client();
            let status = match tokio::time::timeout(CALL_DEADLINE, client.register(request.clone())).await {
                Ok(Ok(response)) => {
                    let r = response.into_inner();
                    self.worker_id.store(r.worker_id, Ordering::Release);
                    let heartbeat = if r.heartbeat_ms > 0 {
                        u64::from(r.heartbeat_ms)
                    } else {
                        DEFAULT_HEARTBEAT.as_millis() as u64
                    };
                    // Far below a few ms the heartbeat would only load the tracker.
                    self.heartbeat_ms.store(heartbeat.max(20), Ordering::Relaxed);
                    tracing::info!(
                        worker_id = r.worker_id,
                        previous_id,
                        lease_ms = r.lease_ms,
                        heartbeat_ms = r.heartbeat_ms,
                        "registered with the tracker"
                    );
                    return Ok(());
                }
                Ok(Err(status)) => status,
                Err(_) => Status::deadline_exceeded(format!("no answer within {} s", CALL_DEADLINE.as_secs())),
            };
            if !tensortune_proto::transient(status.code()) {
                return Err(LinkError::Register(format!("{:?}: {}", status.code(), status.message())));
            }
            failures += 1;
            self.fail_over(at);
            if failures == 1 || failures.is_multiple_of(10) {
                tracing::warn!(
                    "the tracker is unreachable ({}); retrying registration (attempt {failures})",
                    status.message()
                );
            }
            tokio::select! {
                _ = self.shutdown.cancelled() => return Err(LinkError::Cancelled),
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(BACKOFF_CAP);
        }
    }
}
