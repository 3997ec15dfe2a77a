//! Leases, heartbeats, idempotent reports, lost workers and cancellation.

use std::collections::HashSet;
use std::time::Duration;

use tensortune_proto::pb;
use tonic::Code;

use crate::harness::*;

#[tokio::test]
async fn a_repeated_report_is_acknowledged_and_stored_once() {
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    let mut worker = FakeWorker::register(&tracker, "box/0").await;
    submit(&mut tuning, job(vec![matmul(64, 64, 64)], 3, 3)).await;

    let task = worker.lease_some(1).await.remove(0);
    let first = worker.report(&task, measure(&task)).await.unwrap();
    assert!(first.stored && first.record_id > 0);
    for _ in 0..3 {
        let again = worker.report(&task, ok(1.0)).await.unwrap();
        assert_eq!((again.stored, again.record_id), (false, first.record_id));
    }
    let records = all_records(&mut tuning).await;
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].measurement.as_ref().unwrap().median_us, fake_us(&task));
    tracker.stop().await;
}

#[tokio::test]
async fn a_report_from_a_worker_without_the_lease_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    let mut a = FakeWorker::register(&tracker, "box/0").await;
    let mut b = FakeWorker::register(&tracker, "box/1").await;
    submit(&mut tuning, job(vec![matmul(64, 64, 64)], 4, 2)).await;

    let held = a.lease_some(1).await.remove(0);
    let (c, message) = code(b.report(&held, measure(&held)).await);
    assert_eq!(c, Code::FailedPrecondition);
    assert!(message.contains(&format!("worker {} does not hold task {}", b.id, held.task_id)), "{message}");
    assert!(message.contains(&format!("leased to worker {}", a.id)), "{message}");

    // A task nobody leased yet cannot be reported either.
    let pending = b.lease_some(1).await.remove(0);
    let (c, _) = code(a.report(&pending, measure(&pending)).await);
    assert_eq!(c, Code::FailedPrecondition);

    assert!(a.report(&held, measure(&held)).await.unwrap().stored);
    assert!(all_records(&mut tuning).await.len() == 1);
    tracker.stop().await;
}

#[tokio::test]
async fn an_expired_lease_goes_to_another_worker_without_a_duplicate_record() {
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(short_leases(&dir, 3)).await;
    let mut tuning = tracker.tuning().await;
    let mut a = FakeWorker::register(&tracker, "box/0").await;
    let mut b = FakeWorker::register(&tracker, "box/1").await;
    let id = submit(&mut tuning, job(vec![matmul(64, 64, 64)], 3, 1)).await;

    // A takes the only outstanding task and goes silent; once its lease expires B gets it.
    let lost = a.lease_some(1).await.remove(0);
    let again = b.lease_some(1).await.remove(0);
    assert_eq!(again.task_id, lost.task_id);
    assert!(again.lease_expires_ms > lost.lease_expires_ms);
    assert_eq!(a.heartbeat(&[lost.task_id]).await, vec![lost.task_id], "a must be told to drop the task");
    let (c, message) = code(a.report(&lost, measure(&lost)).await);
    assert_eq!(c, Code::FailedPrecondition, "{message}");

    assert!(b.report(&again, measure(&again)).await.unwrap().stored);
    let rest = drive(&mut b, &mut tuning, id).await;
    assert_eq!(rest.len(), 2);
    // A's late report of the finished task is acknowledged and dropped.
    let late = a.report(&lost, measure(&lost)).await.unwrap();
    assert!(!late.stored);

    let records = all_records(&mut tuning).await;
    assert_eq!(records.len(), 3);
    assert_eq!(records.iter().map(|r| r.task_id).collect::<HashSet<_>>().len(), 3);
    assert_eq!(get_job(&mut tuning, id).await.state, pb::JobState::Done as i32);
    tracker.stop().await;
}

#[tokio::test]
async fn a_late_report_from_the_last_holder_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(short_leases(&dir, 3)).await;
    let mut tuning = tracker.tuning().await;
    let mut a = FakeWorker::register(&tracker, "box/0").await;
    let id = submit(&mut tuning, job(vec![matmul(64, 64, 64)], 1, 1)).await;

    let task = a.lease_some(1).await.remove(0);
    // Wait until the reaper returned the task to the queue (a heartbeat would renew the lease;
    // the worker listing shows what A holds)...
    eventually("the lease to expire", || {
        let mut tuning = tuning.clone();
        async move {
            let workers = tuning.list_workers(pb::ListWorkersRequest {}).await.unwrap().into_inner().workers;
            (workers[0].leased == 0).then_some(())
        }
    })
    .await;
    assert_eq!(a.heartbeat(&[task.task_id]).await, vec![task.task_id], "a must be told to drop the task");
    // ...yet A finished the measurement: nobody else took the task, so it is stored.
    assert!(a.report(&task, measure(&task)).await.unwrap().stored);
    assert_eq!(get_job(&mut tuning, id).await.state, pb::JobState::Done as i32);
    assert_eq!(all_records(&mut tuning).await.len(), 1);
    tracker.stop().await;
}

#[tokio::test]
async fn heartbeats_keep_a_lease() {
    let dir = tempfile::tempdir().unwrap();
    let config = tensortune_tracker::TrackerConfig {
        lease: Duration::from_secs(2),
        heartbeat: Duration::from_millis(300),
        ..config(&dir)
    };
    let tracker = TestTracker::start(config).await;
    let mut tuning = tracker.tuning().await;
    let mut a = FakeWorker::register(&tracker, "box/0").await;
    let mut b = FakeWorker::register(&tracker, "box/1").await;
    submit(&mut tuning, job(vec![matmul(64, 64, 64)], 2, 1)).await;

    let task = a.lease_some(1).await.remove(0);
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(a.heartbeat(&[task.task_id]).await.is_empty());
    }
    assert!(b.lease(1, 0).await.is_empty(), "the task was re-leased while its holder heartbeats");
    // Unknown ids are to be dropped.
    assert_eq!(a.heartbeat(&[task.task_id, 999_999]).await, vec![999_999]);
    assert!(a.report(&task, measure(&task)).await.unwrap().stored);
    tracker.stop().await;
}

#[tokio::test]
async fn a_task_whose_workers_keep_dying_is_recorded_as_device_lost() {
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(short_leases(&dir, 2)).await;
    let mut tuning = tracker.tuning().await;
    let mut a = FakeWorker::register(&tracker, "box/0").await;
    let id = submit(&mut tuning, job(vec![matmul(64, 64, 64)], 1, 1)).await;

    let first = a.lease_some(1).await.remove(0);
    let second = a.lease_some(1).await.remove(0);
    assert_eq!(first.task_id, second.task_id);
    let job = eventually("the job to end", || {
        let mut tuning = tuning.clone();
        async move { Some(get_job(&mut tuning, id).await).filter(is_terminal) }
    })
    .await;
    assert_eq!(job.state, pb::JobState::Done as i32);
    assert_eq!(job.workloads[0].status_counts.get("device_lost"), Some(&1));
    assert!(job.workloads[0].best.is_none());

    let records = all_records(&mut tuning).await;
    assert_eq!(records.len(), 1);
    let m = records[0].measurement.as_ref().unwrap();
    assert_eq!(m.status, pb::RecordStatus::DeviceLost as i32);
    assert!(m.error.contains("lease expired 2 times"), "{}", m.error);
    assert_eq!(records[0].worker_id, a.id);
    // A lost kernel is not reused: it may well run on another worker.
    let again = submit(&mut tuning, crate::harness::job(vec![matmul(64, 64, 64)], 1, 1)).await;
    assert_eq!(a.lease_some(1).await[0].job_id, again);
    tracker.stop().await;
}

#[tokio::test]
async fn cancelling_stops_dispatch_but_keeps_reports() {
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    let mut a = FakeWorker::register(&tracker, "box/0").await;
    let id = submit(&mut tuning, job(vec![matmul(64, 64, 64)], 10, 4)).await;

    let held = a.lease(2, 1000).await;
    assert_eq!(held.len(), 2);
    let cancelled = tuning.cancel_job(pb::JobRef { job_id: id }).await.unwrap().into_inner();
    assert_eq!(cancelled.state, pb::JobState::Cancelled as i32);
    assert!(cancelled.finished_ms > 0 && cancelled.error.contains("cancelled"), "{cancelled:?}");

    assert!(a.lease(4, 0).await.is_empty(), "a cancelled job's tasks were leased");
    let ids: Vec<u64> = held.iter().map(|t| t.task_id).collect();
    assert_eq!(a.heartbeat(&ids).await, ids);
    // A measurement already under way is still recorded.
    assert!(a.report(&held[0], measure(&held[0])).await.unwrap().stored);
    let job = get_job(&mut tuning, id).await;
    assert_eq!((job.state, job.workloads[0].trials_done), (pb::JobState::Cancelled as i32, 1));
    assert_eq!(job.workloads[0].state, "cancelled", "an unfinished workload of a cancelled job says so");

    // Cancelling again is a no-op; a finished job and an unknown one cannot be cancelled.
    let again = tuning.cancel_job(pb::JobRef { job_id: id }).await.unwrap().into_inner();
    assert_eq!(again.state, pb::JobState::Cancelled as i32);
    let other = submit(&mut tuning, crate::harness::job(vec![matmul(64, 64, 64)], 1, 1)).await;
    drive(&mut a, &mut tuning, other).await;
    let (c, message) = code(tuning.cancel_job(pb::JobRef { job_id: other }).await);
    assert_eq!(c, Code::FailedPrecondition);
    assert!(message.contains("already ended (done)"), "{message}");
    assert_eq!(code_of(tuning.cancel_job(pb::JobRef { job_id: 4242 }).await), Code::NotFound);
    tracker.stop().await;
}

fn code_of<T: std::fmt::Debug>(r: Result<T, tonic::Status>) -> Code {
    code(r).0
}

#[tokio::test]
async fn a_report_for_an_earlier_lease_of_a_task_held_again_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(short_leases(&dir, 3)).await;
    let mut tuning = tracker.tuning().await;
    let mut a = FakeWorker::register(&tracker, "box/0").await;
    let id = submit(&mut tuning, job(vec![matmul(64, 64, 64)], 1, 1)).await;

    // A's first lease expires and A leases the same task again: a second lease of it.
    let first = a.lease_some(1).await.remove(0);
    assert_eq!(first.lease_serial, 1);
    let second = a.lease_some(1).await.remove(0);
    assert_eq!((second.task_id, second.lease_serial), (first.task_id, 2));
    // A result of the first lease (a stale measurement that was still on its way) is refused.
    let (c, message) = code(a.report(&first, ok(0.5)).await);
    assert_eq!(c, Code::FailedPrecondition, "{message}");
    assert!(message.contains("is stale"), "{message}");
    assert!(all_records(&mut tuning).await.is_empty(), "a refused report leaves no record");
    assert!(a.report(&second, measure(&second)).await.unwrap().stored);
    assert_eq!(all_records(&mut tuning).await.len(), 1);
    assert_eq!(get_job(&mut tuning, id).await.state, pb::JobState::Done as i32);
    tracker.stop().await;
}

#[tokio::test]
async fn a_batch_of_reports_is_answered_report_by_report_and_a_retried_batch_stores_nothing_twice() {
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    let mut a = FakeWorker::register(&tracker, "box/0").await;
    let mut b = FakeWorker::register(&tracker, "box/1").await;
    let submitted = submit(&mut tuning, job(vec![matmul(64, 64, 64)], 8, 8)).await;

    let mine = a.lease_some(3).await;
    assert_eq!(mine.len(), 3);
    let theirs = b.lease_some(1).await.remove(0);
    let entry = |task: &pb::Task, measurement: pb::Measurement| pb::ReportResultRequest {
        task_id: task.task_id,
        measurement: Some(measurement),
        lease_serial: task.lease_serial,
        ..Default::default()
    };
    let mut reports: Vec<pb::ReportResultRequest> = mine.iter().map(|t| entry(t, measure(t))).collect();
    // Refused for good, each in its own outcome: a task leased to another worker, a malformed
    // measurement, an unknown task.
    reports.push(entry(&theirs, measure(&theirs)));
    reports.push(pb::ReportResultRequest { measurement: Some(pb::Measurement::default()), ..entry(&mine[0], ok(1.0)) });
    reports.push(pb::ReportResultRequest { task_id: 999_999, ..entry(&mine[0], ok(1.0)) });
    // A task twice in one batch (the batch's tasks are read at once): stored once, then
    // acknowledged as done.
    reports.push(entry(&mine[1], ok(1.0)));
    let request = pb::ReportResultsRequest { worker_id: a.id, reports };

    let first = a.client.report_results(request.clone()).await.unwrap().into_inner().outcomes;
    let codes: Vec<Code> = first.iter().map(|o| Code::from_i32(o.code)).collect();
    assert_eq!(
        codes,
        [Code::Ok, Code::Ok, Code::Ok, Code::FailedPrecondition, Code::InvalidArgument, Code::NotFound, Code::Ok],
        "{first:?}"
    );
    assert_eq!((first[6].stored, first[6].record_id), (false, first[1].record_id), "{first:?}");
    assert!(first[..3].iter().all(|o| o.stored && o.record_id > 0), "{first:?}");
    assert!(first[3].message.contains("does not hold"), "{}", first[3].message);
    assert!(first[4].message.contains("reports[4].measurement.status"), "{}", first[4].message);
    assert_eq!(
        first.iter().map(|o| o.task_id).collect::<Vec<_>>(),
        request.reports.iter().map(|r| r.task_id).collect::<Vec<_>>()
    );

    // The batch's three trials were counted (its progress row stored once, at the commit) and
    // their tasks marked done together.
    let progress = &get_job(&mut tuning, submitted).await.workloads[0];
    assert_eq!(progress.trials_done, 3, "{progress:?}");
    assert!(first[..3].iter().any(|o| progress.best.as_ref().is_some_and(|b| b.id == o.record_id)), "{progress:?}");

    // The same batch again (a worker that never saw the answer): acknowledged, nothing stored.
    let again = a.client.report_results(request.clone()).await.unwrap().into_inner().outcomes;
    for (o, f) in again[..3].iter().zip(&first) {
        assert_eq!((o.code, o.stored, o.record_id), (0, false, f.record_id), "{again:?}");
    }
    let records = all_records(&mut tuning).await;
    assert_eq!(records.len(), 3, "{records:?}");
    assert!(b.report(&theirs, measure(&theirs)).await.unwrap().stored);

    // The batch as a whole: its worker must exist, and it holds 1 ..= 1024 reports.
    let (c, _) = code(a.client.report_results(pb::ReportResultsRequest { worker_id: 777, ..request.clone() }).await);
    assert_eq!(c, Code::NotFound);
    let (c, message) =
        code(a.client.report_results(pb::ReportResultsRequest { worker_id: a.id, reports: vec![] }).await);
    assert_eq!(c, Code::InvalidArgument);
    assert!(message.contains("1 ..= 1024"), "{message}");
    tracker.stop().await;
}

#[tokio::test]
async fn tasks_made_pending_reach_every_waiting_lease_though_few_are_woken() {
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    // Five workers long-poll for one task each before there is any: the job's five tasks wake one
    // of them (one per 16 tasks), and each that leases all it asked for wakes the next. A waiter
    // left asleep would come back empty when its 20 s poll ends.
    let mut waiting = tokio::task::JoinSet::new();
    for i in 0..5 {
        let mut worker = FakeWorker::register(&tracker, &format!("box/{i}")).await;
        waiting.spawn(async move { worker.lease(1, 20_000).await });
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    submit(&mut tuning, job(vec![matmul(64, 64, 64)], 5, 5)).await;
    let mut leased = HashSet::new();
    while let Some(tasks) = waiting.join_next().await {
        let tasks = tasks.unwrap();
        assert_eq!(tasks.len(), 1, "a waiting lease came back with {tasks:?}");
        assert!(leased.insert(tasks[0].task_id), "task {} leased twice", tasks[0].task_id);
    }
    assert_eq!(leased.len(), 5);
    tracker.stop().await;
}
