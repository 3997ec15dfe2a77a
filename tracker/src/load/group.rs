//! A worker group: one process hosting many in-process `sim` workers, each with its own gRPC
//! connection, speaking `Dispatch` as the worker daemon does (register, lease, heartbeat,
//! report with retries) but "measuring" by sleeping. Killing or stopping the process takes a
//! group down at once. What the workers saw (RPC latencies, answers) goes to a stats file,
//! rewritten every half second so that a group killed mid-run still leaves its figures.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tensortune_kernels::gemm::WmmaGemm;
use tensortune_kernels::{Target, Template};
use tensortune_proto::convert::device_from_target;
use tensortune_proto::pb;
use tensortune_proto::pb::dispatch_client::DispatchClient;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tonic::Status;
use tonic::transport::{Channel, Endpoint};

/// Backoff between retries of a call the tracker could not answer: doubles up to the cap, which
/// is short so that a restarted tracker is found again within a second.
const BACKOFF_FIRST: Duration = Duration::from_millis(50);
const BACKOFF_CAP: Duration = Duration::from_secs(1);
/// How long a lease call waits for work: the daemon's long poll (`worker::link::LEASE_WAIT`).
/// It was 1 s, five times the daemon's rate of calls from idle workers: at 1,000 workers with
/// 600 of them idle those calls were a third of the tracker's statements (2026-11-28).
const LEASE_WAIT_MS: u32 = 5000;
/// A call the tracker does not answer in this long is treated as failed and retried.
const CALL_DEADLINE: Duration = Duration::from_secs(10);
/// Most reports in one `ReportResults` call (the tracker's limit).
const MAX_REPORTS: usize = 1024;
/// How often the stats file is rewritten.
const FLUSH_EVERY: Duration = Duration::from_millis(500);

/// What a worker group does.
#[derive(Clone, Debug)]
pub struct GroupConfig {
    /// The tracker's URL, `http://127.0.0.1:PORT`, or several, comma-separated (trackers sharing
    /// one PostgreSQL database): each worker calls the first and moves on to the next, in turn,
    /// when a call fails with a transient error.
    pub tracker: String,
    /// Workers in this process.
    pub workers: u32,
    /// Prefix of the workers' names (`NAME/INDEX`), by which the load tool finds their tasks.
    pub name: String,
    /// How long one "measurement" takes.
    pub measure: Duration,
    /// Where the stats go (JSON, [`GroupStats`]).
    pub stats: PathBuf,
    /// Tasks a worker leases per call, and reports per call at most (`ReportResults`, all that
    /// finished since its last report). 1 speaks the single-task calls (`ReportResult`) that
    /// trackers before batching answer.
    pub batch: u32,
    /// How long a report waits after its first result for more, before it is sent, as the worker
    /// daemon's does (its `GATHER`): only while the worker holds tasks beyond the report's, and not
    /// after a lease that found fewer tasks than asked (the tracker ran out: the jobs' last tasks
    /// may be due). 0: it takes what finished while the last report was on its way, as the
    /// daemon did before 2026-11-29's load15.
    pub report_gather: Duration,
}

/// What the workers of a group saw.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct GroupStats {
    /// Latency of each answered call, microseconds, by rpc: `register`, `heartbeat`, `report`,
    /// and `lease` for the lease calls that returned tasks (a long poll: it includes any wait for
    /// work).
    pub latency_us: BTreeMap<String, Vec<u32>>,
    /// Tasks leased.
    pub leased: u64,
    /// Reports the tracker stored.
    pub stored: u64,
    /// Reports the tracker acknowledged as already done (dropped, no record).
    pub duplicate: u64,
    /// Reports the tracker refused for good (the lease went to another worker, a stale lease).
    pub refused: u64,
    /// Failed calls that were retried, by rpc and status code (`report Unavailable`, ...).
    pub retried: BTreeMap<String, u64>,
    /// A sample message per retried kind, to show what the tracker said.
    pub messages: BTreeMap<String, String>,
    /// CPU seconds (user + system) this group process used by its last flush: the load tool's
    /// own cost, which shares the machine with the tracker.
    #[serde(default)]
    pub cpu_s: f64,
}

impl GroupStats {
    fn latency(&mut self, rpc: &str, took: Duration) {
        let us = u32::try_from(took.as_micros()).unwrap_or(u32::MAX);
        self.latency_us.entry(rpc.to_owned()).or_default().push(us);
    }

    fn retried(&mut self, rpc: &str, status: &Status) {
        let key = format!("{rpc} {:?}", status.code());
        *self.retried.entry(key.clone()).or_default() += 1;
        self.messages.entry(key).or_insert_with(|| status.message().to_owned());
    }
}

/// Runs a group until `shutdown`, then writes its stats a last time.
pub async fn run_group(config: GroupConfig, shutdown: CancellationToken) -> anyhow::Result<()> {
    let stats = Arc::new(Mutex::new(GroupStats::default()));
    let config = Arc::new(config);
    let mut workers = JoinSet::new();
    for i in 0..config.workers {
        let (config, stats, stop) = (Arc::clone(&config), Arc::clone(&stats), shutdown.clone());
        workers.spawn(async move { worker(&config, i, &stats, &stop).await });
    }
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep(FLUSH_EVERY) => flush(&config.stats, &stats)?,
            Some(done) = workers.join_next() => {
                if let Ok(Err(e)) = done {
                    tracing::error!("a load worker stopped: {e:#}");
                }
            }
        }
    }
    workers.shutdown().await;
    flush(&config.stats, &stats)
}

fn flush(path: &PathBuf, stats: &Mutex<GroupStats>) -> anyhow::Result<()> {
    let cpu = super::procs::cpu_seconds(std::process::id());
    let text = {
        let mut stats = stats.lock().expect("stats lock");
        stats.cpu_s = cpu.unwrap_or(stats.cpu_s);
        serde_json::to_string(&*stats)?
    };
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// One worker: its own connection to each tracker, id and loop.
struct Worker<'a> {
    clients: Vec<DispatchClient<Channel>>,
    /// The tasks it holds (renewed by its heartbeats).
    held: &'a Mutex<Vec<u64>>,
    /// The tracker it calls now (an index into `clients`).
    at: usize,
    id: u64,
    stats: &'a Mutex<GroupStats>,
    stop: &'a CancellationToken,
}

impl Worker<'_> {
    /// Calls `rpc` until answered (transient failures retried with backoff, each counted);
    /// `Ok(Err(status))` is a refusal, `Err(())` shutdown.
    async fn call<T, F, Fut>(&mut self, name: &str, mut rpc: F) -> Result<Result<T, Status>, ()>
    where
        F: FnMut(DispatchClient<Channel>, u64) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let mut backoff = BACKOFF_FIRST;
        loop {
            let started = Instant::now();
            let answer = tokio::select! {
                () = self.stop.cancelled() => return Err(()),
                r = tokio::time::timeout(CALL_DEADLINE, rpc(self.clients[self.at].clone(), self.id)) => r,
            };
            let status = match answer {
                Ok(Ok(response)) => {
                    if name != "lease" {
                        self.stats.lock().expect("stats lock").latency(name, started.elapsed());
                    }
                    return Ok(Ok(response.into_inner()));
                }
                Ok(Err(status)) => status,
                Err(_) => Status::deadline_exceeded("no answer in time"),
            };
            if !tensortune_proto::transient(status.code()) {
                return Ok(Err(status));
            }
            self.stats.lock().expect("stats lock").retried(name, &status);
            // The next tracker, if there are several: they share the database, so the worker's
            // id and leases hold there too.
            self.at = (self.at + 1) % self.clients.len();
            tokio::select! {
                () = self.stop.cancelled() => return Err(()),
                () = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(BACKOFF_CAP);
        }
    }
}

async fn worker(
    config: &GroupConfig,
    index: u32,
    stats: &Arc<Mutex<GroupStats>>,
    stop: &CancellationToken,
) -> anyhow::Result<()> {
    let mut clients = Vec::new();
    for url in config.tracker.split(',') {
        let channel = Endpoint::from_shared(url.to_owned())?
            .connect_timeout(Duration::from_secs(2))
            .tcp_nodelay(true)
            .connect_lazy();
        clients.push(DispatchClient::new(channel));
    }
    let held: Arc<Mutex<Vec<u64>>> = Arc::default();
    let mut w = Worker { clients, held: &held, at: 0, id: 0, stats, stop };
    let registration = pb::RegisterRequest {
        name: format!("{}/{index}", config.name),
        device: Some(device_from_target(&Target::sim())),
        templates: vec![pb::TemplateRef { name: WmmaGemm.name().to_owned(), version: WmmaGemm.version() }],
        previous_id: 0,
    };
    let Ok(answer) = w
        .call("register", |mut c, _| {
            let request = registration.clone();
            async move { c.register(request).await }
        })
        .await
    else {
        return Ok(());
    };
    let registered = answer.map_err(|s| anyhow::anyhow!("registration refused: {:?}: {}", s.code(), s.message()))?;
    w.id = registered.worker_id;
    let heartbeat = Duration::from_millis(u64::from(registered.heartbeat_ms.max(100)));
    let beats = {
        let (clients, held, stop, id) = (w.clients.clone(), Arc::clone(&held), stop.clone(), w.id);
        let mut at = 0;
        let stats = Arc::clone(stats);
        async move {
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(heartbeat) => {}
                }
                let task_ids = held.lock().expect("held lock").clone();
                // A lost heartbeat only shortens a lease; the next one renews it.
                let started = Instant::now();
                let beat = clients[at]
                    .clone()
                    .heartbeat(pb::HeartbeatRequest { worker_id: id, task_ids, reference_us: 0.0 })
                    .await;
                let mut stats = stats.lock().expect("stats lock");
                match beat {
                    Ok(_) => stats.latency("heartbeat", started.elapsed()),
                    Err(status) => {
                        stats.retried("heartbeat", &status);
                        if tensortune_proto::transient(status.code()) {
                            at = (at + 1) % clients.len();
                        }
                    }
                }
            }
        }
    };
    let beats = tokio::spawn(beats);
    let result = work(&mut w, config).await;
    beats.abort();
    result
}

async fn work(w: &mut Worker<'_>, config: &GroupConfig) -> anyhow::Result<()> {
    if config.batch <= 1 {
        return work_one_by_one(w, config).await;
    }
    let held = w.held;
    let gather = config.report_gather;
    // Measured tasks go to the reporter, which sends every one that finished since its last call
    // in one `ReportResults` (and, with `report_gather`, those that finish within that long of
    // the first): a GPU worker's results arrive one at a time, its reports need not.
    let (finished, mut to_report) = tokio::sync::mpsc::unbounded_channel::<pb::Task>();
    // Set when a lease found fewer tasks than asked (see `GroupConfig::report_gather`).
    let drained = std::sync::atomic::AtomicBool::new(false);
    let gathers = |batch: &[pb::Task]| {
        !drained.load(std::sync::atomic::Ordering::Relaxed) && held.lock().expect("held lock").len() > batch.len()
    };
    let mut reporter = Worker { clients: w.clients.clone(), held, at: 0, id: w.id, stats: w.stats, stop: w.stop };
    let reports = async {
        while let Some(first) = to_report.recv().await {
            let mut batch = vec![first];
            let until = tokio::time::Instant::now() + gather;
            while batch.len() < MAX_REPORTS {
                // What is ready goes in either way; more is waited for only while `gathers`.
                let by = if gathers(&batch) { until } else { tokio::time::Instant::now() };
                match tokio::time::timeout_at(by, to_report.recv()).await {
                    Ok(Some(t)) => batch.push(t),
                    _ => break,
                }
            }
            let reports: Vec<pb::ReportResultRequest> = batch.iter().map(|t| report(0, t)).collect();
            let answer = reporter
                .call("report", |mut c, worker_id| {
                    let request = pb::ReportResultsRequest { worker_id, reports: reports.clone() };
                    async move { c.report_results(request).await }
                })
                .await;
            held.lock().expect("held lock").retain(|t| !batch.iter().any(|b| b.task_id == *t));
            let outcomes = match answer {
                Err(()) => return,
                Ok(Ok(r)) => r.outcomes,
                Ok(Err(status)) => {
                    let mut stats = reporter.stats.lock().expect("stats lock");
                    stats.refused += batch.len() as u64;
                    let key = format!("report refused {:?}", status.code());
                    stats.messages.entry(key).or_insert_with(|| status.message().to_owned());
                    continue;
                }
            };
            let mut stats = reporter.stats.lock().expect("stats lock");
            for o in outcomes {
                match tonic::Code::from_i32(o.code) {
                    tonic::Code::Ok if o.stored => stats.stored += 1,
                    tonic::Code::Ok => stats.duplicate += 1,
                    code => {
                        stats.refused += 1;
                        let key = format!("report refused {code:?}");
                        stats.messages.entry(key).or_insert(o.message);
                    }
                }
            }
        }
    };
    let measures = async {
        loop {
            let Some(tasks) = lease(w, config.batch).await else { return };
            drained.store(tasks.len() < config.batch as usize, std::sync::atomic::Ordering::Relaxed);
            for task in tasks {
                tokio::select! {
                    () = w.stop.cancelled() => return,
                    () = tokio::time::sleep(config.measure) => {}
                }
                if finished.send(task).is_err() {
                    return;
                }
            }
        }
    };
    tokio::select! {
        () = reports => {}
        () = measures => {}
    }
    Ok(())
}

/// Leases up to `max` tasks (at least one; a long poll), holding them for the heartbeats; `None`
/// at shutdown.
async fn lease(w: &mut Worker<'_>, max: u32) -> Option<Vec<pb::Task>> {
    loop {
        let started = Instant::now();
        let leased = w
            .call("lease", |mut c, worker_id| async move {
                c.lease_tasks(pb::LeaseTasksRequest { worker_id, max_tasks: max, wait_ms: LEASE_WAIT_MS }).await
            })
            .await;
        let tasks = match leased {
            Err(()) => return None,
            Ok(Ok(r)) => r.tasks,
            Ok(Err(status)) => {
                w.stats.lock().expect("stats lock").retried("lease", &status);
                tokio::time::sleep(BACKOFF_CAP).await;
                continue;
            }
        };
        if tasks.is_empty() {
            continue;
        }
        let mut stats = w.stats.lock().expect("stats lock");
        stats.latency("lease", started.elapsed());
        stats.leased += tasks.len() as u64;
        w.held.lock().expect("held lock").extend(tasks.iter().map(|t| t.task_id));
        return Some(tasks);
    }
}

/// The worker of trackers before batching: one task per lease, one report per call.
async fn work_one_by_one(w: &mut Worker<'_>, config: &GroupConfig) -> anyhow::Result<()> {
    let held = w.held;
    loop {
        let Some(tasks) = lease(w, 1).await else { return Ok(()) };
        for task in tasks {
            tokio::select! {
                () = w.stop.cancelled() => return Ok(()),
                () = tokio::time::sleep(config.measure) => {}
            }
            let request = report(w.id, &task);
            let answer = w
                .call("report", |mut c, worker_id| {
                    let request = pb::ReportResultRequest { worker_id, ..request.clone() };
                    async move { c.report_result(request).await }
                })
                .await;
            held.lock().expect("held lock").retain(|t| *t != task.task_id);
            let mut stats = w.stats.lock().expect("stats lock");
            match answer {
                Err(()) => return Ok(()),
                Ok(Ok(r)) if r.stored => stats.stored += 1,
                Ok(Ok(_)) => stats.duplicate += 1,
                Ok(Err(status)) => {
                    stats.refused += 1;
                    let key = format!("report refused {:?}", status.code());
                    stats.messages.entry(key).or_insert_with(|| status.message().to_owned());
                }
            }
        }
    }
}

/// The report of a task: an ok sim measurement whose time depends on the config alone, so that
/// any worker reports the same for it.
fn report(worker_id: u64, task: &pb::Task) -> pb::ReportResultRequest {
    let measurement = |index: u64| {
        let median_us = 5.0 + ((index * 7919) % 1009) as f64 / 10.0;
        pb::Measurement {
            status: pb::RecordStatus::Ok as i32,
            compile_ms: 1.0,
            measure_ms: 1.0,
            samples_us: vec![median_us * 0.99, median_us, median_us * 1.01],
            median_us,
            spread: 0.02,
            batch: 100,
            baseline_us: Some(median_us * 1.5),
            baseline_kind: "sim".into(),
            max_abs_err: Some(0.0),
            max_rel_err: Some(0.0),
            provenance: Some(pb::Provenance {
                worker_name: "load".into(),
                gpu_name: "sim".into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    };
    let (measurement, finalist_measurements) = if task.finalist_indices.is_empty() {
        (Some(measurement(task.config_index)), Vec::new())
    } else {
        (None, task.finalist_indices.iter().map(|i| measurement(*i)).collect())
    };
    pb::ReportResultRequest {
        worker_id,
        task_id: task.task_id,
        measurement,
        finalist_measurements,
        lease_serial: task.lease_serial,
    }
}
