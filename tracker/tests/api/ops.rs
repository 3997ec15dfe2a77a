//! For the people who run it: a worker leaving hands its leases back, protocol version skew, the
//! health probes, the tracker stopped by SIGTERM mid-job, backups (SQLite while serving under a
//! 200-worker load; PostgreSQL through pg_dump) and pruning.

use std::collections::HashSet;
use std::time::Duration;

use tensortune_proto::pb;
use tensortune_proto::pb::dispatch_client::DispatchClient;
use tensortune_proto::pb::tuning_client::TuningClient;
use tensortune_tracker::TrackerConfig;
use tensortune_tracker::load::{self, LoadConfig};
use tokio::net::TcpListener;
use tokio::process::{Child, Command};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::Code;
use tonic::metadata::MetadataValue;

use crate::binary::tracker;
use crate::harness::*;
use crate::http::get;
use crate::load::TrackerProcess;

const TRACKER: &str = env!("CARGO_BIN_EXE_tensortune-tracker");
const LOAD: &str = env!("CARGO_BIN_EXE_tensortune-load");

#[tokio::test]
async fn a_leaving_worker_hands_its_leases_back_and_another_takes_them_at_once() {
    let dir = tempfile::tempdir().unwrap();
    // Leases far longer than the test: only Leave can free the tasks in time.
    let config = TrackerConfig { lease: Duration::from_secs(600), heartbeat: Duration::from_secs(5), ..config(&dir) };
    let tracker = TestTracker::start(config).await;
    let mut tuning = tracker.tuning().await;
    let mut a = FakeWorker::register(&tracker, "box/a").await;
    let mut b = FakeWorker::register(&tracker, "box/b").await;
    let trials = 12;
    let job_id = submit(&mut tuning, job(vec![matmul(256, 256, 256)], trials, 4)).await;
    let held = a.lease_some(4).await;
    assert_eq!(held.len(), 4);
    // One is reported before leaving; the rest are handed back.
    assert!(a.report(&held[0], measure(&held[0])).await.unwrap().stored);
    let left = a.client.leave(pb::LeaveRequest { worker_id: a.id }).await.unwrap().into_inner();
    assert_eq!(left.released, 3);
    let workers = tuning.list_workers(pb::ListWorkersRequest {}).await.unwrap().into_inner().workers;
    let gone = workers.iter().find(|w| w.id == a.id).unwrap();
    assert_eq!((gone.state.as_str(), gone.leased), ("offline", 0));

    // B gets the handed-back tasks from one lease call, without waiting for anything to expire.
    let taken = b.lease(16, 0).await;
    let handed_back: HashSet<u64> = held[1..].iter().map(|t| t.task_id).collect();
    let taken_ids: HashSet<u64> = taken.iter().map(|t| t.task_id).collect();
    assert!(handed_back.is_subset(&taken_ids), "handed back {handed_back:?}, B got {taken_ids:?}");
    // A's late result for a task B holds now is refused: one record per task.
    let (status, message) = code(a.report(&held[1], measure(&held[1])).await);
    assert_eq!(status, Code::FailedPrecondition, "{message}");
    for task in &taken {
        assert!(b.report(task, measure(task)).await.unwrap().stored);
    }
    drive(&mut b, &mut tuning, job_id).await;
    let records = export(&mut tuning, pb::ExportRecordsRequest { job_id, ..Default::default() }).await;
    let tuning_records: Vec<&pb::Record> = records.iter().filter(|r| !r.remeasure).collect();
    let tasks: HashSet<u64> = tuning_records.iter().map(|r| r.task_id).collect();
    assert_eq!((tuning_records.len(), tasks.len()), (trials as usize, trials as usize), "nothing lost or duplicated");
    // Leave of an unknown worker names it.
    let (status, message) = code(a.client.leave(pb::LeaveRequest { worker_id: 999 }).await);
    assert_eq!(status, Code::NotFound, "{message}");
    tracker.stop().await;
}

/// An interceptor that stamps a protocol version on each call.
type Stamp = fn(tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status>;

type Stamped = tonic::service::interceptor::InterceptedService<tonic::transport::Channel, Stamp>;

fn stamp(mut request: tonic::Request<()>, version: u32) -> Result<tonic::Request<()>, tonic::Status> {
    request.metadata_mut().insert(tensortune_proto::PROTOCOL_HEADER, MetadataValue::from(version));
    Ok(request)
}

/// Clients of `addr` whose calls announce protocol version 0 (`"old"`), 1 (`"v1"`) or one newer
/// than this build (`"newer"`).
async fn announcing(addr: &str, version: &str) -> (TuningClient<Stamped>, DispatchClient<Stamped>) {
    let channel = tonic::transport::Endpoint::from_shared(addr.to_owned()).unwrap().connect().await.unwrap();
    let stamper: Stamp = match version {
        "old" => |r| stamp(r, 0),
        "v1" => |r| stamp(r, 1),
        "newer" => |r| stamp(r, tensortune_proto::PROTOCOL_VERSION + 1),
        other => panic!("no stamp {other}"),
    };
    (TuningClient::with_interceptor(channel.clone(), stamper), DispatchClient::with_interceptor(channel, stamper))
}

#[tokio::test]
async fn an_incompatible_protocol_version_is_refused_naming_both_and_an_older_compatible_one_works() {
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(config(&dir)).await;
    let current = tensortune_proto::PROTOCOL_VERSION;
    // Older than the tracker serves (a client and a worker from before the oldest compatible
    // protocol), and newer than it knows.
    for (version, hint) in [("old", "upgrade the worker or client"), ("newer", "upgrade the tracker")] {
        let (mut tuning, mut dispatch) = announcing(&tracker.addr, version).await;
        let announced = if version == "old" { 0 } else { current + 1 };
        let (status, message) = code(tuning.list_jobs(pb::ListJobsRequest::default()).await);
        assert_eq!(status, Code::FailedPrecondition, "{message}");
        assert!(
            message.contains(&format!("protocol version {announced} of this Tuning caller"))
                && message.contains(&format!("tracker's protocol version {current}"))
                && message.contains(hint),
            "{message}"
        );
        let (status, message) = code(dispatch.register(registration("box/old", sim_device())).await);
        assert_eq!(status, Code::FailedPrecondition, "{message}");
        assert!(
            message.contains(&format!("protocol version {announced} of this Dispatch caller"))
                && message.contains(&format!("version {current}")),
            "{message}"
        );
    }
    // Version 1 (what builds before the header spoke) and callers without the header work.
    let (mut tuning, mut dispatch) = announcing(&tracker.addr, "v1").await;
    tuning.list_jobs(pb::ListJobsRequest::default()).await.unwrap();
    dispatch.register(registration("box/v1", sim_device())).await.unwrap();
    let mut plain = tracker.tuning().await;
    plain.list_jobs(pb::ListJobsRequest::default()).await.unwrap();
    // This build's own clients announce the current version.
    let access = tensortune_proto::access::Access::default();
    let channel = access.endpoint(&tracker.addr).unwrap().connect().await.unwrap();
    let mut own = TuningClient::with_interceptor(channel, access.bearer());
    own.list_jobs(pb::ListJobsRequest::default()).await.unwrap();
    tracker.stop().await;
}

/// The gRPC health status of `service` on `addr`; -1 when the check itself fails (callers poll).
async fn grpc_health(addr: &str, service: &str) -> i32 {
    let channel = tonic::transport::Endpoint::from_shared(addr.to_owned()).unwrap().connect().await.unwrap();
    let mut client = tonic_health::pb::health_client::HealthClient::new(channel);
    let request = tonic_health::pb::HealthCheckRequest { service: service.to_owned() };
    client.check(request).await.map_or(-1, |r| r.into_inner().status)
}

/// Holds the database's write lock from another connection until dropped (returned by
/// [`lock_database`]).
enum Lock {
    Sqlite { _held: sqlx::SqliteConnection },
    Postgres { _held: sqlx::Transaction<'static, sqlx::Postgres> },
}

/// Takes the write lock of the database `db` names, as another program (a shell, a stuck
/// backup) would.
async fn lock_database(db: &std::path::Path) -> Lock {
    use sqlx::Connection as _;
    let text = db.to_string_lossy();
    if text.starts_with("postgres") {
        let pool = sqlx::PgPool::connect(&text).await.unwrap();
        let mut tx = pool.begin().await.unwrap();
        sqlx::query("LOCK TABLE records IN EXCLUSIVE MODE").execute(&mut *tx).await.unwrap();
        Lock::Postgres { _held: tx }
    } else {
        let mut conn = sqlx::SqliteConnection::connect(&format!("sqlite://{text}")).await.unwrap();
        sqlx::query("BEGIN IMMEDIATE").execute(&mut conn).await.unwrap();
        Lock::Sqlite { _held: conn }
    }
}

#[tokio::test]
async fn healthz_readyz_and_grpc_health_answer_and_readiness_fails_while_the_database_cannot_be_written() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&dir);
    let db = cfg.db.clone();
    let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (g, h) = (format!("http://{}", grpc.local_addr().unwrap()), http.local_addr().unwrap().to_string());
    let stop = CancellationToken::new();
    let handle = tokio::spawn(tensortune_tracker::run_with_http(cfg, grpc, Some(http), stop.clone()));
    let serving = tonic_health::pb::health_check_response::ServingStatus::Serving as i32;
    let not_serving = tonic_health::pb::health_check_response::ServingStatus::NotServing as i32;

    eventually("the HTTP side", || {
        let h = h.clone();
        async move { tokio::net::TcpStream::connect(&h).await.ok().map(|_| ()) }
    })
    .await;
    assert_eq!(get(&h, "/healthz").await, (200, "ok\n".to_owned()));
    assert_eq!(get(&h, "/readyz").await, (200, "ready\n".to_owned()));
    for service in ["", "tensortune.v1.Tuning", "tensortune.v1.Dispatch"] {
        let g = g.clone();
        eventually("gRPC health serving", || {
            let g = g.clone();
            async move { (grpc_health(&g, service).await == serving).then_some(()) }
        })
        .await;
    }

    let lock = lock_database(&db).await;
    let (status, body) = get(&h, "/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("cannot be written"), "{body}");
    // Alive all the same: a supervisor must not restart a tracker for a stuck disk.
    assert_eq!(get(&h, "/healthz").await.0, 200);
    eventually("gRPC health not serving", || {
        let g = g.clone();
        async move { (grpc_health(&g, "").await == not_serving).then_some(()) }
    })
    .await;
    drop(lock);
    eventually("ready again", || {
        let h = h.clone();
        async move { (get(&h, "/readyz").await.0 == 200).then_some(()) }
    })
    .await;
    eventually("gRPC health serving again", || {
        let g = g.clone();
        async move { (grpc_health(&g, "tensortune.v1.Dispatch").await == serving).then_some(()) }
    })
    .await;
    // The health service needs no token and no version header: probes have neither.
    stop.cancel();
    tokio::time::timeout(PATIENCE, handle).await.unwrap().unwrap().unwrap();
}

async fn sigterm(child: &Child) {
    let pid = child.id().expect("the process runs");
    let status = Command::new("kill").args(["-TERM", &pid.to_string()]).status().await.unwrap();
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_job_then_a_restart_resumes_with_every_acknowledged_record() {
    let dir = tempfile::tempdir().unwrap();
    let mut tracker = TrackerProcess::start(dir.path()).await;
    let url = tracker.url.clone();
    let mut tuning = TuningClient::connect(url.clone()).await.unwrap();
    let mut client = DispatchClient::connect(url.clone()).await.unwrap();
    let id = client.register(registration("box/0", sim_device())).await.unwrap().into_inner().worker_id;
    let trials = 200;
    let job_id = submit(&mut tuning, job(vec![matmul(512, 256, 256)], trials, 8)).await;
    let target = get_job(&mut tuning, job_id).await.workloads[0].trials_target as usize;

    // A worker reports as fast as it can; SIGTERM lands while it does.
    let reporter = tokio::spawn(async move {
        let mut worker = FakeWorker { id, client };
        let mut acknowledged = Vec::new();
        loop {
            let req = pb::LeaseTasksRequest { worker_id: worker.id, max_tasks: 4, wait_ms: 100 };
            let Ok(leased) = worker.client.lease_tasks(req).await else { return acknowledged };
            for task in leased.into_inner().tasks {
                match worker.report(&task, measure(&task)).await {
                    Ok(r) if r.stored => acknowledged.push(r.record_id),
                    Ok(_) => {}
                    Err(_) => return acknowledged,
                }
            }
        }
    });
    let deadline = Instant::now() + PATIENCE;
    loop {
        let done = get_job(&mut tuning, job_id).await.workloads[0].trials_done;
        if done >= 10 {
            break;
        }
        assert!(Instant::now() < deadline, "no progress before the SIGTERM");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    sigterm(&tracker.child).await;
    let status = tokio::time::timeout(PATIENCE, tracker.child.wait()).await.unwrap().unwrap();
    assert!(status.success(), "the tracker exits cleanly on SIGTERM: {status}");
    let acknowledged = reporter.await.unwrap();
    assert!(acknowledged.len() >= 10 && acknowledged.len() < target, "{} acknowledged", acknowledged.len());
    let log = std::fs::read_to_string(dir.path().join("tracker.log")).unwrap();
    assert!(log.contains("shutting down") && log.contains("tracker stopped"), "{log}");

    // Started again on the same database (on another port).
    tracker = TrackerProcess::start(dir.path()).await;
    let url = tracker.url.clone();
    let mut tuning = TuningClient::connect(url.clone()).await.unwrap();
    let records = export(&mut tuning, pb::ExportRecordsRequest { job_id, ..Default::default() }).await;
    let stored: HashSet<u64> = records.iter().map(|r| r.id).collect();
    for id in &acknowledged {
        assert!(stored.contains(id), "acknowledged record {id} is missing after the restart");
    }
    // The job resumes and ends with one record per trial.
    let client = DispatchClient::connect(url.clone()).await.unwrap();
    let mut worker = FakeWorker { id, client };
    drive(&mut worker, &mut tuning, job_id).await;
    let records = export(&mut tuning, pb::ExportRecordsRequest { job_id, ..Default::default() }).await;
    let tuning_tasks: Vec<u64> = records.iter().filter(|r| !r.remeasure).map(|r| r.task_id).collect();
    let unique: HashSet<u64> = tuning_tasks.iter().copied().collect();
    assert_eq!((tuning_tasks.len(), unique.len()), (target, target));
    sigterm(&tracker.child).await;
    assert!(tokio::time::timeout(PATIENCE, tracker.child.wait()).await.unwrap().unwrap().success());
}

/// Committed record ids of the SQLite database at `db`, read as another program would (none
/// while it cannot be read yet).
async fn committed_records(db: &std::path::Path) -> Vec<i64> {
    use sqlx::Connection as _;
    let Ok(mut conn) = sqlx::SqliteConnection::connect(&format!("sqlite://{}", db.display())).await else {
        return Vec::new();
    };
    let ids = sqlx::query_scalar("SELECT id FROM records").fetch_all(&mut conn).await.unwrap_or_default();
    conn.close().await.ok();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_during_a_200_worker_load_is_whole_and_holds_every_record_acknowledged_before_it() {
    if on_postgres() {
        return; // PostgreSQL is backed up with pg_dump: see the next test.
    }
    let dir = tempfile::tempdir().unwrap();
    let config = LoadConfig {
        dir: dir.path().to_path_buf(),
        tracker_bin: TRACKER.into(),
        load_bin: LOAD.into(),
        workers: 200,
        groups: 4,
        jobs: 4,
        trials: 250,
        measure: Duration::from_millis(800),
        lease_secs: 10,
        heartbeat_secs: 2,
        deadline: Duration::from_secs(300),
        faults: vec![],
        fault_gap: None,
        hold: Duration::from_secs(1),
        tmpfs_mib: None,
        seed: 5,
        pg: None,
        trackers: 1,
        batch: 8,
        job_batch: 0,
        report_gather: Duration::ZERO,
    };
    let db = dir.path().join("load.db");
    let copy = dir.path().join("backup.db");
    let backup = {
        let (db, copy) = (db.clone(), copy.clone());
        tokio::spawn(async move {
            // Mid-run: once a good part of the records is in, and while the workers go on.
            let deadline = Instant::now() + PATIENCE;
            let before = loop {
                let ids = if db.exists() { committed_records(&db).await } else { Vec::new() };
                if ids.len() >= 200 {
                    break ids;
                }
                assert!(Instant::now() < deadline, "the load stored too little to back up mid-run");
                tokio::time::sleep(Duration::from_millis(100)).await;
            };
            let started = Instant::now();
            let summary = tensortune_tracker::backup(&db, &copy).await.unwrap();
            (before, summary, started.elapsed())
        })
    };
    let run = load::run(config).await.unwrap();
    let (before, summary, took) = backup.await.unwrap();
    assert!(run.finished && run.ok(), "{run}");
    let total = run.db.records;
    assert!(
        summary.records < total,
        "the backup ({} records) was taken mid-run, before all {total} were in",
        summary.records
    );
    // The copy opens, passes the integrity check, and holds everything committed before it began.
    let checked = tensortune_tracker::verify_backup(&copy).await.unwrap();
    assert_eq!(checked.records, summary.records);
    let in_copy: HashSet<i64> = committed_records(&copy).await.into_iter().collect();
    let missing: Vec<&i64> = before.iter().filter(|id| !in_copy.contains(id)).collect();
    assert!(missing.is_empty(), "records acknowledged before the backup are missing from it: {missing:?}");
    eprintln!(
        "backup during a {}-worker load: {} records ({} acknowledged before it began, {total} at the end), {} bytes, {:.0} ms",
        run.workers,
        summary.records,
        before.len(),
        summary.bytes,
        took.as_secs_f64() * 1e3
    );
    // A backup never overwrites.
    let e = tensortune_tracker::backup(&db, &copy).await.unwrap_err().to_string();
    assert!(e.contains("exists already"), "{e}");
}

/// `pg_dump` and its siblings: on the PATH, or in Debian's versioned directory.
fn pg_tool(name: &str) -> std::path::PathBuf {
    if let Ok(out) = std::process::Command::new("sh").args(["-c", &format!("command -v {name}")]).output()
        && out.status.success()
    {
        return std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    }
    let mut found: Vec<_> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path().join("bin").join(name)).filter(|p| p.exists()).collect())
        .unwrap_or_default();
    found.sort();
    found.pop().unwrap_or_else(|| panic!("{name} is not installed (Debian: apt-get install postgresql-client)"))
}

#[tokio::test]
async fn a_postgres_dump_restores_into_a_database_a_tracker_serves() {
    if !on_postgres() {
        return; // SQLite is backed up with `tensortune-tracker backup`: see the test above.
    }
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&dir);
    let url = cfg.db.to_string_lossy().into_owned();
    let tracker = TestTracker::start(cfg).await;
    let mut tuning = tracker.tuning().await;
    let mut worker = FakeWorker::register(&tracker, "box/0").await;
    let job_id = submit(&mut tuning, job(vec![matmul(256, 128, 128)], 8, 4)).await;
    drive(&mut worker, &mut tuning, job_id).await;
    let before = all_records(&mut tuning).await;
    tracker.stop().await;

    let dump = dir.path().join("tracker.dump");
    let out = std::process::Command::new(pg_tool("pg_dump"))
        .args(["--format=custom", "--file"])
        .arg(&dump)
        .arg(&url)
        .output()
        .unwrap();
    assert!(out.status.success(), "pg_dump: {}", String::from_utf8_lossy(&out.stderr));
    // Restored into a fresh database beside it.
    let restored_dir = tempfile::tempdir().unwrap();
    let restored = database(&restored_dir).to_string_lossy().into_owned();
    let out = std::process::Command::new(pg_tool("pg_restore"))
        .args(["--no-owner", "--exit-on-error", "--dbname", &restored])
        .arg(&dump)
        .output()
        .unwrap();
    assert!(out.status.success(), "pg_restore: {}", String::from_utf8_lossy(&out.stderr));
    let tracker = TestTracker::start(TrackerConfig { db: restored.into(), ..TrackerConfig::default() }).await;
    let mut tuning = tracker.tuning().await;
    let after = all_records(&mut tuning).await;
    assert_eq!(after, before, "the restored database holds the same records");
    let restored_job = get_job(&mut tuning, job_id).await;
    assert_eq!(restored_job.state, pb::JobState::Done as i32);
    tracker.stop().await;
}

#[tokio::test]
async fn pruning_keeps_every_best_finalist_and_reused_record_and_unfinished_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&dir);
    let db = cfg.db.clone();
    let tracker = TestTracker::start(cfg).await;
    let mut tuning = tracker.tuning().await;
    let mut worker = FakeWorker::register(&tracker, "box/0").await;
    // An ended job with finalists, and a later one that reuses its records.
    let a = submit(&mut tuning, job_with_finalists(vec![matmul(256, 256, 256)], 16, 4, Some(3))).await;
    drive(&mut worker, &mut tuning, a).await;
    let c = submit(&mut tuning, job(vec![matmul(256, 256, 256), matmul(128, 256, 256)], 16, 4)).await;
    drive(&mut worker, &mut tuning, c).await;
    // A job still running.
    let b = submit(&mut tuning, job(vec![matmul(512, 512, 256)], 16, 4)).await;
    for task in worker.lease_some(2).await {
        assert!(worker.report(&task, measure(&task)).await.unwrap().stored);
    }
    let before = all_records(&mut tuning).await;
    let job_a = get_job(&mut tuning, a).await;
    let job_c = get_job(&mut tuning, c).await;
    let wa = &job_a.workloads[0];
    assert!(wa.finalists.len() >= 2, "the test job has finalists");

    // Retention longer than the jobs' age prunes nothing.
    assert_eq!(tensortune_tracker::prune(&db, 30).await.unwrap().records, 0);
    tokio::time::sleep(Duration::from_millis(5)).await;
    let pruned = tensortune_tracker::prune(&db, 0).await.unwrap().records;
    let after = all_records(&mut tuning).await;
    assert!(pruned > 0 && after.len() as u64 == before.len() as u64 - pruned, "{pruned} of {}", before.len());
    let kept: HashSet<u64> = after.iter().map(|r| r.id).collect();
    for w in job_a.workloads.iter().chain(&job_c.workloads) {
        let best = w.best.as_ref().expect("a best record");
        assert!(kept.contains(&best.id), "best record {} of {} was pruned", best.id, w.workload_key);
    }
    for f in &wa.finalists {
        assert!(kept.contains(&f.record_id), "re-measurement {} was pruned", f.record_id);
        assert!(
            after.iter().any(|r| !r.remeasure && r.job_id == a && r.config == f.config),
            "the tuning record of finalist {} was pruned",
            f.config
        );
    }
    // Nothing of the running job b goes.
    for r in before.iter().filter(|r| r.job_id == b) {
        assert!(kept.contains(&r.id), "record {} of running job {b} was pruned", r.id);
    }
    assert!(job_c.workloads[0].reused > 0, "job {c} reused records of job {a}");
    // The jobs still read whole: same best, same finalists, same state.
    let job_a_after = get_job(&mut tuning, a).await;
    assert_eq!(job_a_after.workloads[0].best, wa.best);
    assert_eq!(job_a_after.workloads[0].finalists, wa.finalists);
    assert_eq!(job_a_after.state, job_a.state);
    assert_eq!(get_job(&mut tuning, c).await.workloads[0].best, job_c.workloads[0].best);
    // Job b goes on to the end after the prune.
    drive(&mut worker, &mut tuning, b).await;
    tracker.stop().await;
}

#[test]
fn the_binary_reads_its_config_file_and_the_maintenance_commands_take_its_db() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.db");
    let config = dir.path().join("tracker.toml");
    std::fs::write(&config, format!("db = {:?}\nlisten = \"127.0.0.1:0\"\n", db.to_str().unwrap())).unwrap();
    let config = config.to_str().unwrap();
    // Makes the database.
    let (ok, _, stderr) = tracker(&["token", "list", "--db", db.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    let copy = dir.path().join("copy.db");
    let (ok, stdout, stderr) = tracker(&["backup", "--config", config, "--to", copy.to_str().unwrap()]);
    assert!(ok && stdout.contains("written and checked"), "{stdout} {stderr}");
    let (ok, stdout, stderr) = tracker(&["prune", "--config", config, "--retain-days", "7"]);
    assert!(ok && stdout.contains("pruned 0 records"), "{stdout} {stderr}");
    let (ok, _, stderr) = tracker(&["prune", "--db", db.to_str().unwrap(), "--retain-days", "99999"]);
    assert!(!ok && stderr.contains("--retain-days 99999"), "{stderr}");

    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "db = \"x.db\"\nworkers = 3\n").unwrap();
    let (ok, _, stderr) = tracker(&["--config", bad.to_str().unwrap()]);
    assert!(!ok && stderr.contains("workers") && stderr.contains(bad.to_str().unwrap()), "{stderr}");
    let (ok, _, stderr) = tracker(&["serve", "--config", bad.to_str().unwrap()]);
    assert!(!ok && stderr.contains("unknown field"), "{stderr}");
}
