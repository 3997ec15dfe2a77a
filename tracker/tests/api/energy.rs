//! Energy and the clock regime (issue 39): records carry energy, power, clock and temperature;
//! a job tunes in a regime and for an objective; `best` answers per regime; bad values are
//! refused naming the field.

use tensortune_proto::pb;
use tonic::Code;

use crate::harness::*;

/// An ok measurement of `us` per launch at `watts`, in `regime`.
fn with_energy(us: f64, watts: f64, regime: &str) -> pb::Measurement {
    pb::Measurement {
        energy_mj: Some(watts * us * 1e-3),
        power_w: Some(watts),
        mean_clock_mhz: Some(1755.0),
        temperature_c: Some(61.0),
        regime: regime.into(),
        settle_ms: if regime == "sustained" { 4200.0 } else { 0.0 },
        steady: true,
        baseline_energy_mj: Some(700.0 * us * 1.5e-3),
        ..ok(us)
    }
}

/// The power a config draws: 300 to 940 W, scattered over the configs independently of their
/// time (`fake_us`), so that the least energy is not the fastest.
fn watts(task: &pb::Task) -> f64 {
    300.0 + 40.0 * ((task.config_index * 7) % 17) as f64
}

fn m(r: &pb::Record) -> &pb::Measurement {
    r.measurement.as_ref().unwrap()
}

#[tokio::test]
async fn records_carry_energy_and_the_regime_through_job_best_and_export() {
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    let mut worker = FakeWorker::register(&tracker, "box/0").await;
    let req = pb::SubmitJobRequest { regime: "sustained".into(), ..job(vec![matmul(256, 128, 256)], 4, 4) };
    let id = submit(&mut tuning, req).await;
    let submitted = get_job(&mut tuning, id).await;
    assert_eq!(
        (submitted.regime.as_str(), submitted.objective.as_str(), submitted.max_slowdown),
        ("sustained", "time", 0.0)
    );

    let tasks = drive_with(&mut worker, &mut tuning, id, |t| {
        assert_eq!((t.regime.as_str(), t.no_energy), ("sustained", false), "every task says the job's regime");
        with_energy(fake_us(t), watts(t), "sustained")
    })
    .await;
    assert_eq!(tasks.len(), 4);
    let records = export(&mut tuning, pb::ExportRecordsRequest { job_id: id, ..Default::default() }).await;
    assert_eq!(records.len(), 4);
    for r in &records {
        let task = tasks.iter().find(|t| t.task_id == r.task_id).unwrap();
        let (us, w) = (fake_us(task), watts(task));
        let m = m(r);
        assert!((m.energy_mj.unwrap() - w * us * 1e-3).abs() < 1e-9, "{m:?}");
        assert_eq!((m.power_w, m.mean_clock_mhz, m.temperature_c), (Some(w), Some(1755.0), Some(61.0)));
        assert_eq!((m.regime.as_str(), m.settle_ms, m.steady), ("sustained", 4200.0, true));
        assert!(m.baseline_energy_mj.is_some());
    }
    let best = get_job(&mut tuning, id).await.workloads[0].best.clone().unwrap();
    assert_eq!(m(&best).regime, "sustained");
    assert!(m(&best).energy_mj.is_some());

    // `best` answers per regime: these records are sustained, so a burst query finds none.
    let query = |regime: &str| pb::QueryBestRequest {
        workload: Some(matmul(256, 128, 256)),
        regime: regime.into(),
        ..Default::default()
    };
    let sustained = tuning.query_best(query("sustained")).await.unwrap().into_inner().best;
    assert_eq!(sustained.iter().map(|r| r.id).collect::<Vec<_>>(), [best.id]);
    assert!(tuning.query_best(query("burst")).await.unwrap().into_inner().best.is_empty());
    assert!(tuning.query_best(query("")).await.unwrap().into_inner().best.is_empty(), "empty means burst");
    let (code_, message) = code(tuning.query_best(query("hot")).await);
    assert_eq!(code_, Code::InvalidArgument);
    assert!(message.contains("regime") && message.contains("burst or sustained"), "{message}");

    // A burst job of the same workload does not reuse the sustained records: it measures (and,
    // asked to, its tasks tell the worker to skip the energy window).
    let burst = pb::SubmitJobRequest { no_energy: true, ..job(vec![matmul(256, 128, 256)], 4, 4) };
    let burst = submit(&mut tuning, burst).await;
    let submitted = get_job(&mut tuning, burst).await;
    assert_eq!((submitted.workloads[0].reused, submitted.no_energy, submitted.regime.as_str()), (0, true, "burst"));
    drive_with(&mut worker, &mut tuning, burst, |t| {
        assert_eq!((t.regime.as_str(), t.no_energy), ("burst", true));
        ok(fake_us(t) * 0.9)
    })
    .await;
    let answered = tuning.query_best(query("burst")).await.unwrap().into_inner().best;
    assert_eq!(answered.len(), 1);
    let b = m(&answered[0]);
    // A worker that did not read energy: unknown stays unknown; its regime is burst.
    assert_eq!((b.energy_mj, b.power_w, b.regime.as_str(), b.steady), (None, None, "burst", true));
    tracker.stop().await;
}

#[tokio::test]
async fn the_energy_objective_and_the_max_slowdown_pick_their_winners() {
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    let mut worker = FakeWorker::register(&tracker, "box/0").await;
    let workload = || vec![matmul(256, 128, 256)];
    let measured = |t: &pb::Task| with_energy(fake_us(t), watts(t), "burst");

    // The time objective: the fastest trial.
    let time = submit(&mut tuning, pb::SubmitJobRequest { tuner: "grid".into(), ..job(workload(), 12, 12) }).await;
    let tasks = drive_with(&mut worker, &mut tuning, time, measured).await;
    let fastest = tasks.iter().min_by(|a, b| fake_us(a).total_cmp(&fake_us(b))).unwrap();
    let least = tasks.iter().min_by(|a, b| (fake_us(a) * watts(a)).total_cmp(&(fake_us(b) * watts(b)))).unwrap();
    assert_ne!(fastest.config_index, least.config_index, "the test's configs must disagree");
    let best = |job: &pb::Job| job.workloads[0].best.clone().unwrap();
    assert_eq!(best(&get_job(&mut tuning, time).await).config_index, fastest.config_index);

    // The energy objective over the same configs (measured again: a new regime of the search,
    // records reused from the store) picks the least energy per launch.
    let energy = pb::SubmitJobRequest { tuner: "grid".into(), objective: "energy".into(), ..job(workload(), 12, 12) };
    let energy = submit(&mut tuning, energy).await;
    drive_with(&mut worker, &mut tuning, energy, measured).await;
    let done = get_job(&mut tuning, energy).await;
    assert_eq!(done.objective, "energy");
    assert_eq!(best(&done).config_index, least.config_index);

    // EDP: energy x time.
    let edp = pb::SubmitJobRequest { tuner: "grid".into(), objective: "edp".into(), ..job(workload(), 12, 12) };
    let edp = submit(&mut tuning, edp).await;
    drive_with(&mut worker, &mut tuning, edp, measured).await;
    let least_edp = tasks
        .iter()
        .min_by(|a, b| (fake_us(a).powi(2) * watts(a)).total_cmp(&(fake_us(b).powi(2) * watts(b))))
        .unwrap();
    assert_eq!(best(&get_job(&mut tuning, edp).await).config_index, least_edp.config_index);
    assert_eq!(get_job(&mut tuning, edp).await.workloads[0].reused, 12, "the records came from the store");

    // Time with a max slowdown just wide enough to take in the least-energy config: it wins
    // over the fastest.
    let slowdown = fake_us(least) / fake_us(fastest) - 1.0 + 1e-3;
    assert!(slowdown <= 1.0, "the test's least-energy config is {slowdown} slower");
    let slow = pb::SubmitJobRequest { tuner: "grid".into(), max_slowdown: slowdown, ..job(workload(), 12, 12) };
    let slow = submit(&mut tuning, slow).await;
    drive_with(&mut worker, &mut tuning, slow, measured).await;
    let done = get_job(&mut tuning, slow).await;
    assert_eq!(done.max_slowdown, slowdown);
    assert_eq!(best(&done).config_index, least.config_index);
    tracker.stop().await;
}

#[tokio::test]
async fn finalists_follow_the_objective() {
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    let mut worker = FakeWorker::register(&tracker, "box/0").await;
    let req = pb::SubmitJobRequest {
        tuner: "grid".into(),
        objective: "energy".into(),
        ..job_with_finalists(vec![matmul(256, 128, 256)], 8, 8, Some(3))
    };
    let id = submit(&mut tuning, req).await;
    let (tuned, task) = tune_until_finalist(&mut worker, |t| with_energy(fake_us(t), watts(t), "burst")).await;
    let mut by_energy = tuned.clone();
    by_energy.sort_by(|a, b| (fake_us(a) * watts(a)).total_cmp(&(fake_us(b) * watts(b))));
    let least: Vec<u64> = by_energy.iter().take(3).map(|t| t.config_index).collect();
    assert_eq!(task.finalist_indices, least, "the finalists are the three of least energy");
    // Re-measured: the second uses least now.
    let remeasured = [(10.0, 800.0), (10.0, 500.0), (10.0, 900.0)];
    let reply = worker
        .report_finalists(&task, remeasured.iter().map(|(us, w)| with_energy(*us, *w, "burst")).collect())
        .await
        .unwrap();
    let job = get_job(&mut tuning, id).await;
    let best = job.workloads[0].best.clone().unwrap();
    assert_eq!((best.id, best.config_index), (reply.record_id, least[1]));
    tracker.stop().await;
}

#[tokio::test]
async fn bad_regimes_objectives_slowdowns_and_energies_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    let base = || job(vec![matmul(64, 64, 64)], 2, 2);
    for (req, field, hint) in [
        (pb::SubmitJobRequest { regime: "hot".into(), ..base() }, "regime", "burst or sustained"),
        (pb::SubmitJobRequest { objective: "power".into(), ..base() }, "objective", "time, energy or edp"),
        (pb::SubmitJobRequest { max_slowdown: 1.5, ..base() }, "max_slowdown", "0 ..= 1"),
        (pb::SubmitJobRequest { max_slowdown: -0.01, ..base() }, "max_slowdown", "0 ..= 1"),
        (pb::SubmitJobRequest { max_slowdown: f64::NAN, ..base() }, "max_slowdown", "0 ..= 1"),
    ] {
        let (c, message) = code(tuning.submit_job(req).await);
        assert_eq!(c, Code::InvalidArgument, "{message}");
        assert!(message.contains(field) && message.contains(hint), "{message}");
    }
    let mut worker = FakeWorker::register(&tracker, "box/0").await;
    submit(&mut tuning, base()).await;
    let task = worker.lease_some(1).await.remove(0);
    for (bad, field) in [
        (pb::Measurement { energy_mj: Some(0.0), ..ok(5.0) }, "measurement.energy_mj"),
        (pb::Measurement { power_w: Some(f64::INFINITY), ..ok(5.0) }, "measurement.power_w"),
        (pb::Measurement { temperature_c: Some(900.0), ..ok(5.0) }, "measurement.temperature_c"),
        (pb::Measurement { regime: "hot".into(), ..ok(5.0) }, "measurement.regime"),
        (pb::Measurement { settle_ms: -1.0, ..ok(5.0) }, "measurement.settle_ms"),
    ] {
        let (c, message) = code(worker.report(&task, bad).await);
        assert_eq!(c, Code::InvalidArgument, "{message}");
        assert!(message.contains(field), "{field}: {message}");
    }
    assert!(worker.report(&task, with_energy(5.0, 600.0, "burst")).await.unwrap().stored);
    tracker.stop().await;
}
