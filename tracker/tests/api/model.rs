//! The `model` tuner: it learns from the times workers report, never proposes a config twice,
//! resumes after a restart as if never stopped, and starts from other workloads' records
//! (transfer).

use std::collections::{HashMap, HashSet};

use tensortune_proto::pb;

use crate::harness::*;

/// 1706 valid configs on the sim class; `block_m` 16 is 236 of them (14%).
fn big() -> pb::Workload {
    matmul(256, 128, 256)
}

/// A fake kernel whose time depends mostly on one knob: 4x faster when `name` is `fast`, with a
/// small deterministic spread across configs.
fn fast_when(name: &'static str, fast: i64) -> impl FnMut(&pb::Task) -> pb::Measurement {
    move |t| {
        let base = if knob(t, name) == fast { 10.0 } else { 40.0 };
        ok(base * (1.0 + ((t.config_index * 7919) % 101) as f64 / 1000.0))
    }
}

fn model_job(workloads: Vec<pb::Workload>, trials: u32, batch_size: u32) -> pb::SubmitJobRequest {
    pb::SubmitJobRequest { tuner: "model".into(), ..job(workloads, trials, batch_size) }
}

/// Runs `req` on a fresh tracker with `measure_fn`; returns the job and its tuning tasks in the
/// order they were reported.
async fn run_alone(
    req: pb::SubmitJobRequest,
    measure_fn: impl FnMut(&pb::Task) -> pb::Measurement,
) -> (pb::Job, Vec<pb::Task>) {
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    let mut worker = FakeWorker::register(&tracker, "box/0").await;
    let id = submit(&mut tuning, req).await;
    let tasks = drive_with(&mut worker, &mut tuning, id, measure_fn).await;
    let job = get_job(&mut tuning, id).await;
    tracker.stop().await;
    (job, tasks)
}

/// How many of `tasks` after the first `skip` have `name` = `value`.
fn count_after(tasks: &[pb::Task], skip: usize, name: &str, value: i64) -> usize {
    tasks.iter().skip(skip).filter(|t| knob(t, name) == value).count()
}

#[tokio::test]
async fn the_model_learns_from_reported_times() {
    // 64 trials with 8 outstanding: the first 8 are proposed before any time is known.
    let (trials, batch) = (64, 8);
    let (job, model_16) = run_alone(model_job(vec![big()], trials, batch), fast_when("block_m", 16)).await;
    assert_eq!(job.state, pb::JobState::Done as i32);
    assert_eq!((job.tuner.as_str(), job.workloads[0].trials_done), ("model", trials));
    assert_eq!(model_16.len(), trials as usize);
    let configs: HashSet<u64> = model_16.iter().map(|t| t.config_index).collect();
    assert_eq!(configs.len(), model_16.len(), "the model proposed a config twice");
    // When its tuning ended the model said how likely an untried config is to beat the best by 2%.
    let chance = job.workloads[0].chance_better.expect("a model job's workload ends with a chance");
    assert!((0.0..=1.0).contains(&chance), "{chance}");
    let (_, model_128) = run_alone(model_job(vec![big()], trials, batch), fast_when("block_m", 128)).await;
    let (random_job, random) = run_alone(job_of(vec![big()], trials, batch), fast_when("block_m", 16)).await;
    assert_eq!(random_job.workloads[0].chance_better, None, "random search does not model the space");

    let skip = batch as usize;
    let (m16, m128, r16) = (
        count_after(&model_16, skip, "block_m", 16),
        count_after(&model_128, skip, "block_m", 16),
        count_after(&random, skip, "block_m", 16),
    );
    let later = model_16.len() - skip;
    // Random measures about 14% (8 of the 56) fast configs; the model, taught which knob value is
    // fast, mostly measures those, and it does so because of the times: told another value is
    // fast, it measures few of these.
    assert!(m16 >= 2 * r16 + 10, "model {m16} vs random {r16} of {later} later trials with block_m 16");
    assert!(m16 >= m128 + 15, "told 16 is fast {m16}, told 128 is fast {m128}");
    assert!(count_after(&model_128, skip, "block_m", 128) >= m128 + 10);
}

/// A `random` job like [`job`] (spelled out to contrast with [`model_job`]).
fn job_of(workloads: Vec<pb::Workload>, trials: u32, batch_size: u32) -> pb::SubmitJobRequest {
    pb::SubmitJobRequest { tuner: "random".into(), ..job(workloads, trials, batch_size) }
}

#[tokio::test]
async fn a_restarted_model_job_continues_as_if_never_stopped() {
    let req = || model_job(vec![matmul(128, 128, 128)], 24, 4);
    let times = || fast_when("block_n", 32);
    let (_, straight) = run_alone(req(), times()).await;
    let straight: Vec<u64> = straight.iter().map(|t| t.config_index).collect();

    // The same job, one task at a time, stopped after 10 reports with 4 tasks pending and 1 held.
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    let mut worker = FakeWorker::register(&tracker, "box/0").await;
    let id = submit(&mut tuning, req()).await;
    let mut measure_fn = times();
    let mut seen = Vec::new();
    while seen.len() < 10 {
        for t in worker.lease(1, 1000).await {
            assert!(worker.report(&t, measure_fn(&t)).await.unwrap().stored);
            seen.push(t.config_index);
        }
    }
    let held = worker.lease_some(1).await.remove(0);
    tracker.stop().await;

    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    let mut req = registration("box/0", sim_device());
    req.previous_id = worker.id;
    let mut worker = FakeWorker::register_with(&tracker, req).await;
    assert!(worker.report(&held, measure_fn(&held)).await.unwrap().stored);
    seen.push(held.config_index);
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !is_terminal(&get_job(&mut tuning, id).await) {
        assert!(tokio::time::Instant::now() < deadline, "job {id} did not finish");
        for t in worker.lease(1, 100).await {
            assert!(worker.report(&t, measure_fn(&t)).await.unwrap().stored);
            seen.push(t.config_index);
        }
    }
    let done = get_job(&mut tuning, id).await;
    assert_eq!((done.state, done.workloads[0].trials_done), (pb::JobState::Done as i32, 24));
    assert_eq!(seen.iter().collect::<HashSet<_>>().len(), 24, "a config was proposed twice across the restart");
    // Leased one at a time, oldest first, both runs measured the same configs in the same order:
    // the restarted tracker reloaded every outcome in the order it came and proposed the same.
    assert_eq!(seen, straight);
    tracker.stop().await;
}

#[tokio::test]
async fn transfer_starts_a_model_from_other_workloads_records() {
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    let mut worker = FakeWorker::register(&tracker, "box/0").await;

    // Records of another workload of the class, where a single-stage pipeline is fast (which the
    // analytic model would never guess).
    let first = submit(&mut tuning, job_of(vec![matmul(256, 64, 256)], 80, 16)).await;
    drive_with(&mut worker, &mut tuning, first, fast_when("stages", 1)).await;

    // The same model job on a new workload, with transfer (the default) and without.
    let with = submit(&mut tuning, model_job(vec![big()], 16, 8)).await;
    let without =
        submit(&mut tuning, pb::SubmitJobRequest { transfer: Some(false), ..model_job(vec![big()], 16, 8) }).await;
    let (with_job, without_job) = (get_job(&mut tuning, with).await, get_job(&mut tuning, without).await);
    assert_eq!((with_job.transfer, without_job.transfer), (true, false));

    // Their first batches, proposed before either measured anything.
    let mut first_batch: HashMap<u64, Vec<pb::Task>> = HashMap::new();
    for t in worker.lease(64, 1000).await {
        first_batch.entry(t.job_id).or_default().push(t);
    }
    let (a, b) = (&first_batch[&with], &first_batch[&without]);
    assert_eq!((a.len(), b.len()), (8, 8));
    let configs = |ts: &[pb::Task]| ts.iter().map(|t| t.config_index).collect::<HashSet<_>>();
    assert_ne!(configs(a), configs(b), "the prior changed nothing");
    // Without data of its own, the model with transfer takes turns between what the other
    // workload taught it and the analytic ranking: about half its first batch follows the prior.
    let fast = |ts: &[pb::Task]| ts.iter().filter(|t| knob(t, "stages") == 1).count();
    assert!(fast(a) >= 3 && fast(a) > fast(b) + 1, "with transfer {} of 8 fast, without {}", fast(a), fast(b));

    // Without records of other workloads, transfer changes nothing.
    let (_, alone_with) = run_alone(model_job(vec![big()], 8, 8), fast_when("block_m", 16)).await;
    let (_, alone_without) = run_alone(
        pb::SubmitJobRequest { transfer: Some(false), ..model_job(vec![big()], 8, 8) },
        fast_when("block_m", 16),
    )
    .await;
    assert_eq!(configs(&alone_with), configs(&alone_without));
    assert_eq!(configs(&alone_without), configs(b));
    tracker.stop().await;
}

#[tokio::test]
async fn the_next_batch_is_proposed_while_the_last_one_measures() {
    // Batches of 8: the first is leasable at once; the next once no more than half of it
    // (`tuner::lookahead`) is outstanding, so the worker compiles it while the rest measures.
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    let mut worker = FakeWorker::register(&tracker, "box/0").await;
    submit(&mut tuning, model_job(vec![big()], 40, 8)).await;
    let ahead = tensortune_search::tuner::lookahead(8);
    assert!((1..8).contains(&ahead), "a look-ahead of {ahead} of a batch of 8");
    let first = worker.lease_some(64).await;
    assert_eq!(first.len(), 8, "the first batch");
    for t in &first[..8 - ahead - 1] {
        worker.report(t, measure(t)).await.unwrap();
    }
    assert!(worker.lease(64, 300).await.is_empty(), "a second batch with {} of the first out", ahead + 1);
    worker.report(&first[8 - ahead - 1], measure(&first[8 - ahead - 1])).await.unwrap();
    let second = worker.lease_some(64).await;
    assert_eq!(second.len(), 8, "the next batch, while {ahead} of the first are out");
    let taken: HashSet<u64> = first.iter().chain(&second).map(|t| t.config_index).collect();
    assert_eq!(taken.len(), 16, "a config in flight was proposed again");
    // The rest of the first batch in: still more than the look-ahead out (the whole second).
    for t in &first[8 - ahead..] {
        worker.report(t, measure(t)).await.unwrap();
    }
    assert!(worker.lease(64, 300).await.is_empty(), "a third batch while the second is out");
    tracker.stop().await;
}
