//! A job-wide trial budget (`total_trials`): trials go to the workload expected to gain the most,
//! after a warm-up for each, and the job ends when the budget is spent.

use std::collections::{HashMap, HashSet};

use tensortune_kernels::Workload;
use tensortune_proto::pb;
use tensortune_search::schedule::WARMUP;

use crate::harness::*;

#[tokio::test]
async fn a_job_budget_goes_to_the_workload_that_keeps_improving() {
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    let mut worker = FakeWorker::register(&tracker, "box/0").await;
    let workloads = vec![matmul(128, 128, 128), matmul(256, 128, 256), matmul(256, 64, 256)];
    let improving = Workload::try_from(&workloads[1]).unwrap().key();
    let req = pb::SubmitJobRequest { total_trials: 60, ..job(workloads, 100, 4) };
    let id = submit(&mut tuning, req).await;
    let submitted = get_job(&mut tuning, id).await;
    assert_eq!((submitted.total_trials, submitted.batch_size), (60, 4));
    // The job keeps 4 tasks outstanding in all, not 4 per workload.
    assert_eq!(submitted.workloads.iter().map(|w| w.trials_target).collect::<Vec<_>>(), [100, 100, 100]);

    // One workload gets faster with every trial it is given; the other two are flat.
    let mut given = 0u32;
    let tasks = drive_with(&mut worker, &mut tuning, id, |t| {
        if t.workload_key == improving {
            given += 1;
            ok(100.0 / f64::from(given))
        } else {
            ok(50.0)
        }
    })
    .await;

    let job = get_job(&mut tuning, id).await;
    assert_eq!(job.state, pb::JobState::Done as i32);
    let done: Vec<u32> = job.workloads.iter().map(|w| w.trials_done).collect();
    assert_eq!(done.iter().sum::<u32>(), 60, "{done:?}");
    assert_eq!(tasks.len(), 60);
    for w in &job.workloads {
        assert_eq!(w.state, "done");
        assert!(w.trials_done as usize >= WARMUP, "{done:?}");
    }
    assert!(done[1] >= done[0] + 8 && done[1] >= done[2] + 8, "the improving workload got {done:?}");
    let mut per_workload: HashMap<String, HashSet<u64>> = HashMap::new();
    for t in &tasks {
        assert!(
            per_workload.entry(t.workload_key.clone()).or_default().insert(t.config_index),
            "config proposed twice"
        );
    }
    assert_eq!(all_records(&mut tuning).await.len(), 60);
    tracker.stop().await;
}

#[tokio::test]
async fn a_small_budget_is_shared_evenly_and_ends_every_workload() {
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    let mut worker = FakeWorker::register(&tracker, "box/0").await;
    // Smaller than the warm-up of even one workload: each gets its share, fewest trials first.
    let workloads = vec![matmul(64, 64, 64), matmul(128, 64, 64), matmul(64, 64, 128)];
    let req = pb::SubmitJobRequest { total_trials: 7, ..job_with_finalists(workloads, 50, 64, None) };
    let id = submit(&mut tuning, req).await;
    // All 7 are proposed at once (the batch is larger than the budget).
    let first = worker.lease(64, 1000).await;
    assert_eq!(first.len(), 7);
    let mut by_workload: HashMap<String, usize> = HashMap::new();
    for t in &first {
        *by_workload.entry(t.workload_key.clone()).or_default() += 1;
    }
    let mut shares: Vec<usize> = by_workload.values().copied().collect();
    shares.sort();
    assert_eq!(shares, [2, 2, 3]);
    // Reported: each workload re-measures its finalists once its last trial is in, then the job is
    // done.
    for t in &first {
        assert!(worker.report(t, measure(t)).await.unwrap().stored);
    }
    drive(&mut worker, &mut tuning, id).await;
    let job = get_job(&mut tuning, id).await;
    assert_eq!(job.state, pb::JobState::Done as i32);
    for w in &job.workloads {
        assert_eq!(w.state, "done");
        assert_eq!(w.finalists.len(), w.trials_done as usize, "{w:?}");
    }
    assert_eq!(job.workloads.iter().map(|w| w.trials_done).sum::<u32>(), 7);
    tracker.stop().await;
}

#[tokio::test]
async fn a_budget_job_resumes_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    let mut worker = FakeWorker::register(&tracker, "box/0").await;
    let req = pb::SubmitJobRequest { total_trials: 40, ..job(vec![matmul(64, 64, 64), matmul(128, 64, 64)], 30, 3) };
    let id = submit(&mut tuning, req).await;
    for t in worker.lease(2, 1000).await {
        assert!(worker.report(&t, measure(&t)).await.unwrap().stored);
    }
    tracker.stop().await;

    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    let mut worker = FakeWorker::register(&tracker, "box/1").await;
    let rest = drive(&mut worker, &mut tuning, id).await;
    assert_eq!(rest.len(), 38);
    let job = get_job(&mut tuning, id).await;
    assert_eq!(job.state, pb::JobState::Done as i32);
    assert_eq!(job.workloads.iter().map(|w| w.trials_done).sum::<u32>(), 40);
    let records = all_records(&mut tuning).await;
    let configs: HashSet<_> = records.iter().map(|r| (r.workload_key.clone(), r.config_index)).collect();
    assert_eq!(configs.len(), 40, "a config was proposed twice across the restart");
    tracker.stop().await;
}

#[tokio::test]
async fn a_model_job_spends_its_budget_in_batches() {
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    let mut worker = FakeWorker::register(&tracker, "box/0").await;
    let workloads = vec![matmul(64, 64, 64), matmul(128, 64, 64)];
    let req = pb::SubmitJobRequest { tuner: "model".into(), total_trials: 40, ..job(workloads, 30, 8) };
    let id = submit(&mut tuning, req).await;
    // A batch goes to one workload at a time, and the next once it is in.
    let mut batches = Vec::new();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !is_terminal(&get_job(&mut tuning, id).await) {
        assert!(tokio::time::Instant::now() < deadline, "job {id} did not finish");
        let batch = worker.lease(64, 100).await;
        if batch.is_empty() {
            continue;
        }
        assert!(batch.len() <= 8);
        assert!(batch.iter().all(|t| t.workload_key == batch[0].workload_key), "a batch spans workloads");
        for t in &batch {
            assert!(worker.report(t, measure(t)).await.unwrap().stored);
        }
        batches.push((batch[0].workload_key.clone(), batch.len()));
    }
    let job = get_job(&mut tuning, id).await;
    assert_eq!(job.state, pb::JobState::Done as i32);
    let done: Vec<u32> = job.workloads.iter().map(|w| w.trials_done).collect();
    assert_eq!(done.iter().sum::<u32>(), 40, "{done:?}");
    assert!(done.iter().all(|d| *d as usize >= WARMUP), "{done:?}");
    assert_eq!(batches.iter().map(|(_, n)| n).sum::<usize>(), 40, "{batches:?}");
    let records = all_records(&mut tuning).await;
    let configs: HashSet<_> = records.iter().map(|r| (r.workload_key.clone(), r.config_index)).collect();
    assert_eq!(configs.len(), 40);
    tracker.stop().await;
}

/// A model's job (weights given), every workload improving alike on `curve`; returns the trials
/// each got. `vendor` gives a workload's vendor time (else the harness's 1.5x of each record).
async fn model_job(weights: Vec<f64>, vendor: impl Fn(usize) -> Option<f64>) -> Vec<u32> {
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    let mut worker = FakeWorker::register(&tracker, "box/0").await;
    let workloads: Vec<pb::Workload> = [(128, 128, 128), (256, 128, 256), (256, 64, 256)]
        .iter()
        .take(weights.len())
        .map(|&(m, n, k)| matmul(m, n, k))
        .collect();
    let keys: Vec<String> = workloads.iter().map(|w| Workload::try_from(w).unwrap().key()).collect();
    let req = pb::SubmitJobRequest { total_trials: 90, weights: weights.clone(), ..job(workloads, 100, 4) };
    let id = submit(&mut tuning, req).await;
    assert_eq!(get_job(&mut tuning, id).await.workloads.iter().map(|w| w.weight).collect::<Vec<_>>(), weights);
    let mut given: HashMap<String, u32> = HashMap::new();
    drive_with(&mut worker, &mut tuning, id, |t| {
        let n = given.entry(t.workload_key.clone()).or_default();
        *n += 1;
        let m = ok(100.0 / f64::from(*n));
        let i = keys.iter().position(|k| *k == t.workload_key).unwrap();
        match vendor(i) {
            Some(v) => pb::Measurement { baseline_us: Some(v), ..m },
            None => m,
        }
    })
    .await;
    let job = get_job(&mut tuning, id).await;
    tracker.stop().await;
    let done: Vec<u32> = job.workloads.iter().map(|w| w.trials_done).collect();
    assert_eq!(done.iter().sum::<u32>(), 90, "{done:?}");
    done
}

#[tokio::test]
async fn a_models_weights_steer_its_budget() {
    let done = model_job(vec![1.0, 30.0, 1.0], |_| None).await;
    assert!(done[1] >= done[0] + 8 && done[1] >= done[2] + 8, "the heavy workload got {done:?}");
}

#[tokio::test]
async fn a_model_job_spends_little_where_the_vendor_stays_far_ahead() {
    // Both improve alike, but workload 1's vendor runs in 0.5 us: what tuning finds there is never
    // run by the model.
    let done = model_job(vec![1.0, 1.0], |i| (i == 1).then_some(0.5)).await;
    assert!(done[0] >= done[1] + 8, "the workload behind its vendor got {done:?}");
}

#[tokio::test]
async fn a_budget_keeps_a_batch_in_flight_for_each_online_worker() {
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    let mut first = FakeWorker::register(&tracker, "box/0").await;
    for name in ["box/1", "box/2"] {
        FakeWorker::register(&tracker, name).await;
    }
    let workloads = vec![matmul(64, 64, 64), matmul(128, 64, 64), matmul(64, 64, 128), matmul(128, 128, 64)];
    let req = pb::SubmitJobRequest { tuner: "model".into(), total_trials: 48, ..job(workloads, 30, 4) };
    let id = submit(&mut tuning, req).await;
    // Three GPUs of the job's class: three whole batches, each of another workload (one worker
    // would get one batch, `a_model_job_spends_its_budget_in_batches`). Each batch is fitted off
    // the writer lock and becomes tasks when it is ready, so they may come in several leases;
    // none comes after them before a result is in.
    let mut queued = Vec::new();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while queued.len() < 12 {
        assert!(tokio::time::Instant::now() < deadline, "{} of 12 tasks were proposed", queued.len());
        queued.extend(first.lease(64, 1000).await);
    }
    assert!(first.lease(64, 300).await.is_empty(), "a fourth batch before any result");
    let mut per_workload: HashMap<String, usize> = HashMap::new();
    for t in &queued {
        *per_workload.entry(t.workload_key.clone()).or_default() += 1;
    }
    assert_eq!(per_workload.values().copied().collect::<Vec<_>>(), [4, 4, 4], "{per_workload:?}");
    for t in &queued {
        assert!(first.report(t, measure(t)).await.unwrap().stored);
    }
    drive(&mut first, &mut tuning, id).await;
    let job = get_job(&mut tuning, id).await;
    assert_eq!(job.state, pb::JobState::Done as i32);
    assert_eq!(job.workloads.iter().map(|w| w.trials_done).sum::<u32>(), 48);
    let records = all_records(&mut tuning).await;
    let configs: HashSet<_> = records.iter().map(|r| (r.workload_key.clone(), r.config_index)).collect();
    assert_eq!(configs.len(), 48, "a config was proposed twice");
    tracker.stop().await;
}
