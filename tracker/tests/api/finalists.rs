//! Noise-aware winners: a workload whose tuning ended re-measures its fastest configs in one
//! finalist task, and the fastest re-measurement wins.

use std::collections::HashMap;

use tensortune_proto::pb;
use tonic::Code;

use crate::harness::*;

/// The median of a record.
fn median(r: &pb::Record) -> f64 {
    r.measurement.as_ref().unwrap().median_us
}

#[tokio::test]
async fn the_fastest_remeasurement_wins_and_trials_stay_about_tuning() {
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    let mut worker = FakeWorker::register(&tracker, "box/0").await;
    // finalists 0: the default, 3.
    let id = submit(&mut tuning, job_with_finalists(vec![matmul(256, 128, 256)], 6, 6, None)).await;

    let (tuned, task) = tune_until_finalist(&mut worker, measure).await;
    assert_eq!(tuned.len(), 6);
    let mut by_time = tuned.clone();
    by_time.sort_by(|a, b| fake_us(a).total_cmp(&fake_us(b)));
    let fastest: Vec<u64> = by_time.iter().take(3).map(|t| t.config_index).collect();
    assert_eq!(task.finalist_indices, fastest, "the finalists are the 3 fastest tuning configs, fastest first");
    for (i, t) in by_time.iter().take(3).enumerate() {
        assert_eq!(task.finalist_configs[i], t.config);
    }
    assert_eq!((task.rounds, task.config.as_str(), task.config_index), (3, "", 0));
    assert_eq!((task.samples, task.job_id, task.workload_key.as_str()), (10, id, tuned[0].workload_key.as_str()));

    let finalizing = get_job(&mut tuning, id).await;
    assert_eq!((finalizing.finalists, finalizing.finalist_rounds), (3, 3));
    assert_eq!(finalizing.state, pb::JobState::Running as i32, "the job waits for its finalists");
    let w = &finalizing.workloads[0];
    assert_eq!((w.state.as_str(), w.trials_done), ("finalizing", 6));
    assert_eq!(w.best.as_ref().unwrap().task_id, by_time[0].task_id, "until re-measured, best is the tuning best");
    assert!(w.finalists.is_empty());
    assert!(worker.heartbeat(&[task.task_id]).await.is_empty(), "the finalist task's lease is renewed");

    // The re-measurement reverses the tuning order of the first two.
    let remeasured = [9.0, 7.0, 8.0];
    let reply = worker.report_finalists(&task, remeasured.iter().map(|us| ok(*us)).collect()).await.unwrap();
    assert!(reply.stored);

    let done = get_job(&mut tuning, id).await;
    assert_eq!(done.state, pb::JobState::Done as i32);
    assert!(done.error.is_empty(), "{}", done.error);
    let w = &done.workloads[0];
    assert_eq!((w.state.as_str(), w.trials_done, w.reused), ("done", 6, 0));
    assert_eq!(w.status_counts, HashMap::from([("ok".to_owned(), 6)]), "re-measurements are not trials");
    let best = w.best.as_ref().unwrap();
    assert!(best.remeasure && best.task_id == task.task_id && best.config_index == fastest[1], "{best:?}");
    assert_eq!((median(best), best.id), (7.0, reply.record_id), "the reply names the winner's record");
    assert!((w.finalist_gap - (8.0 - 7.0) / 7.0).abs() < 1e-12, "gap {}", w.finalist_gap);
    let order: Vec<(u64, f64, f64)> =
        w.finalists.iter().map(|f| (f.config_index, f.tuned_us, f.remeasured_us)).collect();
    let tuned_us = |i: usize| fake_us(&by_time[i]);
    assert_eq!(
        order,
        vec![(fastest[1], tuned_us(1), 7.0), (fastest[2], tuned_us(2), 8.0), (fastest[0], tuned_us(0), 9.0)]
    );
    assert_eq!(w.finalists[0].record_id, best.id);
    assert_eq!(w.finalists[0].config, by_time[1].config);

    let records = all_records(&mut tuning).await;
    assert_eq!(records.len(), 9);
    let remeasures: Vec<&pb::Record> = records.iter().filter(|r| r.remeasure).collect();
    assert_eq!(remeasures.len(), 3);
    assert!(remeasures.iter().all(|r| r.task_id == task.task_id && r.job_id == id && r.worker_id == worker.id));
    assert!(remeasures.iter().all(|r| r.measurement.as_ref().unwrap().provenance.is_some() && r.tflops > 0.0));
    for f in &w.finalists {
        let r = records.iter().find(|r| r.id == f.record_id).unwrap();
        assert!(r.remeasure && r.config_index == f.config_index && median(r) == f.remeasured_us);
    }

    // A repeated finalist report stores nothing twice.
    for _ in 0..2 {
        let again = worker.report_finalists(&task, vec![ok(1.0), ok(1.0), ok(1.0)]).await.unwrap();
        assert_eq!((again.stored, again.record_id), (false, reply.record_id));
    }
    assert_eq!(all_records(&mut tuning).await, records);
    assert_eq!(get_job(&mut tuning, id).await.workloads, done.workloads);

    // QueryBest answers the job's verdict, the winner's re-measurement, not a faster record of a
    // config its rounds measured slower (every trial here read faster than the rounds).
    let fastest_record = records
        .iter()
        .filter(|r| r.measurement.as_ref().unwrap().status == 1)
        .min_by(|a, b| median(a).total_cmp(&median(b)))
        .unwrap();
    assert!(median(fastest_record) < median(best), "a trial is faster than the verdict: {fastest_record:?}");
    let answer = tuning
        .query_best(pb::QueryBestRequest { workload: Some(matmul(256, 128, 256)), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.best.len(), 1);
    assert_eq!(answer.best[0].id, best.id);
    tracker.stop().await;
}

#[tokio::test]
async fn bad_finalist_reports_name_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    let mut worker = FakeWorker::register(&tracker, "box/0").await;
    submit(&mut tuning, job_with_finalists(vec![matmul(64, 64, 64)], 3, 3, Some(3))).await;
    let (tuned, task) = tune_until_finalist(&mut worker, measure).await;
    assert_eq!(task.finalist_configs.len(), 3);

    let report = |measurement: Option<pb::Measurement>, finalists: Vec<pb::Measurement>| pb::ReportResultRequest {
        worker_id: worker.id,
        task_id: task.task_id,
        measurement,
        finalist_measurements: finalists,
        lease_serial: task.lease_serial,
    };
    let tuning_task = format!("invalid finalist_measurements: task {} is a tuning task", tuned[0].task_id);
    let cases: Vec<(&str, pb::ReportResultRequest, &str)> = vec![
        ("only measurement", report(Some(ok(3.0)), vec![]), "invalid finalist_measurements: task"),
        (
            "too few",
            report(None, vec![ok(3.0), ok(4.0)]),
            "invalid finalist_measurements: holds 2 measurements but task",
        ),
        ("too many", report(None, vec![ok(3.0); 4]), "invalid finalist_measurements: holds 4 measurements"),
        (
            "more than any finalist task has",
            report(None, vec![ok(3.0); 17]),
            "invalid finalist_measurements: holds 17 measurements; a finalist task has at most 16",
        ),
        ("both", report(Some(ok(3.0)), vec![ok(3.0); 3]), "invalid measurement: must be unset"),
        ("neither", report(None, vec![]), "invalid measurement: must be set"),
        (
            "a bad one",
            report(None, vec![ok(3.0), ok(f64::NAN), ok(4.0)]),
            "invalid finalist_measurements[1].median_us:",
        ),
        (
            "no status",
            report(None, vec![ok(3.0), ok(3.0), pb::Measurement { status: 0, ..ok(3.0) }]),
            "invalid finalist_measurements[2].status:",
        ),
        (
            "a tuning task with finalist measurements",
            pb::ReportResultRequest { task_id: tuned[0].task_id, ..report(None, vec![ok(3.0); 3]) },
            &tuning_task,
        ),
    ];
    for (what, req, expected) in cases {
        let (c, message) = code(worker.client.report_result(req).await);
        assert_eq!(c, Code::InvalidArgument, "{what}: {message}");
        assert!(message.contains(expected), "{what}: {message:?} lacks {expected:?}");
    }
    assert_eq!(all_records(&mut tuning).await.len(), 3, "a refused report stores nothing");

    // Finalists may fail their re-measurement like any kernel; they rank after the ok ones.
    let measurements = vec![failed(pb::RecordStatus::LaunchError), ok(6.0), failed(pb::RecordStatus::Timeout)];
    assert!(worker.report_finalists(&task, measurements).await.unwrap().stored);
    let (c, message) = code(worker.report(&task, ok(3.0)).await);
    assert!(
        c == Code::InvalidArgument && message.contains("finalist task"),
        "a malformed repeat is still refused: {message}"
    );
    let job = get_job(&mut tuning, task.job_id).await;
    let w = &job.workloads[0];
    assert_eq!((job.state, w.finalist_gap), (pb::JobState::Done as i32, 0.0), "one ok finalist: gap 0");
    assert_eq!(
        w.finalists.iter().map(|f| f.config_index).collect::<Vec<_>>(),
        [1, 0, 2].map(|i| task.finalist_indices[i])
    );
    assert_eq!((median(w.best.as_ref().unwrap()), w.finalists[1].remeasured_us), (6.0, 0.0));
    tracker.stop().await;
}

#[tokio::test]
async fn one_finalist_means_none_and_one_ok_trial_skips_finalizing() {
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    let mut worker = FakeWorker::register(&tracker, "box/0").await;

    // finalists 0 disables them, and so does 1 (one re-measured config decides nothing).
    // (Another workload each time: the second job would reuse the first one's measurements.)
    for (n, k) in [(0, 64), (1, 128)] {
        let off = submit(&mut tuning, job_with_finalists(vec![matmul(64, 64, k)], 4, 4, Some(n))).await;
        let reported = drive(&mut worker, &mut tuning, off).await;
        assert!(reported.iter().all(|t| !is_finalist(t)) && reported.len() == 4);
        let job = get_job(&mut tuning, off).await;
        assert_eq!((job.state, job.finalists), (pb::JobState::Done as i32, 0));
        assert!(job.workloads[0].finalists.is_empty() && !job.workloads[0].best.as_ref().unwrap().remeasure);
    }

    // Two workloads with the default: the first has a single ok trial and finishes at once; the
    // second re-measures its finalists, and the job is done only after that.
    let req = job_with_finalists(vec![matmul(16, 16, 16), matmul(128, 64, 64)], 3, 3, None);
    let id = submit(&mut tuning, req).await;
    let first_key = get_job(&mut tuning, id).await.workloads[0].workload_key.clone();
    let mut ok_first = 0;
    let (_, task) = tune_until_finalist(&mut worker, |t| {
        if t.workload_key == first_key {
            ok_first += 1;
            if ok_first == 1 { measure(t) } else { failed(pb::RecordStatus::CompileError) }
        } else {
            measure(t)
        }
    })
    .await;
    let job = get_job(&mut tuning, id).await;
    assert_eq!(job.state, pb::JobState::Running as i32);
    let states: Vec<&str> = job.workloads.iter().map(|w| w.state.as_str()).collect();
    assert_eq!(states, ["done", "finalizing"]);
    assert_eq!(job.workloads[0].status_counts.get("ok"), Some(&1));
    assert!(!job.workloads[0].best.as_ref().unwrap().remeasure);
    assert_eq!((task.workload_key.as_str(), task.finalist_configs.len()), (job.workloads[1].workload_key.as_str(), 3));
    assert!(worker.lease(4, 0).await.is_empty(), "one finalist task per workload");

    let measurements = measure_finalists(&task, measure);
    assert!(worker.report_finalists(&task, measurements).await.unwrap().stored);
    let job = get_job(&mut tuning, id).await;
    assert_eq!(job.state, pb::JobState::Done as i32);
    assert_eq!(job.workloads[1].state, "done");
    assert_eq!(job.workloads[1].finalists.len(), 3);
    tracker.stop().await;
}

#[tokio::test]
async fn a_finalist_task_that_keeps_losing_its_worker_finishes_the_job_without_finalists() {
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(short_leases(&dir, 2)).await;
    let mut tuning = tracker.tuning().await;
    let mut worker = FakeWorker::register(&tracker, "box/0").await;
    let req =
        pb::SubmitJobRequest { early_stop_trials: 2, ..job_with_finalists(vec![matmul(64, 64, 64)], 50, 1, None) };
    let id = submit(&mut tuning, req).await;
    // Early stopping ends the tuning after 3 trials (no improvement in the last 2).
    let mut n = 0;
    let (tuned, first) = tune_until_finalist(&mut worker, |_| {
        n += 1;
        ok(if n == 1 { 10.0 } else { 20.0 + f64::from(n) })
    })
    .await;
    assert_eq!((tuned.len(), first.finalist_configs.len()), (3, 3));
    // Leased twice, reported never.
    let second = worker.lease_some(1).await.remove(0);
    assert_eq!(second.task_id, first.task_id);
    let job = eventually("the job to end", || {
        let mut tuning = tuning.clone();
        async move { Some(get_job(&mut tuning, id).await).filter(is_terminal) }
    })
    .await;
    assert_eq!(job.state, pb::JobState::Done as i32, "losing finalists does not fail the job");
    assert!(job.error.contains("workload 0 (") && job.error.contains("finished without finalists"), "{}", job.error);
    let w = &job.workloads[0];
    assert_eq!((w.state.as_str(), w.trials_done, w.finalist_gap), ("early_stopped", 3, 0.0));
    assert!(w.finalists.is_empty());
    let best = w.best.as_ref().unwrap();
    assert!(!best.remeasure && median(best) == 10.0, "best is the fastest tuning record: {best:?}");
    assert_eq!(all_records(&mut tuning).await.len(), 3, "no device_lost records for finalists");

    // The last holder's late report is kept, but the workload has finished: it decides nothing.
    let late = worker.report_finalists(&first, vec![ok(1.0), ok(2.0), ok(3.0)]).await.unwrap();
    assert!(late.stored);
    let after = get_job(&mut tuning, id).await;
    assert_eq!(after.workloads, job.workloads);
    assert_eq!(all_records(&mut tuning).await.iter().filter(|r| r.remeasure).count(), 3);
    tracker.stop().await;
}

#[tokio::test]
async fn cancelling_cancels_the_finalist_task() {
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    let mut worker = FakeWorker::register(&tracker, "box/0").await;
    let id = submit(&mut tuning, job_with_finalists(vec![matmul(64, 64, 64)], 3, 3, None)).await;
    let (_, task) = tune_until_finalist(&mut worker, measure).await;

    let cancelled = tuning.cancel_job(pb::JobRef { job_id: id }).await.unwrap().into_inner();
    assert_eq!(cancelled.state, pb::JobState::Cancelled as i32);
    assert_eq!(cancelled.workloads[0].state, "cancelled");
    assert_eq!(worker.heartbeat(&[task.task_id]).await, vec![task.task_id], "the holder is told to drop it");
    assert!(worker.lease(4, 0).await.is_empty());
    // A re-measurement already under way is still recorded; the cancelled job does not change.
    assert!(worker.report_finalists(&task, measure_finalists(&task, measure)).await.unwrap().stored);
    let job = get_job(&mut tuning, id).await;
    assert_eq!((job.state, job.workloads[0].state.as_str()), (pb::JobState::Cancelled as i32, "cancelled"));
    assert!(job.workloads[0].finalists.is_empty());
    tracker.stop().await;
}

#[tokio::test]
async fn a_job_answered_from_the_store_still_remeasures_its_finalists() {
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    let mut worker = FakeWorker::register(&tracker, "box/0").await;
    let first = submit(&mut tuning, job_with_finalists(vec![matmul(64, 64, 64)], 4, 4, Some(1))).await;
    drive(&mut worker, &mut tuning, first).await;

    let second = submit(&mut tuning, job_with_finalists(vec![matmul(64, 64, 64)], 4, 4, Some(2))).await;
    let job = get_job(&mut tuning, second).await;
    let w = &job.workloads[0];
    assert_eq!((w.trials_done, w.reused, w.state.as_str()), (4, 4, "finalizing"));
    let task = worker.lease_some(4).await;
    assert_eq!(task.len(), 1);
    assert_eq!(task[0].finalist_configs.len(), 2, "the finalist task is measured, never reused");
    let reply = worker.report_finalists(&task[0], vec![ok(50.0), ok(40.0)]).await.unwrap();
    let job = get_job(&mut tuning, second).await;
    assert_eq!(job.state, pb::JobState::Done as i32);
    assert_eq!(job.workloads[0].best.as_ref().unwrap().id, reply.record_id);
    assert_eq!(job.workloads[0].reused, 4);
    tracker.stop().await;
}

#[tokio::test]
async fn flush_l2_flows_from_the_submission_to_every_task() {
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    let mut worker = FakeWorker::register(&tracker, "box/0").await;
    let plain = submit(&mut tuning, job_with_finalists(vec![matmul(64, 64, 64)], 2, 2, Some(1))).await;
    assert!(!get_job(&mut tuning, plain).await.flush_l2);
    let tasks = worker.lease_some(2).await;
    assert!(tasks.iter().all(|t| !t.flush_l2));
    for t in &tasks {
        worker.report(t, measure(t)).await.unwrap();
    }

    let req = pb::SubmitJobRequest {
        flush_l2: true,
        finalist_rounds: 5,
        ..job_with_finalists(vec![matmul(128, 64, 64)], 2, 2, None)
    };
    let id = submit(&mut tuning, req).await;
    let job = get_job(&mut tuning, id).await;
    assert!(job.flush_l2);
    assert_eq!((job.finalists, job.finalist_rounds), (3, 5));
    let (tuned, finalist) = tune_until_finalist(&mut worker, measure).await;
    assert!(tuned.iter().all(|t| t.flush_l2) && finalist.flush_l2);
    assert_eq!((finalist.rounds, finalist.finalist_configs.len()), (5, 2), "2 ok trials: 2 finalists");
    tracker.stop().await;
}

#[tokio::test]
async fn finalist_tasks_spread_over_the_online_workers_of_the_class() {
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    let mut tuner = FakeWorker::register(&tracker, "box/0").await;
    let mut first = FakeWorker::register(&tracker, "box/1").await;
    let mut second = FakeWorker::register(&tracker, "box/2").await;
    // Three workloads end their tuning on `tuner`, which then may take none of their finalists
    // (another online worker confirms a winner); all three are pending at once.
    let req = job_with_finalists(vec![matmul(64, 64, 64), matmul(128, 64, 64), matmul(64, 128, 64)], 3, 3, Some(2));
    let id = submit(&mut tuning, req).await;
    let deadline = std::time::Instant::now() + PATIENCE;
    while get_job(&mut tuning, id).await.workloads.iter().any(|w| w.state != "finalizing") {
        assert!(std::time::Instant::now() < deadline, "the workloads did not all reach their finalists");
        for task in tuner.lease(16, 100).await {
            assert!(!is_finalist(&task));
            assert!(tuner.report(&task, measure(&task)).await.unwrap().stored);
        }
    }

    // One wide lease takes two of them (FINALISTS_HELD), not all three: the third waits for the
    // other worker, and more of them for the first only once it reported one.
    let mine = first.lease(16, 0).await;
    assert_eq!((mine.len(), mine.iter().all(is_finalist)), (2, true), "{mine:?}");
    let theirs = second.lease(16, 0).await;
    assert_eq!((theirs.len(), theirs.iter().all(is_finalist)), (1, true), "{theirs:?}");
    assert!(first.lease(16, 0).await.is_empty() && second.lease(16, 0).await.is_empty());

    // Nothing lost: each is reported once, by its holder, and decides its workload.
    for (worker, tasks) in [(&mut first, mine), (&mut second, theirs)] {
        for task in tasks {
            assert!(worker.report_finalists(&task, measure_finalists(&task, measure)).await.unwrap().stored);
        }
    }
    let job = get_job(&mut tuning, id).await;
    assert_eq!(job.state, pb::JobState::Done as i32, "{}", job.error);
    assert!(job.workloads.iter().all(|w| w.state == "done" && w.finalists.len() == 2), "{:?}", job.workloads);
    tracker.stop().await;
}
