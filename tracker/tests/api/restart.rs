//! A tracker stopped mid-job and started again on the same database resumes it.

use std::collections::HashSet;

use sqlx::SqlitePool;
use sqlx::migrate::Migrator;
use sqlx::sqlite::SqliteConnectOptions;
use tensortune_kernels::gemm::WmmaGemm;
use tensortune_kernels::{Target, Template, Workload};
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

#[tokio::test]
async fn a_tracker_restarted_while_finalizing_resumes_the_finalists() {
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    let mut worker = FakeWorker::register(&tracker, "box/0").await;
    let req = job_with_finalists(vec![matmul(64, 64, 64), matmul(128, 64, 64)], 3, 3, None);
    let id = submit(&mut tuning, req).await;
    // Both workloads finish tuning; the first finalist task is leased, the second still pending.
    let (tuned, held) = tune_until_finalist(&mut worker, measure).await;
    assert_eq!(tuned.len(), 6);
    let before = get_job(&mut tuning, id).await;
    assert_eq!(before.workloads.iter().map(|w| w.state.as_str()).collect::<Vec<_>>(), ["finalizing", "finalizing"]);
    tracker.stop().await;

    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    let after = get_job(&mut tuning, id).await;
    assert_eq!(after.state, pb::JobState::Running as i32);
    assert_eq!(after.workloads, before.workloads);
    let mut req = registration("box/0", sim_device());
    req.previous_id = worker.id;
    let mut again = FakeWorker::register_with(&tracker, req).await;
    assert!(again.report_finalists(&held, measure_finalists(&held, measure)).await.unwrap().stored);
    let pending = again.lease_some(4).await;
    assert_eq!(pending.len(), 1);
    assert!(is_finalist(&pending[0]) && pending[0].task_id != held.task_id && pending[0].rounds == 3);
    assert!(again.report_finalists(&pending[0], measure_finalists(&pending[0], measure)).await.unwrap().stored);

    let done = get_job(&mut tuning, id).await;
    assert_eq!(done.state, pb::JobState::Done as i32);
    for w in &done.workloads {
        assert_eq!((w.state.as_str(), w.trials_done, w.finalists.len()), ("done", 3, 3));
        assert!(w.best.as_ref().unwrap().remeasure);
    }
    assert_eq!(all_records(&mut tuning).await.len(), 12);
    tracker.stop().await;
}

#[tokio::test]
async fn a_database_of_the_previous_schema_is_upgraded_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("tracker.db");
    let pool = old_database(&db, INIT).await;
    let workload = Workload::try_from(&matmul(64, 64, 64)).unwrap();
    let target = Target::sim();
    let version = WmmaGemm.version();
    let valid = WmmaGemm.valid_indices(&workload, &target).unwrap();
    let configs: Vec<(u64, String)> =
        valid.iter().take(3).map(|&i| (i, WmmaGemm.space().config(i).unwrap().to_json())).collect();

    // What a previous tracker left mid-job: a grid job of 3 trials, 2 measured, 1 leased.
    insert_old_class_and_worker(&pool, &target, version).await;
    let far = i64::MAX / 4;
    let statements: Vec<sqlx::query::Query<'_, sqlx::Sqlite, _>> = vec![
        sqlx::query(
            "INSERT INTO jobs VALUES (1, 'running', 'wmma_gemm', ?1, 'grid', 'sim', 3, 3, 7, 10, 'old', 0, 0.0, '', 1, 1,
                                      NULL)",
        )
        .bind(version),
        sqlx::query(
            "INSERT INTO job_workloads VALUES (1, 0, ?1, ?2, 3, ?3, 3, 2, 0, 'running', NULL, 5.0, 1)",
        )
        .bind(workload.key())
        .bind(serde_json::to_string(&workload).unwrap())
        .bind(valid.len() as i64),
    ];
    for s in statements {
        s.execute(&pool).await.unwrap();
    }
    for (task, (index, config)) in configs.iter().enumerate() {
        let task = task as i64 + 1;
        let state = if task == 3 { "leased" } else { "pending" };
        sqlx::query(
            "INSERT INTO tasks (id, job_id, workload_idx, config_index, config, state, worker_id, lease_expires_ms,
                                attempts, created_ms, updated_ms)
             VALUES (?1, 1, 0, ?2, ?3, ?4, 1, ?5, 1, 1, 1)",
        )
        .bind(task)
        .bind(*index as i64)
        .bind(config)
        .bind(state)
        .bind(far)
        .execute(&pool)
        .await
        .unwrap();
    }
    for (task, median) in [(1i64, 5.0f64), (2, 6.0)] {
        record_old_task(&pool, &workload, task, &configs[task as usize - 1], "ok", median).await;
    }
    sqlx::query("UPDATE job_workloads SET best_record_id = 1").execute(&pool).await.unwrap();
    pool.close().await;

    // The new tracker migrates the file and resumes the job; the old job did not ask for finalists.
    let tracker = TestTracker::start(sqlite_config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    let job = get_job(&mut tuning, 1).await;
    assert_eq!(job.state, pb::JobState::Running as i32);
    assert_eq!((job.finalists, job.finalist_rounds, job.flush_l2), (0, 3, false));
    assert_eq!((job.tuner.as_str(), job.transfer, job.total_trials), ("grid", true, 0));
    let w = &job.workloads[0];
    assert_eq!(
        (w.state.as_str(), w.trials_done, w.best.as_ref().map(|r| (r.id, r.remeasure))),
        ("running", 2, Some((1, false)))
    );
    let records = all_records(&mut tuning).await;
    assert_eq!(
        records.iter().map(|r| (r.id, r.task_id, r.remeasure)).collect::<Vec<_>>(),
        [(1, 1, false), (2, 2, false)]
    );
    // Records and jobs from before energy and regimes: burst, time, energy unknown.
    assert_eq!((job.regime.as_str(), job.objective.as_str(), job.max_slowdown), ("burst", "time", 0.0));
    for r in &records {
        let m = r.measurement.as_ref().unwrap();
        assert_eq!((m.regime.as_str(), m.steady, m.energy_mj, m.power_w), ("burst", true, None, None));
    }
    let listed = tuning.list_workers(pb::ListWorkersRequest {}).await.unwrap().into_inner().workers;
    assert_eq!((listed[0].id, listed[0].reported, listed[0].reference_us, listed[0].flagged), (1, 2, 0.0, false));

    // Its worker survived: it registers again and reports the task it held.
    let mut req = registration("box/0", sim_device());
    req.previous_id = 1;
    let mut worker = FakeWorker::register_with(&tracker, req).await;
    assert_eq!(worker.id, 1);
    // A report names its lease (the task's first).
    let held = pb::Task { task_id: 3, config_index: configs[2].0, lease_serial: 1, ..Default::default() };
    assert!(worker.report(&held, ok(7.0)).await.unwrap().stored);
    let job = get_job(&mut tuning, 1).await;
    assert_eq!((job.state, job.workloads[0].trials_done), (pb::JobState::Done as i32, 3));
    assert!(job.workloads[0].finalists.is_empty());

    // New jobs on the upgraded file get everything: the same trials come from the store and the
    // finalists are re-measured.
    let req = pb::SubmitJobRequest { tuner: "grid".into(), ..job_with_finalists(vec![matmul(64, 64, 64)], 3, 3, None) };
    let id = submit(&mut tuning, req).await;
    assert_eq!(get_job(&mut tuning, id).await.workloads[0].reused, 3);
    let task = worker.lease_some(1).await.remove(0);
    assert_eq!(task.finalist_indices, [0, 1, 2].map(|i| configs[i].0));
    let reply = worker.report_finalists(&task, vec![ok(6.0), ok(5.5), ok(9.0)]).await.unwrap();
    assert!(reply.stored);
    assert!(!worker.report_finalists(&task, vec![ok(6.0), ok(5.5), ok(9.0)]).await.unwrap().stored);
    let job = get_job(&mut tuning, id).await;
    assert_eq!(job.workloads[0].best.as_ref().unwrap().id, reply.record_id);
    tracker.stop().await;

    // And a restart on the migrated file changes nothing.
    let tracker = TestTracker::start(sqlite_config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    assert_eq!(get_job(&mut tuning, id).await, job);
    assert_eq!(all_records(&mut tuning).await.len(), 6);
    tracker.stop().await;
}

/// The first migration: the schema of the first tracker.
const INIT: &[&str] = &["20261122000000_init.sql"];
/// The migrations up to finalists, drift and L2 flushing: the schema before model-guided search.
const FINALISTS: &[&str] = &["20261122000000_init.sql", "20261123000000_finalists_drift_flush.sql"];

/// A database at `path` as an earlier tracker left it: only `migrations` applied.
async fn old_database(path: &std::path::Path, migrations: &[&str]) -> SqlitePool {
    let dir = tempfile::tempdir().unwrap();
    for name in migrations {
        let from = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../migrations/sqlite").join(name);
        std::fs::copy(from, dir.path().join(name)).unwrap();
    }
    let options = SqliteConnectOptions::new().filename(path).create_if_missing(true).foreign_keys(true);
    let pool = SqlitePool::connect_with(options).await.unwrap();
    Migrator::new(dir.path()).await.unwrap().run(&pool).await.unwrap();
    pool
}

/// The `sim` device class and its one worker (box/0, running wmma_gemm at `version`) as the
/// earlier schemas stored them.
async fn insert_old_class_and_worker(pool: &SqlitePool, target: &Target, version: u32) {
    let device = serde_json::json!({
        "target": target, "memory_bytes": 0, "uuid": "", "driver_version": "", "cuda_version": "",
        "nvrtc_version": "", "sm_clock_mhz": 0, "mem_clock_mhz": 0,
    });
    sqlx::query("INSERT INTO device_classes VALUES ('sim', ?1, ?2, ?3, ?4, 1, 1)")
        .bind(&target.name)
        .bind(target.arch)
        .bind(target.sm_count)
        .bind(serde_json::to_string(target).unwrap())
        .execute(pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO workers (id, name, device_class, device, templates, registered_ms, last_seen_ms, state)
         VALUES (1, 'box/0', 'sim', ?1, ?2, 1, 1, 'online')",
    )
    .bind(device.to_string())
    .bind(format!("[\"wmma_gemm@{version}\"]"))
    .execute(pool)
    .await
    .unwrap();
}

/// Records the outcome of job 1's task `task` (config `(index, config)`) as the earlier schemas
/// did, by worker 1 on `sim`, and marks the task done.
async fn record_old_task(
    pool: &SqlitePool,
    workload: &Workload,
    task: i64,
    (index, config): &(u64, String),
    status: &str,
    median_us: f64,
) {
    let provenance = serde_json::json!({
        "worker_name": "box/0", "gpu_name": "sim", "gpu_uuid": "", "driver_version": "", "cuda_version": "",
        "nvrtc_version": "", "sm_clock_mhz": 0,
    });
    sqlx::query(
        "INSERT INTO records (id, task_id, job_id, worker_id, workload_key, workload, template, template_version,
                              config, config_index, device_class, status, error, compile_ms, measure_ms, samples,
                              median_us, spread, batch, baseline_kind, registers, smem_bytes, cache_hit,
                              provenance, tflops, speedup, created_ms)
         VALUES (?1, ?1, 1, 1, ?2, ?3, 'wmma_gemm', ?4, ?5, ?6, 'sim', ?7, '', 1.0, 1.0, '[]', ?8, 0.0, 1, '',
                 0, 0, 0, ?9, 1.0, 0.0, 1)",
    )
    .bind(task)
    .bind(workload.key())
    .bind(serde_json::to_string(workload).unwrap())
    .bind(WmmaGemm.version())
    .bind(config)
    .bind(*index as i64)
    .bind(status)
    .bind(median_us)
    .bind(provenance.to_string())
    .execute(pool)
    .await
    .unwrap();
    sqlx::query("UPDATE tasks SET state = 'done', record_id = ?1, lease_expires_ms = NULL WHERE id = ?1")
        .bind(task)
        .execute(pool)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_database_of_the_schema_before_model_search_is_upgraded_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("tracker.db");
    let pool = old_database(&db, FINALISTS).await;
    let workload = Workload::try_from(&matmul(64, 64, 64)).unwrap();
    let target = Target::sim();
    let version = WmmaGemm.version();
    let valid = WmmaGemm.valid_indices(&workload, &target).unwrap();
    let configs: Vec<(u64, String)> =
        valid.iter().take(4).map(|&i| (i, WmmaGemm.space().config(i).unwrap().to_json())).collect();

    // What the previous tracker left mid-job: a random job of 4 trials with 3 finalists, 3
    // measured (one of them failed), 1 leased.
    insert_old_class_and_worker(&pool, &target, version).await;
    let statements: Vec<sqlx::query::Query<'_, sqlx::Sqlite, _>> = vec![
        sqlx::query(
            "INSERT INTO jobs (id, state, template, template_version, tuner, device_class, trials, batch_size, seed,
                               samples, label, early_stop_trials, early_stop_margin, created_ms, updated_ms,
                               finalists, finalist_rounds, flush_l2)
             VALUES (1, 'running', 'wmma_gemm', ?1, 'random', 'sim', 4, 4, 7, 10, 'old', 0, 0.0, 1, 1, 3, 2, 1)",
        )
        .bind(version),
        sqlx::query(
            "INSERT INTO job_workloads (job_id, idx, workload_key, workload, trials_target, space_size, proposed,
                                        done, state, stall_best_us, stall_since)
             VALUES (1, 0, ?1, ?2, 4, ?3, 4, 3, 'running', 5.0, 1)",
        )
        .bind(workload.key())
        .bind(serde_json::to_string(&workload).unwrap())
        .bind(valid.len() as i64),
    ];
    for s in statements {
        s.execute(&pool).await.unwrap();
    }
    let far = i64::MAX / 4;
    for (task, (index, config)) in configs.iter().enumerate() {
        let task = task as i64 + 1;
        sqlx::query(
            "INSERT INTO tasks (id, job_id, workload_idx, config_index, config, state, worker_id, lease_expires_ms,
                                attempts, created_ms, updated_ms)
             VALUES (?1, 1, 0, ?2, ?3, 'leased', 1, ?4, 1, 1, ?1)",
        )
        .bind(task)
        .bind(*index as i64)
        .bind(config)
        .bind(far)
        .execute(&pool)
        .await
        .unwrap();
    }
    for (task, status, median) in [(1i64, "ok", 5.0f64), (2, "compile_error", 0.0), (3, "ok", 6.0)] {
        record_old_task(&pool, &workload, task, &configs[task as usize - 1], status, median).await;
    }
    sqlx::query("UPDATE job_workloads SET best_record_id = 1").execute(&pool).await.unwrap();
    pool.close().await;

    // The new tracker migrates the file and resumes the job, with the settings it had and the new
    // ones at their defaults (transfer on, which a random job ignores; no job-wide budget).
    let tracker = TestTracker::start(sqlite_config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    let job = get_job(&mut tuning, 1).await;
    assert_eq!((job.state, job.tuner.as_str()), (pb::JobState::Running as i32, "random"));
    assert_eq!((job.finalists, job.finalist_rounds, job.flush_l2), (3, 2, true));
    assert_eq!((job.transfer, job.total_trials), (true, 0));
    let w = &job.workloads[0];
    assert_eq!((w.state.as_str(), w.trials_done, w.best.as_ref().map(|r| r.id)), ("running", 3, Some(1)));

    // Its worker survived: it reports the task it held, and the finalists are re-measured.
    let mut req = registration("box/0", sim_device());
    req.previous_id = 1;
    let mut worker = FakeWorker::register_with(&tracker, req).await;
    let held = pb::Task { task_id: 4, config_index: configs[3].0, lease_serial: 1, ..Default::default() };
    assert!(worker.report(&held, ok(7.0)).await.unwrap().stored);
    let finalist = worker.lease_some(1).await.remove(0);
    assert_eq!(finalist.finalist_indices, [0, 2, 3].map(|i| configs[i].0));
    assert!(worker.report_finalists(&finalist, vec![ok(5.0), ok(6.0), ok(7.0)]).await.unwrap().stored);
    let job = get_job(&mut tuning, 1).await;
    assert_eq!((job.state, job.workloads[0].trials_done), (pb::JobState::Done as i32, 4));

    // The upgraded file takes model jobs with a budget; this one's prior holds the old records.
    let req = pb::SubmitJobRequest {
        tuner: "model".into(),
        total_trials: 12,
        ..job_with_finalists(vec![matmul(128, 64, 64), matmul(64, 64, 128)], 8, 4, None)
    };
    let id = submit(&mut tuning, req).await;
    let tasks = drive(&mut worker, &mut tuning, id).await;
    let job = get_job(&mut tuning, id).await;
    assert_eq!(
        (job.state, job.tuner.as_str(), job.transfer, job.total_trials),
        (pb::JobState::Done as i32, "model", true, 12)
    );
    assert_eq!(job.workloads.iter().map(|w| w.trials_done).sum::<u32>(), 12);
    let tuning_tasks: HashSet<_> =
        tasks.iter().filter(|t| !is_finalist(t)).map(|t| (t.workload_key.clone(), t.config_index)).collect();
    assert_eq!(tuning_tasks.len(), 12);
    tracker.stop().await;

    // And a restart on the migrated file changes nothing.
    let tracker = TestTracker::start(sqlite_config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    assert_eq!(get_job(&mut tuning, id).await, job);
    tracker.stop().await;
}

/// Every migration before tasks had their own template: the schema before template unions.
const MODEL: &[&str] = &[
    "20261122000000_init.sql",
    "20261123000000_finalists_drift_flush.sql",
    "20261124000000_model_transfer_budget.sql",
];

#[tokio::test]
async fn a_database_of_the_schema_before_template_unions_is_upgraded_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("tracker.db");
    let pool = old_database(&db, MODEL).await;
    let target = Target::sim();
    let version = WmmaGemm.version();
    let workloads = [matmul(64, 64, 64), matmul(128, 64, 64)].map(|w| Workload::try_from(&w).unwrap());
    let configs: Vec<Vec<(u64, String)>> = workloads
        .iter()
        .map(|w| {
            let valid = WmmaGemm.valid_indices(w, &target).unwrap();
            valid.iter().take(2).map(|&i| (i, WmmaGemm.space().config(i).unwrap().to_json())).collect()
        })
        .collect();

    // What the previous tracker left: a grid job of 2 trials per workload with 2 finalists;
    // workload 0 has one trial measured and one pending, workload 1 is finalizing with its
    // finalist task pending.
    insert_old_class_and_worker(&pool, &target, version).await;
    let statements: Vec<sqlx::query::Query<'_, sqlx::Sqlite, _>> = vec![
        sqlx::query(
            "INSERT INTO jobs (id, state, template, template_version, tuner, device_class, trials, batch_size, seed,
                               samples, label, early_stop_trials, early_stop_margin, created_ms, updated_ms,
                               finalists, finalist_rounds, flush_l2, transfer, total_trials)
             VALUES (1, 'running', 'wmma_gemm', ?1, 'grid', 'sim', 2, 2, 7, 10, 'old', 0, 0.0, 1, 1, 2, 2, 0, 1, 0)",
        )
        .bind(version),
    ];
    for s in statements {
        s.execute(&pool).await.unwrap();
    }
    for (idx, (w, state, done)) in [(&workloads[0], "running", 1), (&workloads[1], "finalizing", 2)].iter().enumerate()
    {
        let end = if *state == "finalizing" { Some("done") } else { None };
        sqlx::query(
            "INSERT INTO job_workloads (job_id, idx, workload_key, workload, trials_target, space_size, proposed,
                                        done, state, end_state)
             VALUES (1, ?1, ?2, ?3, 2, 100, 2, ?4, ?5, ?6)",
        )
        .bind(idx as i64)
        .bind(w.key())
        .bind(serde_json::to_string(w).unwrap())
        .bind(*done)
        .bind(*state)
        .bind(end)
        .execute(&pool)
        .await
        .unwrap();
    }
    // Tasks 1 and 2 of workload 0 (1 measured), 3 and 4 of workload 1 (both measured).
    for (task, idx, (index, config)) in
        [(1i64, 0i64, &configs[0][0]), (2, 0, &configs[0][1]), (3, 1, &configs[1][0]), (4, 1, &configs[1][1])]
    {
        sqlx::query(
            "INSERT INTO tasks (id, job_id, workload_idx, config_index, config, state, attempts, created_ms, updated_ms)
             VALUES (?1, 1, ?2, ?3, ?4, 'pending', 0, 1, 1)",
        )
        .bind(task)
        .bind(idx)
        .bind(*index as i64)
        .bind(config)
        .execute(&pool)
        .await
        .unwrap();
    }
    record_old_task(&pool, &workloads[0], 1, &configs[0][0], "ok", 5.0).await;
    record_old_task(&pool, &workloads[1], 3, &configs[1][0], "ok", 7.0).await;
    record_old_task(&pool, &workloads[1], 4, &configs[1][1], "ok", 6.0).await;
    let finalists = serde_json::json!([
        {"config_index": configs[1][1].0, "config": configs[1][1].1, "record_id": 4, "tuned_us": 6.0},
        {"config_index": configs[1][0].0, "config": configs[1][0].1, "record_id": 3, "tuned_us": 7.0},
    ]);
    sqlx::query(
        "INSERT INTO tasks (id, job_id, workload_idx, kind, config_index, config, finalists, state, created_ms,
                            updated_ms)
         VALUES (5, 1, 1, 'finalist', -1, '', ?1, 'pending', 1, 1)",
    )
    .bind(finalists.to_string())
    .execute(&pool)
    .await
    .unwrap();
    pool.close().await;

    // The new tracker migrates the file: the job searches its one template, and its tasks are of it.
    let tracker = TestTracker::start(sqlite_config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    let old = get_job(&mut tuning, 1).await;
    assert_eq!((old.template.as_str(), old.template_version), ("wmma_gemm", version));
    assert_eq!(old.templates, [pb::TemplateRef { name: "wmma_gemm".into(), version }]);
    let mut req = registration("box/0", sim_device());
    req.previous_id = 1;
    let mut worker = FakeWorker::register_with(&tracker, req).await;
    let mut tasks = worker.lease(8, 1000).await;
    tasks.sort_by_key(|t| t.task_id);
    assert_eq!(tasks.iter().map(|t| t.task_id).collect::<Vec<_>>(), [2, 5]);
    let (tuning_task, finalist) = (&tasks[0], &tasks[1]);
    assert_eq!((tuning_task.template.as_str(), tuning_task.template_version), ("wmma_gemm", version));
    assert_eq!((tuning_task.config_index, tuning_task.config.as_str()), (configs[0][1].0, configs[0][1].1.as_str()));
    // The finalist list kept its order and got the job's template in every entry.
    assert_eq!(finalist.finalist_indices, [configs[1][1].0, configs[1][0].0]);
    assert_eq!(finalist.finalist_templates, vec![pb::TemplateRef { name: "wmma_gemm".into(), version }; 2]);
    assert_eq!(finalist.template, "wmma_gemm");
    assert!(worker.report(tuning_task, ok(4.0)).await.unwrap().stored);
    let reply = worker.report_finalists(finalist, vec![ok(6.5), ok(6.0)]).await.unwrap();
    let old = get_job(&mut tuning, 1).await;
    assert_eq!(
        old.workloads[1].best.as_ref().map(|b| (b.id, b.template.as_str())),
        Some((reply.record_id, "wmma_gemm"))
    );
    assert_eq!(old.workloads[1].finalists[0].template, "wmma_gemm");
    // Workload 0 finished its trials and re-measures its finalists; then the job is done.
    let task = worker.lease_some(1).await.remove(0);
    assert_eq!(task.finalist_templates.len(), 2);
    assert!(worker.report_finalists(&task, vec![ok(4.0), ok(5.0)]).await.unwrap().stored);
    assert_eq!(get_job(&mut tuning, 1).await.state, pb::JobState::Done as i32);

    // New jobs on the upgraded file search the union (the worker runs wmma_gemm only: the job
    // searches what it can run).
    let id = submit(&mut tuning, job(vec![matmul(64, 64, 64)], 2, 2)).await;
    assert_eq!(get_job(&mut tuning, id).await.template, "wmma_gemm");
    tracker.stop().await;
}

/// Leases held when the tracker stopped run a whole lease from the moment the restarted tracker
/// serves, however long it spent rebuilding searches first: workers still reconnecting keep their
/// work instead of seeing it expire and measured again elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_held_across_a_restart_run_from_when_serving_starts() {
    let dir = tempfile::tempdir().unwrap();
    let lease = std::time::Duration::from_secs(60);
    let cfg = || tensortune_tracker::TrackerConfig { lease, heartbeat: lease / 4, ..config(&dir) };
    let tracker = TestTracker::start(cfg()).await;
    let mut tuning = tracker.tuning().await;
    let mut worker = FakeWorker::register(&tracker, "box/0").await;
    // Workloads with large spaces: the restarted tracker takes a while to enumerate them again.
    let workloads = (0..16).map(|i| matmul(2048 + 64 * i, 2048, 4096)).collect();
    submit(&mut tuning, job(workloads, 200, 4)).await;
    let held = worker.lease(4, 1000).await;
    assert_eq!(held.len(), 4);
    tracker.stop().await;

    let clock = || i64::try_from(std::time::UNIX_EPOCH.elapsed().unwrap().as_millis()).unwrap();
    let started = clock();
    let tracker = TestTracker::start(cfg()).await;
    let mut tuning = tracker.tuning().await;
    all_records(&mut tuning).await;
    // The tracker answered, so it was serving no later than this.
    let serving = clock();
    let leased = "SELECT lease_expires_ms FROM tasks WHERE state = 'leased'";
    let deadlines: Vec<i64> = if on_postgres() {
        let pool = sqlx::PgPool::connect(&cfg().db.to_string_lossy()).await.unwrap();
        let deadlines = sqlx::query_scalar(leased).fetch_all(&pool).await.unwrap();
        pool.close().await;
        deadlines
    } else {
        let options = SqliteConnectOptions::new().filename(dir.path().join("tracker.db")).read_only(true);
        let pool = SqlitePool::connect_with(options).await.unwrap();
        let deadlines = sqlx::query_scalar(leased).fetch_all(&pool).await.unwrap();
        pool.close().await;
        deadlines
    };
    assert_eq!(deadlines.len(), held.len());
    // A first answer comes within a few milliseconds of serving; resuming took far longer.
    let slack = 150;
    let lease_ms = i64::try_from(lease.as_millis()).unwrap();
    for deadline in deadlines {
        assert!(
            deadline + slack >= serving + lease_ms,
            "a lease runs out {} ms after serving started instead of {lease_ms} (resume took {} ms)",
            deadline - serving,
            serving - started
        );
    }
    tracker.stop().await;
}
