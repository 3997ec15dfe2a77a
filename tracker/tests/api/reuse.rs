//! Records are reused across jobs instead of measured again.

use tensortune_proto::pb;

use crate::harness::*;

#[tokio::test]
async fn an_identical_job_finishes_from_stored_records() {
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    let mut worker = FakeWorker::register(&tracker, "box/0").await;
    let w = matmul(64, 64, 64);

    // The first job measures 6 configs: the lowest index times out (not reused), one fails to
    // compile (reused: it would fail again), the rest are ok.
    let first = submit(&mut tuning, job(vec![w.clone()], 6, 6)).await;
    let mut reported = Vec::new();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while reported.len() < 6 {
        assert!(tokio::time::Instant::now() < deadline);
        for t in worker.lease(8, 100).await {
            reported.push(t);
        }
    }
    reported.sort_by_key(|t| t.config_index);
    for (i, t) in reported.iter().enumerate() {
        let m = match i {
            0 => failed(pb::RecordStatus::Timeout),
            1 => failed(pb::RecordStatus::CompileError),
            _ => measure(t),
        };
        assert!(worker.report(t, m).await.unwrap().stored);
    }
    let first_job = get_job(&mut tuning, first).await;
    assert_eq!(first_job.state, pb::JobState::Done as i32);
    assert_eq!(all_records(&mut tuning).await.len(), 6);

    // The same job again (same seed, so the same configs): five come from the store.
    let second = submit(&mut tuning, job(vec![w.clone()], 6, 3)).await;
    let job2 = get_job(&mut tuning, second).await;
    assert_eq!((job2.workloads[0].trials_done, job2.workloads[0].reused), (5, 5));
    assert_eq!(job2.workloads[0].status_counts.get("compile_error"), Some(&1));
    let leased = worker.lease(8, 0).await;
    assert_eq!(leased.len(), 1, "only the timed-out config is measured again");
    assert_eq!(leased[0].config_index, reported[0].config_index);
    assert!(worker.report(&leased[0], measure(&leased[0])).await.unwrap().stored);
    let job2 = get_job(&mut tuning, second).await;
    assert_eq!(job2.state, pb::JobState::Done as i32);
    assert_eq!(all_records(&mut tuning).await.len(), 7);
    assert_eq!(
        job2.workloads[0].best.as_ref().map(|r| r.id),
        first_job.workloads[0].best.as_ref().map(|r| r.id),
        "the reused best is the first job's record"
    );

    // A third identical job is entirely reused: done at once, nothing to lease.
    let third = submit(&mut tuning, job(vec![w.clone()], 6, 3)).await;
    let job3 = get_job(&mut tuning, third).await;
    assert_eq!(job3.state, pb::JobState::Done as i32);
    assert_eq!((job3.workloads[0].trials_done, job3.workloads[0].reused), (6, 6));
    assert!(worker.lease(8, 0).await.is_empty());
    assert_eq!(all_records(&mut tuning).await.len(), 7);

    // A bigger budget measures only what is new.
    let fourth = submit(&mut tuning, job(vec![w.clone()], 9, 3)).await;
    let fresh = drive(&mut worker, &mut tuning, fourth).await;
    assert_eq!(fresh.len(), 3);
    let job4 = get_job(&mut tuning, fourth).await;
    assert_eq!((job4.workloads[0].trials_done, job4.workloads[0].reused), (9, 6));
    assert_eq!(all_records(&mut tuning).await.len(), 10);
    tracker.stop().await;
}
