//! The `tensortune-worker` binary stopped with SIGTERM while it holds leases, against a real
//! tracker with leases far longer than the test: the worker hands its tasks back in one call,
//! another worker (played by the test) leases them at once, and the job ends with one record per
//! trial: nothing lost, nothing measured twice.

use std::collections::HashSet;
use std::time::Duration;

use tensortune_kernels::gemm::WmmaGemm;
use tensortune_kernels::{DType, Layout, Matmul, Target, Template, Types, Workload};
use tensortune_proto::convert::device_from_target;
use tensortune_proto::pb;
use tensortune_proto::pb::dispatch_client::DispatchClient;
use tensortune_proto::pb::tuning_client::TuningClient;
use tensortune_tracker::TrackerConfig;
use tokio::net::TcpListener;
use tokio::process::Command;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const WORKER: &str = env!("CARGO_BIN_EXE_tensortune-worker");
/// Guard against a hung test (not a timing assertion).
const PATIENCE: Duration = Duration::from_secs(120);
/// The tracker's lease: were the tasks not handed back, they would wait this long.
const LEASE: Duration = Duration::from_secs(600);

async fn workers(tuning: &mut TuningClient<tonic::transport::Channel>) -> Vec<pb::Worker> {
    tuning.list_workers(pb::ListWorkersRequest {}).await.unwrap().into_inner().workers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_hands_the_leases_back_and_another_worker_takes_them_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let config = TrackerConfig {
        db: dir.path().join("tracker.db"),
        lease: LEASE,
        heartbeat: Duration::from_secs(5),
        ..TrackerConfig::default()
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let stop = CancellationToken::new();
    let tracker = tokio::spawn(tensortune_tracker::run(config, listener, stop.clone()));
    let mut tuning = loop {
        if let Ok(c) = TuningClient::connect(url.clone()).await {
            break c;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let log = std::fs::File::create(dir.path().join("worker.log")).unwrap();
    let mut worker = Command::new(WORKER)
        .args(["--tracker", &url, "--device", "sim", "--name", "box/sim", "--compile-threads", "1", "--no-disk-cache"])
        .env("RUST_LOG", "info")
        // The worker logs to stdout.
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // The job is bound to the class of the registered worker.
    let deadline = Instant::now() + PATIENCE;
    while workers(&mut tuning).await.is_empty() {
        assert!(
            Instant::now() < deadline,
            "the worker did not register; see {}",
            dir.path().join("worker.log").display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let workload =
        Workload::Matmul(Matmul::new(512, 256, 256, Layout::Nn, Types::default_for(DType::F16).unwrap()).unwrap());
    let trials = 40;
    // Four outstanding at a time, all of which the worker (6 in flight with one compile thread)
    // holds: none is left for anyone else unless it hands them back.
    let request = pb::SubmitJobRequest {
        workloads: vec![(&workload).into()],
        template: WmmaGemm.name().into(),
        trials,
        batch_size: 4,
        seed: 11,
        device_class: "sim".into(),
        finalists: Some(1),
        ..Default::default()
    };
    let job_id = tuning.submit_job(request).await.unwrap().into_inner().job_id;

    // Wait until it has measured a few tasks and holds leases.
    let deadline = Instant::now() + PATIENCE;
    loop {
        let job = tuning.get_job(pb::JobRef { job_id }).await.unwrap().into_inner();
        let held = workers(&mut tuning).await.iter().map(|w| w.leased).sum::<u32>();
        if job.workloads[0].trials_done >= 3 && held > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the worker made no progress; see {}",
            dir.path().join("worker.log").display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let sigterm = Instant::now();
    let pid = worker.id().unwrap();
    assert!(Command::new("kill").args(["-TERM", &pid.to_string()]).status().await.unwrap().success());
    // Another worker asks for tasks right away, as a busy fleet's would.
    let mut other = DispatchClient::connect(url.clone()).await.unwrap();
    let registration = pb::RegisterRequest {
        name: "box/other".into(),
        device: Some(device_from_target(&Target::sim())),
        templates: vec![pb::TemplateRef { name: WmmaGemm.name().into(), version: WmmaGemm.version() }],
        previous_id: 0,
    };
    let other_id = other.register(registration).await.unwrap().into_inner().worker_id;
    let lease = |wait_ms| pb::LeaseTasksRequest { worker_id: other_id, max_tasks: 16, wait_ms };
    let first = loop {
        let tasks = other.lease_tasks(lease(200)).await.unwrap().into_inner().tasks;
        if !tasks.is_empty() {
            break tasks;
        }
        assert!(sigterm.elapsed() < PATIENCE, "no task came back after the SIGTERM");
    };
    let taken_after = sigterm.elapsed();
    let status = tokio::time::timeout(PATIENCE, worker.wait()).await.unwrap().unwrap();
    let exited_after = sigterm.elapsed();
    let log = std::fs::read_to_string(dir.path().join("worker.log")).unwrap();
    assert!(status.success(), "the worker exits cleanly on SIGTERM ({status}):\n{log}");
    assert!(log.contains("handed the tasks still held back to the tracker"), "{log}");
    // It left: offline, holding nothing, long before any lease could have expired.
    let gone = workers(&mut tuning).await.into_iter().find(|w| w.name == "box/sim").unwrap();
    assert_eq!((gone.state.as_str(), gone.leased), ("offline", 0));
    assert!(taken_after < LEASE / 10, "tasks came back after {taken_after:?}");
    eprintln!(
        "SIGTERM to a worker holding leases: another worker leased {} tasks {:.0} ms later; the worker exited after {:.0} ms (lease {} s)",
        first.len(),
        taken_after.as_secs_f64() * 1e3,
        exited_after.as_secs_f64() * 1e3,
        LEASE.as_secs()
    );

    // The other worker finishes the job.
    let mut pending = first;
    let deadline = Instant::now() + PATIENCE;
    loop {
        for task in pending.drain(..) {
            let measurement = pb::Measurement {
                status: pb::RecordStatus::Ok as i32,
                samples_us: vec![10.0 + task.config_index as f64 * 1e-3],
                median_us: 10.0 + task.config_index as f64 * 1e-3,
                batch: 1,
                ..Default::default()
            };
            let report = pb::ReportResultRequest {
                worker_id: other_id,
                task_id: task.task_id,
                measurement: (task.finalist_configs.is_empty()).then(|| measurement.clone()),
                finalist_measurements: if task.finalist_configs.is_empty() {
                    vec![]
                } else {
                    vec![measurement; task.finalist_configs.len()]
                },
                lease_serial: task.lease_serial,
            };
            assert!(other.report_result(report).await.unwrap().into_inner().stored, "task {}", task.task_id);
        }
        let job = tuning.get_job(pb::JobRef { job_id }).await.unwrap().into_inner();
        if job.state == pb::JobState::Done as i32 {
            break;
        }
        assert!(Instant::now() < deadline, "the job did not finish: {job:?}");
        pending = other.lease_tasks(lease(200)).await.unwrap().into_inner().tasks;
    }
    let mut records =
        tuning.export_records(pb::ExportRecordsRequest { job_id, ..Default::default() }).await.unwrap().into_inner();
    let mut tasks = Vec::new();
    while let Some(r) = records.message().await.unwrap() {
        if !r.remeasure {
            tasks.push(r.task_id);
        }
    }
    let unique: HashSet<u64> = tasks.iter().copied().collect();
    assert_eq!((tasks.len(), unique.len()), (trials as usize, trials as usize), "one record per trial");
    stop.cancel();
    tokio::time::timeout(PATIENCE, tracker).await.unwrap().unwrap().unwrap();
}
