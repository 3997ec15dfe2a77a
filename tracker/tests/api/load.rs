//! Load and faults: a small run of the `tensortune-load` tool end to end (worker processes, a
//! killed worker group, a killed and restarted tracker, the database checked afterwards), a
//! database the tracker cannot write, corrupted and read-only databases at start, and garbage on
//! the port.

use std::collections::HashSet;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tensortune_proto::pb;
use tensortune_proto::pb::dispatch_client::DispatchClient;
use tensortune_proto::pb::tuning_client::TuningClient;
use tensortune_tracker::load::{self, Fault, LoadConfig};
use tokio::process::{Child, Command};
use tokio::time::Instant;
use tonic::Code;

use crate::harness::*;

const TRACKER: &str = env!("CARGO_BIN_EXE_tensortune-tracker");
const LOAD: &str = env!("CARGO_BIN_EXE_tensortune-load");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_load_with_a_killed_worker_group_and_a_tracker_restart_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let config = LoadConfig {
        // Long enough that the run outlasts both faults (they fire at 1/4 and 2/4 of the trials).
        measure: Duration::from_millis(500),
        faults: vec![Fault::KillWorkers, Fault::KillTracker],
        seed: 3,
        ..small_load(dir.path())
    };
    let summary = load::run(config).await.unwrap();
    let text = summary.to_string();
    assert!(summary.finished, "{text}");
    let db = &summary.db;
    assert_eq!((db.jobs, db.jobs_not_done), (3, 0), "{text}");
    assert_eq!((db.tasks_not_done, db.tasks_without_record, db.device_lost), (0, 0, 0), "lost tasks: {text}");
    assert_eq!(db.duplicates(), 0, "{text}");
    assert_eq!(db.workloads_miscounted, 0, "progress or trial numbers off: {text}");
    assert_eq!((db.records, db.trials_expected, db.workloads_short), (180, 180, 0), "{text}");
    let fired: Vec<Fault> = summary.faults.iter().map(|f| f.fault).collect();
    assert_eq!(fired, [Fault::KillWorkers, Fault::KillTracker], "{text}");
    for round in &summary.faults {
        assert!(round.recovered && round.at_s > 0.0, "{text}");
    }
    assert!(summary.ok(), "{text}");
    // Both tracker incarnations logged, neither panicked.
    for log in ["tracker-1.log", "tracker-2.log"] {
        let log = std::fs::read_to_string(dir.path().join(log)).unwrap();
        assert!(log.contains("tracker serving") && !log.contains("panicked"), "{log}");
    }
}

/// Batching on: workers lease 8 tasks a call and send every finished one in one `ReportResults`,
/// which the tracker stores in group commits; the tracker is SIGKILLed while batches are on their
/// way and restarted. A batch it never answered is sent again and stores nothing twice; every
/// trial is stored exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_reports_with_a_tracker_killed_mid_batch_lose_nothing_and_duplicate_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let config = LoadConfig {
        workers: 40,
        groups: 2,
        jobs: 4,
        trials: 150,
        // Short measurements: reports stream in continuously, so the kill lands among batches.
        measure: Duration::from_millis(20),
        deadline: Duration::from_secs(300),
        faults: vec![Fault::KillTracker],
        seed: 7,
        batch: 8,
        job_batch: 64,
        report_gather: Duration::ZERO,
        // Leases a loaded CI machine's late heartbeat does not expire (2 s did, under load 30:
        // device_lost without any fault of a worker); the test is about the kill.
        lease_secs: 6,
        heartbeat_secs: 2,
        ..small_load(dir.path())
    };
    let summary = load::run(config).await.unwrap();
    let text = summary.to_string();
    let db = &summary.db;
    assert!(summary.finished && db.jobs_not_done == 0, "{text}");
    assert_eq!((db.tasks_not_done, db.tasks_without_record, db.device_lost), (0, 0, 0), "lost tasks: {text}");
    assert_eq!(db.duplicates(), 0, "{text}");
    assert_eq!(db.workloads_miscounted, 0, "progress or trial numbers off: {text}");
    assert_eq!((db.records, db.trials_expected), (600, 600), "{text}");
    let round = &summary.faults[0];
    assert!(round.fault == Fault::KillTracker && round.recovered, "{text}");
    // Reports went in batches, and some were on their way when the tracker died.
    let report = &summary.latency["report"];
    assert!(report.calls > 0 && (report.calls as u64) < summary.reports_stored, "{text}");
    assert!(summary.retried.keys().any(|k| k.starts_with("report ")), "no report was caught by the kill: {text}");
    assert!(summary.ok(), "{text}");
}

/// A small load in `dir`: 20 workers in 4 processes, 3 jobs x 60 trials of 300 ms measurements, 2 s
/// leases, one SQLite tracker, single-task calls, no faults.
fn small_load(dir: &Path) -> LoadConfig {
    LoadConfig {
        dir: dir.to_path_buf(),
        tracker_bin: TRACKER.into(),
        load_bin: LOAD.into(),
        workers: 20,
        groups: 4,
        jobs: 3,
        trials: 60,
        measure: Duration::from_millis(300),
        lease_secs: 2,
        heartbeat_secs: 1,
        deadline: Duration::from_secs(300),
        faults: Vec::new(),
        fault_gap: None,
        hold: Duration::from_secs(1),
        tmpfs_mib: None,
        seed: 1,
        pg: None,
        trackers: 1,
        batch: 1,
        job_batch: 0,
        report_gather: Duration::ZERO,
    }
}

/// A tracker process on a free port, its log in `dir`.
pub(crate) struct TrackerProcess {
    pub(crate) child: Child,
    pub(crate) url: String,
}

impl TrackerProcess {
    /// Starts it with 2 s leases and 1 s heartbeats.
    pub(crate) async fn start(dir: &Path) -> TrackerProcess {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        // The log is a regular file on purpose: a write limit hits it as well as the database.
        let log = std::fs::File::create(dir.join("tracker.log")).unwrap();
        let child = Command::new(TRACKER)
            .args(["--listen", &format!("127.0.0.1:{port}"), "--lease-secs", "2", "--heartbeat-secs", "1", "--db"])
            .arg(dir.join("tracker.db"))
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + PATIENCE;
        while !load::serving(&url).await {
            assert!(Instant::now() < deadline, "the tracker did not start");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        TrackerProcess { child, url }
    }

    /// Sets its file-size limit (prlimit(1), util-linux): `0` refuses every write of the database.
    async fn limit_file_size(&self, soft: &str) {
        let pid = self.child.id().unwrap();
        let status = Command::new("prlimit")
            .args(["--pid", &pid.to_string(), &format!("--fsize={soft}:unlimited")])
            .status()
            .await
            .expect("prlimit (util-linux) runs");
        assert!(status.success(), "prlimit --fsize={soft} failed");
    }
}

#[tokio::test]
async fn reports_the_database_cannot_take_are_refused_unacknowledged_then_stored() {
    let dir = tempfile::tempdir().unwrap();
    let mut tracker = TrackerProcess::start(dir.path()).await;
    let mut tuning = TuningClient::connect(tracker.url.clone()).await.unwrap();
    let mut client = DispatchClient::connect(tracker.url.clone()).await.unwrap();
    let id = client.register(registration("box/0", sim_device())).await.unwrap().into_inner().worker_id;
    let mut worker = FakeWorker { id, client };
    let job_id = submit(&mut tuning, job(vec![matmul(128, 128, 128)], 6, 6)).await;
    let tasks = worker.lease_some(6).await;
    assert!(tasks.len() >= 2, "{} tasks", tasks.len());
    let (first, second) = (&tasks[0], &tasks[1]);
    assert!(worker.report(first, measure(first)).await.unwrap().stored);

    // Every write of the database now fails, as on a full disk or a device gone read-only, for
    // longer than a lease: reports fail; heartbeats, which write nothing (their renewals wait in
    // memory for the reaper, whose write fails too), may still be answered.
    tracker.limit_file_size("0").await;
    let outage = Instant::now();
    for _ in 0..3 {
        let (code, message) = code(worker.report(second, measure(second)).await);
        assert_eq!(code, Code::Unavailable, "{message}");
        assert!(message.contains("cannot write its database") && message.contains("nothing was stored"), "{message}");
    }
    let ids: Vec<u64> = tasks.iter().map(|t| t.task_id).collect();
    match worker.client.heartbeat(pb::HeartbeatRequest { worker_id: worker.id, task_ids: ids, reference_us: 0.0 }).await
    {
        Ok(answer) => {
            let drop = answer.into_inner().drop_task_ids;
            assert!(!drop.contains(&second.task_id), "a held task was to be dropped in the outage: {drop:?}");
        }
        Err(status) => assert_eq!(status.code(), Code::Unavailable, "{status:?}"),
    }
    tokio::time::sleep_until(outage + Duration::from_millis(3000)).await;
    tracker.limit_file_size("unlimited").await;

    // The leases the outage kept from being renewed are renewed, not expired: a worker that
    // comes now gets none of the first one's tasks.
    let mut client = DispatchClient::connect(tracker.url.clone()).await.unwrap();
    let id = client.register(registration("box/1", sim_device())).await.unwrap().into_inner().worker_id;
    let mut other = FakeWorker { id, client };
    let taken = other.lease(6, 1500).await;
    let taken: Vec<u64> = taken.iter().map(|t| t.task_id).collect();
    assert!(taken.is_empty(), "tasks held through the outage went to another worker: {taken:?}");
    // Nothing of the refused reports was kept.
    let progress = get_job(&mut tuning, job_id).await;
    assert_eq!(progress.workloads[0].trials_done, 1);
    assert_eq!(all_records(&mut tuning).await.len(), 1);
    let stored = worker.report(second, measure(second)).await.unwrap();
    assert!(stored.stored, "the retried report was not stored");
    let mut reported: Vec<pb::Task> = vec![first.clone(), second.clone()];
    for t in &tasks[2..] {
        assert!(worker.report(t, measure(t)).await.unwrap().stored);
        reported.push(t.clone());
    }
    reported.extend(drive(&mut worker, &mut tuning, job_id).await);
    let done = get_job(&mut tuning, job_id).await;
    assert_eq!(done.state, pb::JobState::Done as i32);
    let records = all_records(&mut tuning).await;
    assert_eq!(records.len(), 6);
    assert_eq!(records.iter().map(|r| r.task_id).collect::<HashSet<_>>().len(), 6);
    assert!(matches!(tracker.child.try_wait(), Ok(None)), "the tracker exited");
    let log = std::fs::read_to_string(dir.path().join("tracker.log")).unwrap();
    // Lines logged while the limit held are lost (the log is a file too); none may have panicked.
    assert!(!log.contains("panicked"), "{log}");
}

#[tokio::test]
async fn a_corrupted_or_read_only_database_is_refused_at_start_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let check = load::start_check(Fault::CorruptDb, TRACKER.as_ref(), dir.path()).await.unwrap();
    assert!(check.passed, "{check:?}");
    assert!(check.said.contains("spoiled.db") && check.said.contains("corrupted"), "{check:?}");
    let check = load::start_check(Fault::ReadonlyDb, TRACKER.as_ref(), dir.path()).await.unwrap();
    assert!(check.passed, "{check:?}");
    assert!(
        check.said.contains("spoiled.db")
            && (check.said.contains("read-only") || check.said.contains("cannot be opened for writing")),
        "{check:?}"
    );
}

#[tokio::test]
async fn garbage_on_the_port_leaves_the_tracker_serving() {
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(config(&dir)).await;
    let mut worker = FakeWorker::register(&tracker, "box/0").await;
    let mut tuning = tracker.tuning().await;
    let (sent, conns) = load::garbage(&tracker.addr).await.unwrap();
    assert!(sent > 0 && conns == 40);
    // Fresh connections and the ones opened before are served.
    let mut fresh = tracker.tuning().await;
    let id = submit(&mut fresh, job(vec![matmul(64, 64, 64)], 4, 4)).await;
    assert_eq!(drive(&mut worker, &mut tuning, id).await.len(), 4);
    assert_eq!(get_job(&mut fresh, id).await.state, pb::JobState::Done as i32);
    tracker.stop().await;
}

/// Two trackers on one PostgreSQL database, the workers spread over both, one tracker SIGKILLed
/// mid-run and never restarted: the other carries every job to the end, nothing lost or
/// duplicated (runs only when `TENSORTUNE_TEST_PG` names a server).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_trackers_on_postgres_survive_one_killed() {
    let Ok(server) = std::env::var("TENSORTUNE_TEST_PG") else {
        eprintln!("SKIPPED: TENSORTUNE_TEST_PG is not set (the shared-tracker load needs PostgreSQL)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = LoadConfig {
        deadline: Duration::from_secs(300),
        faults: vec![Fault::KillTracker],
        seed: 5,
        pg: Some(server),
        trackers: 2,
        batch: 8,
        ..small_load(dir.path())
    };
    let summary = load::run(config).await.unwrap();
    let text = summary.to_string();
    assert!(summary.ok(), "{text}");
    assert_eq!((summary.trackers, summary.database.as_str()), (2, "postgres"), "{text}");
    assert_eq!(summary.db.records, 3 * 60, "{text}");
    let round = &summary.faults[0];
    assert!(round.fault == Fault::KillTracker && round.recovered && round.at_s > 0.0, "{text}");
    // The workers whose first tracker was killed moved to the other one.
    assert!(summary.retried.keys().any(|k| k.contains("Unavailable") || k.contains("Unknown")), "{text}");
}
