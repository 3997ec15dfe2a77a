//! The worker daemon against a fake tracker: real measuring children (this crate's binary) on the
//! `sim` device, and real NVRTC compiles.
//!
//! The fake serves tasks in waves: the next wave is released once every task of the previous one
//! was reported or dropped, which orders the tests' events without sleeping.

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tensortune_kernels::gemm::WmmaGemm;
use tensortune_kernels::{Config, DType, Layout, Matmul, Target, Template, Types, Workload, template};
use tensortune_proto::pb;
use tensortune_proto::pb::dispatch_server::{Dispatch, DispatchServer};
use tensortune_worker::{DeviceSpec, SimFault, WorkerConfig, nvrtc};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

/// Heartbeat interval the fake asks for: short, so drops take effect while a task waits.
const HEARTBEAT_MS: u32 = 100;
/// Guard against a hung test (not a timing assertion).
const TEST_DEADLINE: Duration = Duration::from_secs(240);

fn require_nvrtc() {
    assert!(
        nvrtc::available() && nvrtc::find_include_dir().is_some(),
        "NVRTC is not loadable, and these tests compile real kernels: run scripts/setup-nvrtc.sh, then \
         export LD_LIBRARY_PATH=$PWD/.nvrtc/nvidia/cu13/lib"
    );
}

fn workload() -> Workload {
    Workload::Matmul(Matmul::new(512, 64, 512, Layout::Nn, Types::default_for(DType::F16).unwrap()).unwrap())
}

/// Indices of valid configs of the test workload on the sim device, spread over the space.
fn valid_indices(n: usize) -> Vec<u64> {
    let valid = template::valid_configs(&WmmaGemm, &workload(), &Target::sim()).unwrap();
    (0..n).map(|i| valid[i * (valid.len() - 1) / (n - 1).max(1)].0).collect()
}

fn config_at(index: u64) -> Config {
    WmmaGemm.space().config(index).unwrap()
}

fn kernel_name(index: u64) -> String {
    WmmaGemm.generate(&workload(), &config_at(index), &Target::sim()).unwrap().launch.name
}

fn task(task_id: u64, index: u64) -> pb::Task {
    let w = workload();
    pb::Task {
        task_id,
        job_id: 1,
        workload: Some((&w).into()),
        workload_key: w.key(),
        template: WmmaGemm.name().into(),
        template_version: WmmaGemm.version(),
        config: config_at(index).to_json(),
        config_index: index,
        samples: 5,
        lease_expires_ms: 0,
        ..Default::default()
    }
}

/// A finalist task: re-measure `indices` for `rounds` rounds.
fn finalist_task(task_id: u64, indices: &[u64], rounds: u32) -> pb::Task {
    pb::Task {
        config: String::new(),
        config_index: 0,
        finalist_configs: indices.iter().map(|&i| config_at(i).to_json()).collect(),
        finalist_indices: indices.to_vec(),
        rounds,
        ..task(task_id, 0)
    }
}

/// The sim's time for config `index`: what a sim measurement of it reads, within its jitter.
fn model_us(index: u64) -> f64 {
    WmmaGemm.model_us(&workload(), &config_at(index), &Target::sim()).unwrap()
}

#[derive(Debug, Default)]
struct State {
    /// Tasks not yet released.
    waves: VecDeque<Vec<pb::Task>>,
    /// Released, not yet leased.
    pending: VecDeque<pb::Task>,
    /// Leased, neither reported nor dropped.
    outstanding: HashSet<u64>,
    max_outstanding: usize,
    max_asked: u32,
    registrations: Vec<pb::RegisterRequest>,
    heartbeats: Vec<Vec<u64>>,
    /// The reference time of each heartbeat.
    references: Vec<f64>,
    /// Accepted reports, in arrival order.
    reports: Vec<pb::ReportResultRequest>,
    report_attempts: usize,
    /// `ReportResults` calls (batches of reports).
    batch_calls: usize,
    /// Answer this many report calls with Unavailable.
    fail_reports: usize,
    /// Answer the next heartbeat with NotFound, like a tracker that lost the worker.
    forget_worker: bool,
    /// Drop these tasks when a heartbeat lists them.
    drop_when_held: HashSet<u64>,
    /// Dropped task -> index of the heartbeat that dropped it.
    dropped: HashMap<u64, usize>,
}

impl State {
    fn release(&mut self) {
        if self.pending.is_empty()
            && self.outstanding.is_empty()
            && let Some(wave) = self.waves.pop_front()
        {
            self.pending.extend(wave);
        }
    }

    /// Takes a report: `(stored, record_id)`, or the refusal of a task not leased.
    fn accept(&mut self, request: pb::ReportResultRequest) -> Result<(bool, u64), Status> {
        if self.reports.iter().any(|r| r.task_id == request.task_id) {
            return Ok((false, 0));
        }
        if !self.outstanding.remove(&request.task_id) {
            return Err(Status::failed_precondition(format!("task {} is not leased to this worker", request.task_id)));
        }
        self.reports.push(request);
        let record_id = self.reports.len() as u64;
        self.release();
        Ok((true, record_id))
    }

    fn report(&self, task_id: u64) -> &pb::Measurement {
        let r =
            self.reports.iter().find(|r| r.task_id == task_id).unwrap_or_else(|| panic!("no report of task {task_id}"));
        assert!(r.finalist_measurements.is_empty(), "a tuning task's report has no finalists: {r:?}");
        r.measurement.as_ref().expect("reports carry a measurement")
    }

    fn finalists(&self, task_id: u64) -> &[pb::Measurement] {
        let r =
            self.reports.iter().find(|r| r.task_id == task_id).unwrap_or_else(|| panic!("no report of task {task_id}"));
        assert!(r.measurement.is_none(), "a finalist task's report has no single measurement: {r:?}");
        &r.finalist_measurements
    }
}

struct Fake {
    state: Mutex<State>,
    changed: Notify,
}

impl Fake {
    fn new(waves: Vec<Vec<pb::Task>>) -> Arc<Fake> {
        Arc::new(Fake { state: Mutex::new(State { waves: waves.into(), ..State::default() }), changed: Notify::new() })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap()
    }
}

#[tonic::async_trait]
impl Dispatch for Fake {
    async fn register(&self, request: Request<pb::RegisterRequest>) -> Result<Response<pb::RegisterResponse>, Status> {
        let request = request.into_inner();
        let mut st = self.state();
        let worker_id = if request.previous_id != 0 { request.previous_id } else { 40 + st.registrations.len() as u64 };
        st.registrations.push(request);
        self.changed.notify_waiters();
        Ok(Response::new(pb::RegisterResponse { worker_id, lease_ms: 30_000, heartbeat_ms: HEARTBEAT_MS }))
    }

    async fn heartbeat(
        &self,
        request: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::HeartbeatResponse>, Status> {
        let request = request.into_inner();
        let mut st = self.state();
        if std::mem::take(&mut st.forget_worker) {
            return Err(Status::not_found(format!("worker {} is not registered", request.worker_id)));
        }
        let index = st.heartbeats.len();
        let drop_task_ids: Vec<u64> =
            request.task_ids.iter().copied().filter(|id| st.drop_when_held.remove(id)).collect();
        for id in &drop_task_ids {
            st.outstanding.remove(id);
            st.dropped.insert(*id, index);
        }
        st.heartbeats.push(request.task_ids);
        st.references.push(request.reference_us);
        st.release();
        self.changed.notify_waiters();
        Ok(Response::new(pb::HeartbeatResponse { drop_task_ids }))
    }

    async fn lease_tasks(
        &self,
        request: Request<pb::LeaseTasksRequest>,
    ) -> Result<Response<pb::LeaseTasksResponse>, Status> {
        let request = request.into_inner();
        // A short long-poll keeps the worker's shutdown quick.
        let deadline = Instant::now() + Duration::from_millis(u64::from(request.wait_ms.min(300)));
        loop {
            let changed = self.changed.notified();
            {
                let mut st = self.state();
                st.max_asked = st.max_asked.max(request.max_tasks);
                st.release();
                if !st.pending.is_empty() {
                    let n = st.pending.len().min(request.max_tasks as usize);
                    let tasks: Vec<pb::Task> = st.pending.drain(..n).collect();
                    st.outstanding.extend(tasks.iter().map(|t| t.task_id));
                    st.max_outstanding = st.max_outstanding.max(st.outstanding.len());
                    return Ok(Response::new(pb::LeaseTasksResponse { tasks }));
                }
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return Ok(Response::new(pb::LeaseTasksResponse { tasks: Vec::new() }));
            }
        }
    }

    async fn report_result(
        &self,
        request: Request<pb::ReportResultRequest>,
    ) -> Result<Response<pb::ReportResultResponse>, Status> {
        let request = request.into_inner();
        let mut st = self.state();
        st.report_attempts += 1;
        if st.fail_reports > 0 {
            st.fail_reports -= 1;
            return Err(Status::unavailable("the tracker is restarting"));
        }
        let (stored, record_id) = st.accept(request)?;
        self.changed.notify_waiters();
        Ok(Response::new(pb::ReportResultResponse { stored, record_id }))
    }

    /// As many `report_result`s in one call: a failed call counts as one attempt, a delivered one
    /// as one per report (so that the tests' counts do not depend on how reports were batched).
    async fn report_results(
        &self,
        request: Request<pb::ReportResultsRequest>,
    ) -> Result<Response<pb::ReportResultsResponse>, Status> {
        let request = request.into_inner();
        let mut st = self.state();
        st.batch_calls += 1;
        if st.fail_reports > 0 {
            st.report_attempts += 1;
            st.fail_reports -= 1;
            return Err(Status::unavailable("the tracker is restarting"));
        }
        let mut outcomes = Vec::new();
        for r in request.reports {
            st.report_attempts += 1;
            let task_id = r.task_id;
            let r = pb::ReportResultRequest { worker_id: request.worker_id, ..r };
            outcomes.push(match st.accept(r) {
                Ok((stored, record_id)) => pb::ReportOutcome { task_id, stored, record_id, ..Default::default() },
                Err(s) => pb::ReportOutcome {
                    task_id,
                    code: s.code() as i32,
                    message: s.message().to_owned(),
                    ..Default::default()
                },
            });
        }
        self.changed.notify_waiters();
        Ok(Response::new(pb::ReportResultsResponse { outcomes }))
    }

    /// A tracker that predates `Leave`: the worker must stop all the same.
    async fn leave(&self, _request: Request<pb::LeaveRequest>) -> Result<Response<pb::LeaveResponse>, Status> {
        Err(Status::unimplemented("this fake tracker predates Leave"))
    }
}

/// Serves `fake` on a free port until the returned token is cancelled; returns its address.
async fn serve(fake: Arc<Fake>) -> (String, CancellationToken) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let stop = CancellationToken::new();
    let served = stop.clone();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(DispatchServer::from_arc(fake))
            .serve_with_incoming_shutdown(TcpIncoming::from(listener), served.cancelled_owned())
            .await
            .unwrap();
    });
    (url, stop)
}

fn worker_config(url: &str, cache: &Path) -> WorkerConfig {
    let mut c = WorkerConfig::new(url, DeviceSpec::Sim);
    c.name = Some("test/sim".into());
    c.compile_threads = 2;
    c.cache_dir = Some(cache.to_owned());
    c.child_command = vec![env!("CARGO_BIN_EXE_tensortune-worker").into(), "__measure-child".into()];
    c
}

/// Runs a worker against `fake` until `done` holds, then shuts it down and checks it stopped
/// cleanly.
async fn run_until(fake: &Arc<Fake>, config: WorkerConfig, done: impl Fn(&State) -> bool) {
    run_until_at(fake, config, str::to_owned, done).await;
}

/// [`run_until`], the worker given `tracker(url of fake)` as its tracker address(es).
async fn run_until_at(
    fake: &Arc<Fake>,
    config: WorkerConfig,
    tracker: impl Fn(&str) -> String,
    done: impl Fn(&State) -> bool,
) {
    let (url, server) = serve(fake.clone()).await;
    let config = WorkerConfig { tracker: tracker(&url), ..config };
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn(tensortune_worker::run(config, shutdown.clone()));
    let deadline = Instant::now() + TEST_DEADLINE;
    loop {
        let changed = fake.changed.notified();
        if done(&fake.state()) {
            break;
        }
        if worker.is_finished() {
            panic!("the worker stopped early: {:?}", worker.await);
        }
        assert!(Instant::now() < deadline, "the test ran out of time; fake tracker: {:#?}", fake.state());
        let _ = tokio::time::timeout(Duration::from_millis(200), changed).await;
    }
    shutdown.cancel();
    worker.await.unwrap().expect("the worker shuts down cleanly");
    server.cancel();
}

fn status(m: &pb::Measurement) -> pb::RecordStatus {
    m.status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_task_is_compiled_measured_and_then_served_from_the_cache() {
    require_nvrtc();
    let cache = tempfile::tempdir().unwrap();
    let indices = valid_indices(3);
    let fake = Fake::new(vec![indices.iter().enumerate().map(|(i, &c)| task(1 + i as u64, c)).collect()]);
    run_until(&fake, worker_config("", cache.path()), |st| st.reports.len() == 3).await;
    {
        let st = fake.state();
        let reg = &st.registrations[0];
        let device = reg.device.as_ref().unwrap();
        assert_eq!((reg.name.as_str(), device.class_key.as_str(), device.arch), ("test/sim", "sim", 90));
        assert!(!device.nvrtc_version.is_empty());
        assert!(reg.templates.iter().any(|t| t.name == "wmma_gemm" && t.version == WmmaGemm.version()));
        for id in 1..=3 {
            let m = st.report(id);
            assert_eq!(status(m), pb::RecordStatus::Ok, "{}", m.error);
            assert!(m.compile_ms > 0.0 && !m.cache_hit, "task {id} was compiled: {m:?}");
            assert_eq!(m.samples_us.len(), 5);
            assert!(m.median_us > 0.0 && m.batch >= 50 && m.smem_bytes > 0);
            assert_eq!((m.baseline_us.is_some(), m.baseline_kind.as_str()), (true, "model"));
            assert!(m.vendor_algo.starts_with("algo=sim tile="), "the vendor's algorithm: {:?}", m.vendor_algo);
            assert_eq!((m.max_abs_err, m.max_rel_err), (None, None), "sim runs no kernel");
            let p = m.provenance.as_ref().unwrap();
            assert_eq!((p.worker_name.as_str(), p.gpu_uuid.as_str()), ("test/sim", "sim-0"));
            assert_eq!(p.nvrtc_version, device.nvrtc_version);
        }
    }

    // A new worker on the same cache directory measures the same configs without compiling.
    let again = Fake::new(vec![indices.iter().enumerate().map(|(i, &c)| task(11 + i as u64, c)).collect()]);
    run_until(&again, worker_config("", cache.path()), |st| st.reports.len() == 3).await;
    let st = again.state();
    for id in 11..=13 {
        let m = st.report(id);
        assert_eq!(status(m), pb::RecordStatus::Ok, "{}", m.error);
        assert!(m.cache_hit && m.compile_ms == 0.0, "task {id} came from the disk cache: {m:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_given_several_trackers_moves_past_one_that_is_down() {
    require_nvrtc();
    let cache = tempfile::tempdir().unwrap();
    // A port nothing listens on: the first tracker of the list refuses every connection.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let indices = valid_indices(2);
    let fake = Fake::new(vec![indices.iter().enumerate().map(|(i, &c)| task(1 + i as u64, c)).collect()]);
    let list = |url: &str| format!("http://127.0.0.1:{dead},{url}");
    run_until_at(&fake, worker_config("", cache.path()), list, |st| st.reports.len() == 2).await;
    let st = fake.state();
    assert_eq!(st.registrations.len(), 1, "registered once, with the tracker that answered");
    for id in 1..=2 {
        assert_eq!(status(st.report(id)), pb::RecordStatus::Ok);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_never_exceed_the_room_and_every_task_is_reported() {
    require_nvrtc();
    let cache = tempfile::tempdir().unwrap();
    let mut config = worker_config("", cache.path());
    config.compile_threads = 1;
    let room = config.max_in_flight();
    // One config for all tasks: one compile, then the pipeline is limited by leasing alone.
    let index = valid_indices(1)[0];
    let n = 3 * room as u64;
    let fake = Fake::new(vec![(1..=n).map(|id| task(id, index)).collect()]);
    run_until(&fake, config, |st| st.reports.len() == n as usize).await;
    let st = fake.state();
    assert!(st.max_outstanding <= room, "{} tasks held at once; the room is {room}", st.max_outstanding);
    assert!(st.max_asked as usize <= room, "asked for {} tasks; the room is {room}", st.max_asked);
    assert!(st.reports.iter().all(|r| status(r.measurement.as_ref().unwrap()) == pb::RecordStatus::Ok));
    let compiled = st.reports.iter().filter(|r| !r.measurement.as_ref().unwrap().cache_hit).count();
    assert_eq!(compiled, 1, "one image serves every task of the same config");
    assert_eq!(st.report_attempts, n as usize, "each task is reported once");
    assert!(st.batch_calls > 0, "reports go through ReportResults");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configs_that_cannot_run_are_invalid_without_compiling() {
    require_nvrtc();
    let cache = tempfile::tempdir().unwrap();
    let w = workload();
    let space = WmmaGemm.space();
    let rejected = (0..space.len()).find(|&i| WmmaGemm.check(&w, &config_at(i), &Target::sim()).is_err()).unwrap();
    let reason = WmmaGemm.check(&w, &config_at(rejected), &Target::sim()).unwrap_err().to_string();
    let mut bad_json = task(2, rejected);
    bad_json.config = r#"{"block_m": 7}"#.into();
    let mut future_version = task(3, valid_indices(1)[0]);
    future_version.template_version = WmmaGemm.version() + 1;
    let fake = Fake::new(vec![vec![task(1, rejected), bad_json, future_version, task(4, valid_indices(1)[0])]]);
    run_until(&fake, worker_config("", cache.path()), |st| st.reports.len() == 4).await;

    let st = fake.state();
    for (id, want) in [(1, reason.as_str()), (2, "block_m"), (3, "version")] {
        let m = st.report(id);
        assert_eq!(status(m), pb::RecordStatus::InvalidConfig);
        assert!(m.error.contains(want), "task {id}: {:?} should mention {want:?}", m.error);
        assert!(m.compile_ms == 0.0 && !m.cache_hit && m.samples_us.is_empty());
    }
    assert_eq!(status(st.report(4)), pb::RecordStatus::Ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashing_and_hanging_kernels_do_not_take_the_worker_down() {
    require_nvrtc();
    let cache = tempfile::tempdir().unwrap();
    let [ok_a, crash, hang, ok_b]: [u64; 4] = valid_indices(4).try_into().unwrap();
    let mut config = worker_config("", cache.path());
    config.measure_timeout = Duration::from_secs(3);
    config.sim_faults = vec![SimFault::crash(kernel_name(crash)), SimFault::hang(kernel_name(hang))];
    // One task per wave: each ok task after a fault ran in a fresh child.
    let fake = Fake::new(vec![vec![task(1, crash)], vec![task(2, ok_a)], vec![task(3, hang)], vec![task(4, ok_b)]]);
    run_until(&fake, config, |st| st.reports.len() == 4).await;

    let st = fake.state();
    let crashed = st.report(1);
    assert_eq!(status(crashed), pb::RecordStatus::LaunchError);
    assert!(crashed.error.contains("SIGABRT"), "the record says how the child died: {}", crashed.error);
    let hung = st.report(3);
    assert_eq!(status(hung), pb::RecordStatus::Timeout);
    assert!(hung.error.contains("deadline"), "{}", hung.error);
    for id in [2, 4] {
        let m = st.report(id);
        assert_eq!(status(m), pb::RecordStatus::Ok, "task {id}: {}", m.error);
        assert!(m.baseline_us.is_some(), "the baseline survives child restarts");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushing_tasks_reach_the_child_and_get_their_own_baseline() {
    require_nvrtc();
    let cache = tempfile::tempdir().unwrap();
    let index = valid_indices(1)[0];
    let flushed = pb::Task { flush_l2: true, ..task(2, index) };
    let fake = Fake::new(vec![vec![task(1, index)], vec![flushed]]);
    run_until(&fake, worker_config("", cache.path()), |st| st.reports.len() == 2).await;
    let st = fake.state();
    let (warm, cold) = (st.report(1), st.report(2));
    assert_eq!((status(warm), status(cold)), (pb::RecordStatus::Ok, pb::RecordStatus::Ok));
    assert!(warm.batch >= 50, "warm samples replay a batch: {warm:?}");
    assert_eq!(cold.batch, 1, "each flushed sample is one launch: {cold:?}");
    assert!(cold.baseline_us.is_some(), "the baseline was timed again for flushed records");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finalists_are_measured_in_rounds_and_reported_in_task_order() {
    require_nvrtc();
    let cache = tempfile::tempdir().unwrap();
    let indices = valid_indices(3);
    // A tuning task first, so that the finalists' images come from the cache as they would.
    let fake = Fake::new(vec![vec![task(1, indices[0])], vec![finalist_task(2, &indices, 2)]]);
    run_until(&fake, worker_config("", cache.path()), |st| st.reports.len() == 2).await;

    let st = fake.state();
    let finalists = st.finalists(2);
    assert_eq!(finalists.len(), 3, "one measurement per config: {finalists:?}");
    for (m, &index) in finalists.iter().zip(&indices) {
        assert_eq!(status(m), pb::RecordStatus::Ok, "config {index}: {}", m.error);
        assert_eq!(m.samples_us.len(), 2 * 5, "config {index}: the samples of both rounds");
        let spec = WmmaGemm.generate(&workload(), &config_at(index), &Target::sim()).unwrap();
        let model = model_us(index);
        assert_eq!(m.smem_bytes, spec.smem_bytes, "config {index} is in its place");
        assert!((m.median_us / model - 1.0).abs() < 0.01, "config {index}: {} us, model {model} us", m.median_us);
        assert!(m.baseline_us.is_some() && m.provenance.is_some());
    }
    assert!(finalists[0].cache_hit, "the tuned config's image is reused");
}

/// Two valid configs whose sim times differ by a factor within `range` (slower / faster).
fn pair_apart(range: std::ops::Range<f64>) -> (u64, u64) {
    let valid = template::valid_configs(&WmmaGemm, &workload(), &Target::sim()).unwrap();
    let mut timed: Vec<(u64, f64)> = valid.iter().map(|(i, _)| (*i, model_us(*i))).collect();
    timed.sort_by(|a, b| a.1.total_cmp(&b.1));
    for (a, fast) in timed.iter().enumerate() {
        if let Some(slow) = timed[a + 1..].iter().find(|slow| range.contains(&(slow.1 / fast.1))) {
            return (fast.0, slow.0);
        }
    }
    panic!("no two valid configs are {range:?} apart");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finalist_rounds_stop_once_they_cannot_change_the_verdict() {
    require_nvrtc();
    let cache = tempfile::tempdir().unwrap();
    // Far apart (10% and more): separated after the minimum two rounds of the five allowed.
    let (fast, slow) = pair_apart(1.1..10.0);
    let far = finalist_task(1, &[slow, fast], 5);
    // The same config twice: within noise, also after two rounds.
    let (same, _) = pair_apart(1.1..10.0);
    let tied = finalist_task(2, &[same, same], 5);
    // 0.6% apart: beyond the noise floor of a sim's identical rounds, short of three noises; more
    // rounds are wanted, up to the task's four.
    let (near_fast, near_slow) = pair_apart(1.005..1.008);
    let near = finalist_task(3, &[near_fast, near_slow], 4);
    let fake = Fake::new(vec![vec![far], vec![tied], vec![near]]);
    run_until(&fake, worker_config("", cache.path()), |st| st.reports.len() == 3).await;

    let st = fake.state();
    for (task, rounds) in [(1, 2), (2, 2), (3, 4)] {
        let finalists = st.finalists(task);
        assert_eq!(finalists.len(), 2, "task {task}");
        for m in finalists {
            assert_eq!(status(m), pb::RecordStatus::Ok, "task {task}: {}", m.error);
            assert_eq!(m.samples_us.len(), rounds * 5, "task {task}: {rounds} rounds of 5 samples");
            assert!(m.baseline_us.is_some(), "task {task}: the vendor was timed beside each round");
        }
    }
    let far = st.finalists(1);
    assert!(
        far[1].median_us * 1.1 <= far[0].median_us,
        "records in task order: {} {}",
        far[0].median_us,
        far[1].median_us
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finalist_that_crashes_its_child_does_not_lose_the_others() {
    require_nvrtc();
    let cache = tempfile::tempdir().unwrap();
    let indices = valid_indices(3);
    let mut config = worker_config("", cache.path());
    config.sim_faults = vec![SimFault::crash(kernel_name(indices[1]))];
    let fake = Fake::new(vec![vec![finalist_task(1, &indices, 2)], vec![task(2, indices[2])]]);
    run_until(&fake, config, |st| st.reports.len() == 2).await;

    let st = fake.state();
    let finalists = st.finalists(1);
    assert_eq!(finalists.len(), 3);
    let crashed = &finalists[1];
    assert_eq!(status(crashed), pb::RecordStatus::LaunchError);
    assert!(crashed.error.starts_with("round 1 of 2: ") && crashed.error.contains("SIGABRT"), "{}", crashed.error);
    assert!(crashed.samples_us.is_empty());
    for i in [0, 2] {
        let m = &finalists[i];
        assert_eq!(status(m), pb::RecordStatus::Ok, "finalist {i}: {}", m.error);
        assert_eq!(m.samples_us.len(), 10, "finalist {i} was measured in both rounds, before and after the crash");
    }
    assert_eq!(status(st.report(2)), pb::RecordStatus::Ok, "the worker goes on after the finalist task");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finalists_that_cannot_run_are_settled_without_the_gpu() {
    require_nvrtc();
    let cache = tempfile::tempdir().unwrap();
    let w = workload();
    let rejected = (0..WmmaGemm.space().len()).find(|&i| WmmaGemm.check(&w, &config_at(i), &Target::sim()).is_err());
    let (rejected, ok) = (rejected.unwrap(), valid_indices(1)[0]);
    let mut future_version = finalist_task(2, &[ok, ok], 3);
    future_version.template_version = WmmaGemm.version() + 1;
    let fake = Fake::new(vec![vec![finalist_task(1, &[rejected, ok], 3), future_version]]);
    run_until(&fake, worker_config("", cache.path()), |st| st.reports.len() == 2).await;

    let st = fake.state();
    let mixed = st.finalists(1);
    assert_eq!((status(&mixed[0]), status(&mixed[1])), (pb::RecordStatus::InvalidConfig, pb::RecordStatus::Ok));
    // The one finalist left has nothing to be compared with: the minimum rounds, not all 3.
    assert_eq!(mixed[1].samples_us.len(), 2 * 5);
    let refused = st.finalists(2);
    assert_eq!(refused.len(), 2);
    assert!(refused.iter().all(|m| status(m) == pb::RecordStatus::InvalidConfig && m.error.contains("version")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_the_tracker_drops_are_abandoned() {
    require_nvrtc();
    let cache = tempfile::tempdir().unwrap();
    let [hang, queued, kept]: [u64; 3] = valid_indices(3).try_into().unwrap();
    let mut config = worker_config("", cache.path());
    config.measure_timeout = Duration::from_secs(5);
    config.sim_faults = vec![SimFault::hang(kernel_name(hang))];
    // Task 1 hangs in the child, so tasks 2 and 3 wait for the GPU behind it; the tracker drops
    // 1 (mid-measurement) and 2 (queued) as soon as a heartbeat lists them.
    let fake = Fake::new(vec![vec![task(1, hang)], vec![task(2, queued), task(3, kept)]]);
    fake.state().drop_when_held = [1, 2].into();
    run_until(&fake, config, |st| st.reports.len() == 1).await;

    let st = fake.state();
    assert_eq!(st.reports.len(), 1, "only the task that was kept is reported: {:?}", st.reports);
    assert_eq!(status(st.report(3)), pb::RecordStatus::Ok);
    assert_eq!(st.report_attempts, 1);
    for id in [1, 2] {
        let at = st.dropped[&id];
        assert!(
            st.heartbeats[at + 1..].iter().all(|ids| !ids.contains(&id)),
            "task {id} is no longer held after its drop: {:?}",
            st.heartbeats
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_are_retried_and_a_forgotten_worker_registers_again() {
    require_nvrtc();
    let cache = tempfile::tempdir().unwrap();
    let index = valid_indices(1)[0];
    let fake = Fake::new(vec![vec![task(1, index), task(2, index)]]);
    {
        let mut st = fake.state();
        st.fail_reports = 2;
        st.forget_worker = true;
    }
    run_until(&fake, worker_config("", cache.path()), |st| st.reports.len() == 2 && st.registrations.len() == 2).await;

    let st = fake.state();
    assert_eq!(st.report_attempts, 4, "two failed attempts, then one per task");
    assert!(st.reports.iter().all(|r| status(r.measurement.as_ref().unwrap()) == pb::RecordStatus::Ok));
    assert_eq!(st.registrations[0].previous_id, 0);
    assert_eq!(st.registrations[1].previous_id, st.reports[0].worker_id, "registers again under its old id");
    assert_eq!(st.registrations[1].name, st.registrations[0].name);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_carry_the_drift_reference_time_from_the_start() {
    require_nvrtc();
    let cache = tempfile::tempdir().unwrap();
    // No task at all: the reference is measured at start regardless.
    let fake = Fake::new(Vec::new());
    let timed = |st: &State| st.references.iter().filter(|&&us| us > 0.0).count();
    run_until(&fake, worker_config("", cache.path()), |st| timed(st) >= 3).await;
    let (workload, config) = template::drift_reference();
    let model = WmmaGemm.model_us(&workload, &config, &Target::sim()).unwrap();
    let st = fake.state();
    let reference = st.references.iter().copied().find(|&us| us > 0.0).unwrap();
    assert!(
        (reference / model - 1.0).abs() < 0.01,
        "the sim's reference is its model: {reference} us, model {model} us"
    );
    let first = st.references.iter().position(|&us| us > 0.0).unwrap();
    assert!(st.references[first..].iter().all(|&us| us == reference), "later heartbeats keep it: {:?}", st.references);
}

#[tokio::test]
async fn probe_describes_the_sim_device() {
    let config = worker_config("http://127.0.0.1:1", Path::new("/nonexistent"));
    let device = tensortune_worker::probe(&config).await.unwrap();
    assert_eq!((device.class_key.as_str(), device.uuid.as_str(), device.arch), ("sim", "sim-0", 90));
    assert_eq!(device.nvrtc_version, nvrtc::version().unwrap_or_default());
}

#[tokio::test]
async fn a_device_that_cannot_open_fails_probe_and_run_with_the_childs_reason() {
    let mut config = worker_config("http://127.0.0.1:1", Path::new("/nonexistent"));
    config.device = DeviceSpec::Cuda(99);
    let e = tensortune_worker::probe(&config).await.unwrap_err();
    assert!(format!("{e:#}").contains("cuda:99"), "{e:#}");
    let e = tensortune_worker::run(config, CancellationToken::new()).await.unwrap_err();
    assert!(format!("{e:#}").contains("cuda:99"), "{e:#}");
}

#[tokio::test]
async fn every_gpu_of_a_set_runs_its_own_worker_and_reports_its_own_failure() {
    let mut config = worker_config("http://127.0.0.1:1", Path::new("/nonexistent"));
    config.device = "cuda:98,99".parse().unwrap();
    let e = format!("{:#}", tensortune_worker::run(config.clone(), CancellationToken::new()).await.unwrap_err());
    assert!(e.contains("2 of 2 GPU workers failed") && e.contains("cuda:98") && e.contains("cuda:99"), "{e}");
    let e = format!("{:#}", tensortune_worker::probe(&config).await.unwrap_err());
    assert!(e.contains("cuda:98") && !e.contains("cuda:99"), "probe describes the first GPU: {e}");
}

#[tokio::test]
async fn children_that_do_not_speak_the_protocol_are_reported() {
    let mut config = worker_config("http://127.0.0.1:1", Path::new("/nonexistent"));
    config.child_command = vec!["sh".into(), "-c".into(), "echo 'not a frame'; exec sleep 30".into(), "sh".into()];
    let e = format!("{:#}", tensortune_worker::probe(&config).await.unwrap_err());
    assert!(e.contains("did not say hello") && e.contains("exceeds the limit"), "{e}");

    config.child_command = vec!["/nonexistent/tensortune-worker".into()];
    let e = format!("{:#}", tensortune_worker::probe(&config).await.unwrap_err());
    assert!(e.contains("could not start the measuring child"), "{e}");
}

/// The daemon driving the real `cuda` backend. On a GPU machine:
/// `TENSORTUNE_WORKER_BIN=path/to/tensortune-worker <this test binary> --ignored --nocapture cuda_`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a GPU"]
async fn cuda_records_are_verified_timed_and_compared_with_the_vendor() {
    require_nvrtc();
    let cache = tempfile::tempdir().unwrap();
    let mut config = worker_config("", cache.path());
    config.device = DeviceSpec::Cuda(0);
    config.compile_threads = 0;
    if let Ok(bin) = std::env::var("TENSORTUNE_WORKER_BIN") {
        config.child_command[0] = bin;
    }
    let device = tensortune_worker::probe(&config).await.unwrap();
    let target = tensortune_proto::convert::target_from_device(&device).unwrap();
    let valid = template::valid_configs(&WmmaGemm, &workload(), &target).unwrap();
    let indices: Vec<u64> = (0..8).map(|i| valid[i * (valid.len() - 1) / 7].0).collect();
    // The last waves repeat the first config: cached image, support module already in the child;
    // then once more from a cold L2; then three configs as finalists, two rounds.
    let first: Vec<pb::Task> = indices.iter().enumerate().map(|(i, &c)| task(1 + i as u64, c)).collect();
    let cold = pb::Task { flush_l2: true, ..task(101, indices[0]) };
    let finalists = finalist_task(102, &indices[..3], 2);
    let fake = Fake::new(vec![first, vec![task(100, indices[0])], vec![cold], vec![finalists]]);
    run_until(&fake, config, |st| st.reports.len() == indices.len() + 3).await;

    let st = fake.state();
    eprintln!("device {} ({}), nvrtc {}", device.name, device.class_key, device.nvrtc_version);
    let reference = st.references.iter().copied().fold(0.0, f64::max);
    eprintln!("drift reference: {reference:.2} us");
    assert!(reference > 0.0, "heartbeats carry the drift reference: {:?}", st.references);
    eprintln!("task  status          median_us  baseline_us  compile_ms  hit  regs  max_abs_err  kernel");
    for (r, m) in
        st.reports.iter().flat_map(|r| r.measurement.iter().chain(&r.finalist_measurements).map(move |m| (r, m)))
    {
        eprintln!(
            "{:>4}  {:<14}  {:>9.2}  {:>11.2}  {:>10.1}  {:<3}  {:>4}  {:>11.2e}  {}",
            r.task_id,
            tensortune_proto::convert::status_name(m.status()),
            m.median_us,
            m.baseline_us.unwrap_or(f64::NAN),
            m.compile_ms,
            m.cache_hit,
            m.registers,
            m.max_abs_err.unwrap_or(f64::NAN),
            if m.error.is_empty() { String::new() } else { m.error.chars().take(300).collect() }
        );
    }
    for (r, m) in
        st.reports.iter().flat_map(|r| r.measurement.iter().chain(&r.finalist_measurements).map(move |m| (r, m)))
    {
        assert_eq!(status(m), pb::RecordStatus::Ok, "task {}: {}", r.task_id, m.error);
        assert!(m.median_us > 0.0 && m.registers > 0 && m.max_abs_err.is_some());
        assert!(m.baseline_us.is_some(), "task {} has the vendor baseline ({})", r.task_id, m.baseline_kind);
        assert_eq!(m.provenance.as_ref().unwrap().gpu_uuid, device.uuid);
    }
    assert!(st.report(100).cache_hit);
    assert_eq!(st.report(101).batch, 1, "a flushed sample is one launch");
    let finalists = st.finalists(102);
    assert_eq!(finalists.len(), 3);
    assert!(finalists.iter().all(|m| m.samples_us.len() == 2 * 5), "both rounds' samples");
}
