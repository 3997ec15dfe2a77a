//! A tracker stopped mid-job and started again on the same database resumes it.

use std::collections::HashSet;

use tensortune_proto::pb;

use crate::harness::*;

#[tokio::test]
async fn a_restarted_tracker_resumes_the_job_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    let mut worker = FakeWorker::register(&tracker, "box/0").await;
    let id = submit(&mut tuning, job(vec![matmul(64, 64, 64), matmul(256, 128, 256)], 8, 4)).await;

    // Report half of the first batch and keep the other half leased across the restart.
    let leased = worker.lease(8, 1000).await;
    assert_eq!(leased.len(), 8);
    let (reported, held) = leased.split_at(4);
    for t in reported {
        assert!(worker.report(t, measure(t)).await.unwrap().stored);
    }
    let before = get_job(&mut tuning, id).await;
    let records_before = all_records(&mut tuning).await;
    assert_eq!(records_before.len(), 4);
    tracker.stop().await;

    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    let after = get_job(&mut tuning, id).await;
    assert_eq!(after.state, pb::JobState::Running as i32);
    assert_eq!(all_records(&mut tuning).await, records_before);
    for (b, a) in before.workloads.iter().zip(&after.workloads) {
        assert_eq!((a.trials_done, a.best.as_ref().map(|r| r.id)), (b.trials_done, b.best.as_ref().map(|r| r.id)));
    }

    // The worker survived: it registers again under its old id and its leases still hold.
    let mut req = registration("box/0", sim_device());
    req.previous_id = worker.id;
    let mut again = FakeWorker::register_with(&tracker, req).await;
    assert_eq!(again.id, worker.id);
    for t in held {
        assert!(again.report(t, measure(t)).await.unwrap().stored, "task {} lost across the restart", t.task_id);
    }
    let rest = drive(&mut again, &mut tuning, id).await;
    assert_eq!(rest.len(), 8);

    let done = get_job(&mut tuning, id).await;
    assert_eq!(done.state, pb::JobState::Done as i32);
    let records = all_records(&mut tuning).await;
    assert_eq!(records.len(), 16);
    assert_eq!(records.iter().map(|r| r.task_id).collect::<HashSet<_>>().len(), 16);
    let configs: HashSet<_> = records.iter().map(|r| (r.workload_key.clone(), r.config_index)).collect();
    assert_eq!(configs.len(), 16, "a config was proposed twice across the restart");
    for w in &done.workloads {
        assert_eq!((w.trials_done, w.state.as_str()), (8, "done"));
        let fastest = records
            .iter()
            .filter(|r| r.workload_key == w.workload_key)
            .min_by(|a, b| {
                a.measurement.as_ref().unwrap().median_us.total_cmp(&b.measurement.as_ref().unwrap().median_us)
            })
            .unwrap();
        assert_eq!(w.best.as_ref().unwrap().id, fastest.id);
    }

    // And a third start finds everything as it was.
    tracker.stop().await;
    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    assert_eq!(all_records(&mut tuning).await, records);
    assert_eq!(get_job(&mut tuning, id).await.workloads, done.workloads);
    tracker.stop().await;
}

#[tokio::test]
async fn the_random_tuner_continues_its_order_after_a_restart() {
    // The same job run straight through, and interrupted by a restart, measures the same configs.
    let straight = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(config(&straight)).await;
    let mut tuning = tracker.tuning().await;
    let mut worker = FakeWorker::register(&tracker, "box/0").await;
    let id = submit(&mut tuning, job(vec![matmul(64, 64, 64)], 9, 3)).await;
    let mut expected: Vec<u64> = drive(&mut worker, &mut tuning, id).await.iter().map(|t| t.config_index).collect();
    tracker.stop().await;

    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    let mut worker = FakeWorker::register(&tracker, "box/0").await;
    let id = submit(&mut tuning, job(vec![matmul(64, 64, 64)], 9, 3)).await;
    let mut seen = Vec::new();
    for t in worker.lease(2, 1000).await {
        assert!(worker.report(&t, measure(&t)).await.unwrap().stored);
        seen.push(t.config_index);
    }
    tracker.stop().await;
    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    let mut worker = FakeWorker::register(&tracker, "box/1").await;
    seen.extend(drive(&mut worker, &mut tuning, id).await.iter().map(|t| t.config_index));
    expected.sort();
    seen.sort();
    assert_eq!(seen, expected);
    tracker.stop().await;
}
