//! WatchJob, ExportRecords, listings, early stopping and exhausted spaces.

use tensortune_proto::pb;
use tonic::Code;

use crate::harness::*;

#[tokio::test]
async fn watch_job_streams_snapshots_until_the_job_ends() {
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    let mut worker = FakeWorker::register(&tracker, "box/0").await;
    let id = submit(&mut tuning, job(vec![matmul(64, 64, 64)], 6, 2)).await;

    let mut stream = tuning.watch_job(pb::JobRef { job_id: id }).await.unwrap().into_inner();
    let first = stream.message().await.unwrap().unwrap();
    assert_eq!((first.id, first.state), (id, pb::JobState::Queued as i32));

    let driver = {
        let mut tuning = tuning.clone();
        tokio::spawn(async move { drive(&mut worker, &mut tuning, id).await.len() })
    };
    let mut snapshots = vec![first];
    let collect = async {
        while let Some(job) = stream.message().await.unwrap() {
            snapshots.push(job);
        }
    };
    tokio::time::timeout(PATIENCE, collect).await.expect("the watch stream did not end");
    assert_eq!(driver.await.unwrap(), 6);

    let last = snapshots.last().unwrap();
    assert_eq!(last.state, pb::JobState::Done as i32);
    assert_eq!(last.workloads[0].trials_done, 6);
    assert!(snapshots.len() >= 3, "only {} snapshots", snapshots.len());
    assert!(snapshots.iter().any(|j| j.state == pb::JobState::Running as i32));
    let done: Vec<u32> = snapshots.iter().map(|j| j.workloads[0].trials_done).collect();
    assert!(done.windows(2).all(|w| w[0] <= w[1]), "progress went backwards: {done:?}");

    // A finished job: one snapshot, then the end.
    let mut stream = tuning.watch_job(pb::JobRef { job_id: id }).await.unwrap().into_inner();
    assert_eq!(stream.message().await.unwrap().unwrap().state, pb::JobState::Done as i32);
    assert!(stream.message().await.unwrap().is_none());
    let missing = tuning.watch_job(pb::JobRef { job_id: 999 }).await;
    assert_eq!(missing.unwrap_err().code(), Code::NotFound);
    tracker.stop().await;
}

#[tokio::test]
async fn a_watcher_does_not_hold_up_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    FakeWorker::register(&tracker, "box/0").await;
    let id = submit(&mut tuning, job(vec![matmul(64, 64, 64)], 6, 2)).await;
    let mut stream = tuning.watch_job(pb::JobRef { job_id: id }).await.unwrap().into_inner();
    assert!(stream.message().await.unwrap().is_some());
    tracker.stop().await;
}

#[tokio::test]
async fn export_records_filters_and_orders_oldest_first() {
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    let mut worker = FakeWorker::register(&tracker, "box/0").await;
    let a = submit(&mut tuning, job(vec![matmul(64, 64, 64)], 5, 5)).await;
    drive_with(&mut worker, &mut tuning, a, |t| {
        if t.config_index % 2 == 0 { failed(pb::RecordStatus::WrongResult) } else { measure(t) }
    })
    .await;
    let b = submit(&mut tuning, job(vec![matmul(16, 16, 16)], 2, 2)).await;
    drive(&mut worker, &mut tuning, b).await;

    let all = all_records(&mut tuning).await;
    assert_eq!(all.len(), 7);
    assert!(all.windows(2).all(|w| w[0].id < w[1].id), "not oldest first");
    let key = all[0].workload_key.clone();
    let by_key =
        export(&mut tuning, pb::ExportRecordsRequest { workload_key: key.clone(), ..Default::default() }).await;
    assert_eq!(by_key.len(), 5);
    assert!(by_key.iter().all(|r| r.workload_key == key && r.job_id == a));
    let by_job = export(&mut tuning, pb::ExportRecordsRequest { job_id: b, ..Default::default() }).await;
    assert_eq!(by_job.len(), 2);
    let ok_only = export(&mut tuning, pb::ExportRecordsRequest { ok_only: true, ..Default::default() }).await;
    let wrong = all.iter().filter(|r| r.measurement.as_ref().unwrap().status != pb::RecordStatus::Ok as i32).count();
    assert!(wrong > 0);
    assert_eq!(ok_only.len(), 7 - wrong);
    assert!(ok_only.iter().all(|r| r.tflops > 0.0));
    let by_class =
        export(&mut tuning, pb::ExportRecordsRequest { device_class: "sim".into(), ..Default::default() }).await;
    assert_eq!(by_class.len(), 7);
    let none =
        export(&mut tuning, pb::ExportRecordsRequest { device_class: "h100".into(), ..Default::default() }).await;
    assert!(none.is_empty());
    // A job that does not exist is an error naming it, not an empty export.
    let missing = tuning.export_records(pb::ExportRecordsRequest { job_id: b + 100, ..Default::default() }).await;
    let status = missing.expect_err("an export of a job that does not exist");
    assert_eq!(status.code(), Code::NotFound);
    assert!(status.message().contains(&format!("job {}", b + 100)), "{}", status.message());
    let r = &all[0];
    assert!(r.workload.is_some() && !r.config.is_empty() && r.worker_id == worker.id && r.created_ms > 0);
    assert!(r.config.starts_with('{') && r.config.contains("\"block_m\""), "{}", r.config);
    tracker.stop().await;
}

#[tokio::test]
async fn a_workload_stops_early_when_its_best_stops_improving() {
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    let mut worker = FakeWorker::register(&tracker, "box/0").await;
    let req =
        pb::SubmitJobRequest { early_stop_trials: 3, early_stop_margin: 0.1, ..job(vec![matmul(64, 64, 64)], 50, 1) };
    let id = submit(&mut tuning, req).await;
    // 10 us, then 9.5 us (not 10% better), then worse: three trials after the best without a 10%
    // improvement.
    let mut n = 0;
    let reported = drive_with(&mut worker, &mut tuning, id, |_| {
        n += 1;
        ok(match n {
            1 => 10.0,
            2 => 9.5,
            _ => 20.0,
        })
    })
    .await;
    assert_eq!(reported.len(), 4);
    let job = get_job(&mut tuning, id).await;
    assert_eq!(job.state, pb::JobState::Done as i32);
    assert_eq!((job.early_stop_trials, job.early_stop_margin), (3, 0.1), "the job shows its rule");
    let w = &job.workloads[0];
    assert_eq!((w.state.as_str(), w.trials_done), ("early_stopped", 4));
    assert_eq!(w.best.as_ref().unwrap().measurement.as_ref().unwrap().median_us, 9.5);
    assert!(worker.lease(4, 0).await.is_empty());
    tracker.stop().await;
}

#[tokio::test]
async fn a_space_smaller_than_the_budget_is_exhausted() {
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    let mut worker = FakeWorker::register(&tracker, "box/0").await;
    let id = submit(&mut tuning, job(vec![matmul(16, 16, 16)], 100, 0)).await;
    let job0 = get_job(&mut tuning, id).await;
    let space = job0.workloads[0].space_size;
    assert!(space > 0 && space < 100);
    assert_eq!(job0.workloads[0].trials_target as u64, space);
    assert_eq!((job0.batch_size, job0.samples, job0.tuner.as_str()), (64, 10, "random"));
    drive(&mut worker, &mut tuning, id).await;
    let job = get_job(&mut tuning, id).await;
    assert_eq!((job.workloads[0].state.as_str(), job.workloads[0].trials_done as u64), ("exhausted", space));
    tracker.stop().await;
}

#[tokio::test]
async fn listings_of_jobs_and_workers() {
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    let mut worker = FakeWorker::register(&tracker, "box/0").await;
    // The first job measures the whole (small) space, so the second, though its tuner walks the
    // space in another order, is done from stored records at once.
    let first = submit(&mut tuning, job(vec![matmul(16, 16, 16)], 100, 0)).await;
    let measured = drive(&mut worker, &mut tuning, first).await.len() as u64;
    let second =
        submit(&mut tuning, pb::SubmitJobRequest { tuner: "grid".into(), ..job(vec![matmul(16, 16, 16)], 100, 0) })
            .await;
    let third = submit(&mut tuning, pb::SubmitJobRequest { seed: 0, ..job(vec![matmul(64, 64, 64)], 3, 3) }).await;
    let held = worker.lease(1, 1000).await;
    assert_eq!(held.len(), 1);

    let list = |states: Vec<pb::JobState>, limit| pb::ListJobsRequest {
        states: states.into_iter().map(|s| s as i32).collect(),
        limit,
    };
    let all = tuning.list_jobs(list(vec![], 0)).await.unwrap().into_inner().jobs;
    assert_eq!(all.iter().map(|j| j.id).collect::<Vec<_>>(), vec![third, second, first]);
    assert_ne!(all[0].seed, 0, "a seed is picked and recorded");
    assert_eq!(all[1].tuner, "grid");
    let running = tuning.list_jobs(list(vec![pb::JobState::Running], 0)).await.unwrap().into_inner().jobs;
    assert_eq!(running.iter().map(|j| j.id).collect::<Vec<_>>(), vec![third]);
    let done = tuning.list_jobs(list(vec![pb::JobState::Done], 1)).await.unwrap().into_inner().jobs;
    assert_eq!(done.iter().map(|j| j.id).collect::<Vec<_>>(), vec![second]);
    let bad = tuning.list_jobs(pb::ListJobsRequest { states: vec![42], limit: 0 }).await;
    assert_eq!(bad.unwrap_err().code(), Code::InvalidArgument);

    let workers = tuning.list_workers(pb::ListWorkersRequest {}).await.unwrap().into_inner().workers;
    assert_eq!(workers.len(), 1);
    let w = &workers[0];
    assert_eq!((w.id, w.name.as_str(), w.state.as_str()), (worker.id, "box/0", "online"));
    assert_eq!((w.leased, w.reported), (1, measured));
    assert_eq!(w.device.as_ref().unwrap().class_key, "sim");
    assert_eq!(w.templates[0].name, "wmma_gemm");
    tracker.stop().await;
}
