//! Two trackers on one PostgreSQL database serving one job at once (runs only when
//! `TENSORTUNE_TEST_PG` names a server: SQLite has one tracker per file).

use std::collections::HashSet;

use tensortune_proto::pb;

use crate::harness::*;

#[tokio::test]
async fn two_trackers_on_one_postgres_database_finish_a_job_without_duplicates() {
    if !on_postgres() {
        eprintln!("SKIPPED: TENSORTUNE_TEST_PG is not set (two trackers need a shared PostgreSQL database)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // The same directory gives the same database: both trackers share it.
    let a = TestTracker::start(config(&dir)).await;
    let b = TestTracker::start(config(&dir)).await;
    let mut tuning_a = a.tuning().await;
    let mut tuning_b = b.tuning().await;
    let mut on_a = FakeWorker::register(&a, "box/a").await;
    let mut on_b = FakeWorker::register(&b, "box/b").await;

    let id = submit(&mut tuning_a, job(vec![matmul(256, 128, 256), matmul(128, 128, 128)], 24, 4)).await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut reported: Vec<pb::Task> = Vec::new();
    // The workers lease and report by turns, each through its own tracker, so that each tracker
    // proposes on top of what the other stored.
    while !is_terminal(&get_job(&mut tuning_b, id).await) {
        assert!(tokio::time::Instant::now() < deadline, "job {id} did not finish on two trackers");
        for worker in [&mut on_a, &mut on_b] {
            for task in worker.lease(3, 100).await {
                let r = if is_finalist(&task) {
                    let m = measure_finalists(&task, &mut measure);
                    worker.report_finalists(&task, m).await.unwrap()
                } else {
                    worker.report(&task, measure(&task)).await.unwrap()
                };
                assert!(r.stored, "task {} was not stored", task.task_id);
                reported.push(task);
            }
        }
    }

    let tasks: HashSet<u64> = reported.iter().map(|t| t.task_id).collect();
    assert_eq!(tasks.len(), reported.len(), "a task was handed out twice");
    let tuning: Vec<&pb::Task> = reported.iter().filter(|t| !is_finalist(t)).collect();
    let configs: HashSet<(&str, u64)> = tuning.iter().map(|t| (t.workload_key.as_str(), t.config_index)).collect();
    assert_eq!(configs.len(), tuning.len(), "a config was proposed twice");
    // Both trackers answer alike from the one database.
    let (done_a, done_b) = (get_job(&mut tuning_a, id).await, get_job(&mut tuning_b, id).await);
    assert_eq!(done_a.state, pb::JobState::Done as i32);
    assert_eq!(done_a.workloads, done_b.workloads);
    for w in &done_a.workloads {
        assert_eq!(w.trials_done, 24, "{w:?}");
    }
    // One record per tuning task, however the reports were spread over the trackers.
    let records = all_records(&mut tuning_b).await;
    let tuning_ids: HashSet<u64> = tuning.iter().map(|t| t.task_id).collect();
    let mut recorded: Vec<u64> = records.iter().map(|r| r.task_id).filter(|t| tuning_ids.contains(t)).collect();
    recorded.sort_unstable();
    let before = recorded.len();
    recorded.dedup();
    assert_eq!((before, recorded.len()), (tuning.len(), tuning.len()), "duplicate or missing records");

    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn a_watch_on_one_tracker_follows_a_job_run_through_another() {
    if !on_postgres() {
        eprintln!("SKIPPED: TENSORTUNE_TEST_PG is not set (two trackers need a shared PostgreSQL database)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let a = TestTracker::start(config(&dir)).await;
    let b = TestTracker::start(config(&dir)).await;
    let mut tuning_a = a.tuning().await;
    let mut worker = FakeWorker::register(&a, "box/a").await;
    let id = submit(&mut tuning_a, job(vec![matmul(256, 128, 256)], 8, 4)).await;
    let mut watch = b.tuning().await.watch_job(pb::JobRef { job_id: id }).await.unwrap().into_inner();
    drive(&mut worker, &mut tuning_a, id).await;
    // Every change was made through tracker a; b's watchers hear of them through the database.
    let last = tokio::time::timeout(PATIENCE, async {
        let mut last = None;
        while let Some(job) = watch.message().await.unwrap() {
            last = Some(job);
        }
        last
    })
    .await
    .expect("the watch on b did not end with the job");
    let last = last.expect("the watch sent nothing");
    assert_eq!((last.state, last.workloads[0].trials_done), (pb::JobState::Done as i32, 8));
    a.stop().await;
    b.stop().await;
}

/// One tracker on a PostgreSQL database of its own, a registered sim worker, and a pool of the
/// test's own on that database; `None` (the test says it skipped) when `TENSORTUNE_TEST_PG` is not
/// set, `why` saying why it needs PostgreSQL.
struct OnPostgres {
    _dir: tempfile::TempDir,
    tracker: TestTracker,
    tuning: tensortune_proto::pb::tuning_client::TuningClient<tonic::transport::Channel>,
    worker: FakeWorker,
    admin: sqlx::PgPool,
}

async fn one_tracker_on_postgres(why: &str) -> Option<OnPostgres> {
    if !on_postgres() {
        eprintln!("SKIPPED: TENSORTUNE_TEST_PG is not set ({why})");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&dir);
    let tracker = TestTracker::start(cfg.clone()).await;
    let tuning = tracker.tuning().await;
    let worker = FakeWorker::register(&tracker, "box/0").await;
    let admin = sqlx::PgPool::connect(&cfg.db.to_string_lossy()).await.unwrap();
    Some(OnPostgres { _dir: dir, tracker, tuning, worker, admin })
}

#[tokio::test]
async fn connections_the_postgres_server_drops_are_replaced_and_nothing_is_lost() {
    let Some(OnPostgres { _dir, tracker, mut tuning, mut worker, admin }) =
        one_tracker_on_postgres("the server's dropped connections").await
    else {
        return;
    };
    let id = submit(&mut tuning, job(vec![matmul(256, 128, 256)], 12, 4)).await;
    let mut reported = 0;
    let mut refused = Vec::new();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !is_terminal(&get_job(&mut tuning, id).await) {
        assert!(tokio::time::Instant::now() < deadline, "job {id} did not finish");
        // The server ends every other session on the database (the tracker's pool) between calls.
        sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")
            .execute(&admin)
            .await
            .unwrap();
        for task in worker.lease(2, 100).await {
            loop {
                match worker.report(&task, measure(&task)).await {
                    Ok(r) => {
                        assert!(r.stored, "task {} was not stored", task.task_id);
                        reported += 1;
                        break;
                    }
                    // A call that met a dropped connection changed nothing and says to retry.
                    Err(status) => {
                        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
                        refused.push(status);
                    }
                }
            }
        }
    }
    assert_eq!(reported, 12);
    let done = get_job(&mut tuning, id).await;
    assert_eq!((done.state, done.workloads[0].trials_done), (pb::JobState::Done as i32, 12));
    assert_eq!(all_records(&mut tuning).await.len(), 12, "one record per trial ({} reports refused)", refused.len());
    admin.close().await;
    tracker.stop().await;
}

/// The lock a tracker's dispatch group takes for a job it changes (`store::JOB_LOCK_CLASS`, "tnjb",
/// and the job id), taken here by a session of the test as another tracker's group would.
async fn hold_job(admin: &sqlx::PgPool, job: u64) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut holder = admin.begin().await.unwrap();
    sqlx::query("SELECT pg_advisory_xact_lock($1, $2)")
        .bind(0x746e_6a62_i32)
        .bind(i32::try_from(job).unwrap())
        .execute(&mut *holder)
        .await
        .unwrap();
    holder
}

#[tokio::test]
async fn a_lease_passes_over_a_job_another_trackers_write_holds_and_a_report_waits_for_it() {
    let Some(OnPostgres { _dir, tracker, mut tuning, mut worker, admin }) =
        one_tracker_on_postgres("job locks are PostgreSQL's").await
    else {
        return;
    };
    let first = submit(&mut tuning, job(vec![matmul(256, 128, 256)], 8, 4)).await;
    let second = submit(&mut tuning, job(vec![matmul(128, 128, 128)], 8, 4)).await;

    // Oldest job first, but the first is held elsewhere: its tasks are passed over, not waited for.
    let holder = hold_job(&admin, first).await;
    let leased = worker.lease(8, 100).await;
    let jobs: HashSet<u64> = leased.iter().map(|t| t.job_id).collect();
    assert_eq!(jobs, HashSet::from([second]), "{leased:?}");
    holder.rollback().await.unwrap();
    let again = worker.lease(8, 100).await;
    assert!(again.iter().any(|t| t.job_id == first), "{again:?}");

    // A report of a held job's task goes in once the holder is done, and is stored once.
    let holder = hold_job(&admin, second).await;
    let task = leased[0].clone();
    let mut reporter = FakeWorker { id: worker.id, client: tracker.dispatch().await };
    let report = tokio::spawn(async move { reporter.report(&task, measure(&task)).await });
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    holder.rollback().await.unwrap();
    let r = tokio::time::timeout(PATIENCE, report).await.expect("the report did not end").unwrap().unwrap();
    assert!(r.stored, "{r:?}");
    let again = worker.report(&leased[0], measure(&leased[0])).await.unwrap();
    assert!(!again.stored, "a second report of task {} was stored: {again:?}", leased[0].task_id);
    tracker.stop().await;
}
