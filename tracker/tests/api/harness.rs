//! A real tracker on `127.0.0.1:0` with a temporary database, the generated clients, and a fake
//! worker played by the test.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tempfile::TempDir;
use tensortune_kernels::gemm::WmmaGemm;
use tensortune_kernels::{Target, Template};
use tensortune_proto::convert::device_from_target;
use tensortune_proto::pb;
use tensortune_proto::pb::dispatch_client::DispatchClient;
use tensortune_proto::pb::tuning_client::TuningClient;
use tensortune_tracker::TrackerConfig;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

/// How long any wait in a test may take before the test fails (never a timing assertion: only a
/// bound on a hang).
pub(crate) const PATIENCE: Duration = Duration::from_secs(180);

/// A running tracker.
pub(crate) struct TestTracker {
    pub(crate) addr: String,
    shutdown: CancellationToken,
    handle: JoinHandle<anyhow::Result<()>>,
}

impl TestTracker {
    /// Starts a tracker with `config` on a free port.
    pub(crate) async fn start(config: TrackerConfig) -> TestTracker {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = format!("http://{}", listener.local_addr().unwrap());
        let shutdown = CancellationToken::new();
        let handle = tokio::spawn(tensortune_tracker::run(config, listener, shutdown.clone()));
        TestTracker { addr, shutdown, handle }
    }

    /// A handle on a tracker started elsewhere (clients only; stopping it is its owner's job).
    pub(crate) fn attach(addr: &str) -> TestTracker {
        TestTracker {
            addr: addr.to_owned(),
            shutdown: CancellationToken::new(),
            handle: tokio::spawn(async { Ok(()) }),
        }
    }

    /// Stops it through its token and waits for a clean exit.
    pub(crate) async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(PATIENCE, self.handle).await.expect("tracker did not stop").unwrap().unwrap();
    }

    pub(crate) async fn tuning(&self) -> TuningClient<Channel> {
        TuningClient::connect(self.addr.clone()).await.unwrap()
    }

    pub(crate) async fn dispatch(&self) -> DispatchClient<Channel> {
        DispatchClient::connect(self.addr.clone()).await.unwrap()
    }
}

/// A configuration on a database of its own for `dir` (see [`database`]).
pub(crate) fn config(dir: &TempDir) -> TrackerConfig {
    TrackerConfig { db: database(dir), ..TrackerConfig::default() }
}

/// A configuration on a SQLite file in `dir`, for tests of SQLite itself (upgrades of its files).
pub(crate) fn sqlite_config(dir: &TempDir) -> TrackerConfig {
    TrackerConfig { db: dir.path().join("tracker.db"), ..TrackerConfig::default() }
}

/// The database a test on `dir` uses: a SQLite file in `dir`, or, when `TENSORTUNE_TEST_PG` names a
/// PostgreSQL server (`postgres://USER@HOST:PORT/DB`), a database of its own there, created now
/// (the same one every time for the same `dir`, so that a restarted tracker finds its data). A
/// server that cannot be reached fails the test: the suite never quietly runs on SQLite instead.
pub(crate) fn database(dir: &TempDir) -> PathBuf {
    match std::env::var("TENSORTUNE_TEST_PG") {
        Ok(server) if !server.is_empty() => PathBuf::from(pg_database(&server, dir.path())),
        _ => dir.path().join("tracker.db"),
    }
}

/// Whether the suite runs on PostgreSQL (`TENSORTUNE_TEST_PG` set).
pub(crate) fn on_postgres() -> bool {
    std::env::var("TENSORTUNE_TEST_PG").is_ok_and(|s| !s.is_empty())
}

/// Drops, once per process, the test databases that earlier test processes left on the server
/// (named `tt_PID_...`, PID no longer running). A run's own databases stay until the next run, or
/// go with the throwaway server `scripts/test.sh` starts.
async fn drop_leftovers(conn: &mut sqlx::PgConnection) {
    static DONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if DONE.swap(true, std::sync::atomic::Ordering::AcqRel) {
        return;
    }
    let names: Vec<String> = sqlx::query_scalar("SELECT datname FROM pg_database WHERE datname LIKE 'tt\\_%'")
        .fetch_all(&mut *conn)
        .await
        .unwrap_or_default();
    for name in names {
        let pid = name.split('_').nth(1).and_then(|p| p.parse::<u32>().ok());
        if pid.is_some_and(|pid| pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists()) {
            let _ = sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")))
                .execute(&mut *conn)
                .await;
        }
    }
}

/// Creates (when missing) the database of `dir` on the PostgreSQL `server`; returns its URL.
fn pg_database(server: &str, dir: &Path) -> String {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    dir.hash(&mut hasher);
    // The process id in the name lets a later run drop what this one left (see below).
    let name = format!("tt_{}_{:016x}", std::process::id(), hasher.finish());
    let Some((scheme, rest)) = server.split_once("://") else {
        panic!("TENSORTUNE_TEST_PG {server:?} is not a postgres:// URL");
    };
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    let url = format!("{scheme}://{authority}/{name}");
    // Tests call this from inside their runtime, where blocking on another future would panic: a
    // thread with a runtime of its own makes the database.
    let (server, create) = (server.to_owned(), format!("CREATE DATABASE {name}"));
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            use sqlx::Connection as _;
            let mut conn = sqlx::PgConnection::connect(&server)
                .await
                .unwrap_or_else(|e| panic!("TENSORTUNE_TEST_PG is set but {server:?} cannot be reached: {e}"));
            drop_leftovers(&mut conn).await;
            match sqlx::query(sqlx::AssertSqlSafe(create)).execute(&mut conn).await {
                Ok(_) => {}
                // 42P04: it exists (a restart of the same test's tracker).
                Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42P04") => {}
                Err(e) => panic!("cannot create a test database on {server:?}: {e}"),
            }
        });
    })
    .join()
    .expect("creating the test database failed");
    url
}

/// A configuration with short leases, for expiry tests.
pub(crate) fn short_leases(dir: &TempDir, max_attempts: u32) -> TrackerConfig {
    TrackerConfig {
        lease: Duration::from_millis(400),
        heartbeat: Duration::from_millis(100),
        max_attempts,
        ..config(dir)
    }
}

/// A sim-class device.
pub(crate) fn sim_device() -> pb::DeviceInfo {
    device_from_target(&Target::sim())
}

/// The registration of a worker named `name` with `device`.
pub(crate) fn registration(name: &str, device: pb::DeviceInfo) -> pb::RegisterRequest {
    pb::RegisterRequest {
        name: name.to_owned(),
        device: Some(device),
        templates: vec![pb::TemplateRef { name: "wmma_gemm".into(), version: WmmaGemm.version() }],
        previous_id: 0,
    }
}

/// A worker played by the test.
pub(crate) struct FakeWorker {
    pub(crate) id: u64,
    pub(crate) client: DispatchClient<Channel>,
}

impl FakeWorker {
    /// Registers a sim worker.
    pub(crate) async fn register(tracker: &TestTracker, name: &str) -> FakeWorker {
        Self::register_with(tracker, registration(name, sim_device())).await
    }

    pub(crate) async fn register_with(tracker: &TestTracker, req: pb::RegisterRequest) -> FakeWorker {
        let mut client = tracker.dispatch().await;
        let id = client.register(req).await.unwrap().into_inner().worker_id;
        FakeWorker { id, client }
    }

    pub(crate) async fn lease(&mut self, max_tasks: u32, wait_ms: u32) -> Vec<pb::Task> {
        let req = pb::LeaseTasksRequest { worker_id: self.id, max_tasks, wait_ms };
        self.client.lease_tasks(req).await.unwrap().into_inner().tasks
    }

    /// Leases until it gets at least one task.
    pub(crate) async fn lease_some(&mut self, max_tasks: u32) -> Vec<pb::Task> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let tasks = self.lease(max_tasks, 200).await;
            if !tasks.is_empty() {
                return tasks;
            }
            assert!(Instant::now() < deadline, "worker {} got no task", self.id);
        }
    }

    pub(crate) async fn report(
        &mut self,
        task: &pb::Task,
        measurement: pb::Measurement,
    ) -> Result<pb::ReportResultResponse, tonic::Status> {
        let req = pb::ReportResultRequest {
            worker_id: self.id,
            task_id: task.task_id,
            measurement: Some(measurement),
            lease_serial: task.lease_serial,
            ..Default::default()
        };
        self.client.report_result(req).await.map(|r| r.into_inner())
    }

    /// Reports a finalist task's re-measurements, one per finalist in the task's order.
    pub(crate) async fn report_finalists(
        &mut self,
        task: &pb::Task,
        measurements: Vec<pb::Measurement>,
    ) -> Result<pb::ReportResultResponse, tonic::Status> {
        let req = pb::ReportResultRequest {
            worker_id: self.id,
            task_id: task.task_id,
            finalist_measurements: measurements,
            lease_serial: task.lease_serial,
            ..Default::default()
        };
        self.client.report_result(req).await.map(|r| r.into_inner())
    }

    /// Heartbeats with a reference time (0: none yet).
    pub(crate) async fn heartbeat_reference(&mut self, reference_us: f64) -> Result<Vec<u64>, tonic::Status> {
        let req = pb::HeartbeatRequest { worker_id: self.id, task_ids: vec![], reference_us };
        self.client.heartbeat(req).await.map(|r| r.into_inner().drop_task_ids)
    }

    pub(crate) async fn heartbeat(&mut self, task_ids: &[u64]) -> Vec<u64> {
        let req = pb::HeartbeatRequest { worker_id: self.id, task_ids: task_ids.to_vec(), ..Default::default() };
        self.client.heartbeat(req).await.unwrap().into_inner().drop_task_ids
    }
}

/// The fake kernel time of a task's config: deterministic, different across configs.
pub(crate) fn fake_us(task: &pb::Task) -> f64 {
    5.0 + ((task.config_index * 7919) % 1009) as f64 / 10.0
}

/// The integer value of knob `name` in a tuning task's config.
pub(crate) fn knob(task: &pb::Task, name: &str) -> i64 {
    let config: serde_json::Value = serde_json::from_str(&task.config).unwrap();
    config[name].as_i64().unwrap_or_else(|| panic!("config {} has no integer knob {name}", task.config))
}

/// An ok measurement taking `median_us`.
pub(crate) fn ok(median_us: f64) -> pb::Measurement {
    pb::Measurement {
        status: pb::RecordStatus::Ok as i32,
        compile_ms: 12.0,
        measure_ms: 3.0,
        samples_us: vec![median_us * 0.99, median_us, median_us * 1.01],
        median_us,
        spread: 0.02,
        batch: 100,
        baseline_us: Some(median_us * 1.5),
        baseline_kind: "sim".into(),
        max_abs_err: Some(0.0),
        max_rel_err: Some(0.0),
        provenance: Some(pb::Provenance { worker_name: "test".into(), gpu_name: "sim".into(), ..Default::default() }),
        ..Default::default()
    }
}

/// A failed measurement with `status`.
pub(crate) fn failed(status: pb::RecordStatus) -> pb::Measurement {
    pb::Measurement { status: status as i32, error: "it broke".into(), ..Default::default() }
}

/// What the fake worker measures for a task: ok with [`fake_us`].
pub(crate) fn measure(task: &pb::Task) -> pb::Measurement {
    ok(fake_us(task))
}

/// Whether a leased task is a finalist task.
pub(crate) fn is_finalist(task: &pb::Task) -> bool {
    !task.finalist_configs.is_empty()
}

/// The tuning task a finalist of `task` was, for measuring it with a per-task function.
pub(crate) fn finalist_as_task(task: &pb::Task, pos: usize) -> pb::Task {
    pb::Task {
        config: task.finalist_configs[pos].clone(),
        config_index: task.finalist_indices[pos],
        finalist_configs: vec![],
        finalist_indices: vec![],
        rounds: 0,
        ..task.clone()
    }
}

/// A finalist task's re-measurements with `measure_fn` applied to each finalist as a task.
pub(crate) fn measure_finalists(
    task: &pb::Task,
    mut measure_fn: impl FnMut(&pb::Task) -> pb::Measurement,
) -> Vec<pb::Measurement> {
    (0..task.finalist_configs.len()).map(|pos| measure_fn(&finalist_as_task(task, pos))).collect()
}

/// An f16 NN matmul.
pub(crate) fn matmul(m: u64, n: u64, k: u64) -> pb::Workload {
    pb::Workload {
        op: Some(pb::workload::Op::Matmul(pb::Matmul {
            m,
            n,
            k,
            layout: pb::Layout::Nn as i32,
            input: pb::Dtype::F16 as i32,
            ..Default::default()
        })),
    }
}

/// A job over `workloads` with `trials` per workload and `batch_size` outstanding, without
/// finalists (tests of tuning count its records and tasks; finalist tests ask for them).
pub(crate) fn job(workloads: Vec<pb::Workload>, trials: u32, batch_size: u32) -> pb::SubmitJobRequest {
    pb::SubmitJobRequest {
        workloads,
        trials,
        batch_size,
        seed: 7,
        label: "test".into(),
        finalists: Some(1),
        ..Default::default()
    }
}

/// A job like [`job`] that re-measures `finalists` finalists per workload (0: the default).
pub(crate) fn job_with_finalists(
    workloads: Vec<pb::Workload>,
    trials: u32,
    batch_size: u32,
    finalists: Option<u32>,
) -> pb::SubmitJobRequest {
    pb::SubmitJobRequest { finalists, ..job(workloads, trials, batch_size) }
}

pub(crate) async fn submit(tuning: &mut TuningClient<Channel>, req: pb::SubmitJobRequest) -> u64 {
    tuning.submit_job(req).await.unwrap().into_inner().job_id
}

pub(crate) async fn get_job(tuning: &mut TuningClient<Channel>, id: u64) -> pb::Job {
    tuning.get_job(pb::JobRef { job_id: id }).await.unwrap().into_inner()
}

pub(crate) fn is_terminal(job: &pb::Job) -> bool {
    job.state != pb::JobState::Queued as i32 && job.state != pb::JobState::Running as i32
}

/// Leases and reports (with `measure_fn`; a finalist task with it applied to each finalist) until
/// the job ends; returns the reported tasks.
pub(crate) async fn drive_with(
    worker: &mut FakeWorker,
    tuning: &mut TuningClient<Channel>,
    job_id: u64,
    mut measure_fn: impl FnMut(&pb::Task) -> pb::Measurement,
) -> Vec<pb::Task> {
    let deadline = Instant::now() + PATIENCE;
    let mut reported = Vec::new();
    loop {
        if is_terminal(&get_job(tuning, job_id).await) {
            return reported;
        }
        assert!(Instant::now() < deadline, "job {job_id} did not finish");
        for task in worker.lease(16, 100).await {
            let r = if is_finalist(&task) {
                let measurements = measure_finalists(&task, &mut measure_fn);
                worker.report_finalists(&task, measurements).await.unwrap()
            } else {
                worker.report(&task, measure_fn(&task)).await.unwrap()
            };
            assert!(r.stored, "task {} was not stored", task.task_id);
            reported.push(task);
        }
    }
}

/// Leases and reports tuning tasks (with `measure_fn`) until a finalist task is leased; returns
/// the reported tuning tasks and the leased finalist task.
pub(crate) async fn tune_until_finalist(
    worker: &mut FakeWorker,
    mut measure_fn: impl FnMut(&pb::Task) -> pb::Measurement,
) -> (Vec<pb::Task>, pb::Task) {
    let deadline = Instant::now() + PATIENCE;
    let mut reported = Vec::new();
    loop {
        assert!(Instant::now() < deadline, "no finalist task after {} tuning tasks", reported.len());
        for task in worker.lease(1, 100).await {
            if is_finalist(&task) {
                return (reported, task);
            }
            assert!(worker.report(&task, measure_fn(&task)).await.unwrap().stored);
            reported.push(task);
        }
    }
}

/// Drives the job to its end with [`measure`].
pub(crate) async fn drive(worker: &mut FakeWorker, tuning: &mut TuningClient<Channel>, job_id: u64) -> Vec<pb::Task> {
    drive_with(worker, tuning, job_id, measure).await
}

/// Every record matching `req`.
pub(crate) async fn export(tuning: &mut TuningClient<Channel>, req: pb::ExportRecordsRequest) -> Vec<pb::Record> {
    let mut stream = tuning.export_records(req).await.unwrap().into_inner();
    let mut out = Vec::new();
    while let Some(r) = stream.message().await.unwrap() {
        out.push(r);
    }
    out
}

pub(crate) async fn all_records(tuning: &mut TuningClient<Channel>) -> Vec<pb::Record> {
    export(tuning, pb::ExportRecordsRequest::default()).await
}

/// Polls `check` until it yields a value.
pub(crate) async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The status code and message of a failed call.
pub(crate) fn code<T: std::fmt::Debug>(r: Result<T, tonic::Status>) -> (tonic::Code, String) {
    let status = r.expect_err("the call should have failed");
    (status.code(), status.message().to_owned())
}
