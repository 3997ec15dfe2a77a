//! One search space per workload across templates: a job that names no template searches every
//! template that takes its workloads, tasks carry their own template, and workers get only the
//! tasks of templates they run.

use std::collections::HashMap;

use tensortune_kernels::gemm::WmmaGemm;
use tensortune_kernels::wgmma::WgmmaGemm;
use tensortune_kernels::{Config, Target, Template, Workload};
use tensortune_proto::pb;

use crate::harness::*;

/// A sim worker that runs both matmul templates.
fn both_templates(name: &str) -> pb::RegisterRequest {
    let mut req = registration(name, sim_device());
    req.templates.push(pb::TemplateRef { name: "wgmma_gemm".into(), version: WgmmaGemm.version() });
    req
}

/// The template a task's (or record's) name and version point at.
fn template(name: &str, version: u32) -> &'static dyn Template {
    let t = tensortune_kernels::registry::by_name(name).unwrap();
    assert_eq!(t.version(), version, "{name} at another version");
    t
}

/// Asserts that `config` (JSON) is config `index` of `name`'s space and valid for `workload` on sim.
fn assert_valid(name: &str, version: u32, workload: &Workload, config: &str, index: u64) {
    let t = template(name, version);
    let config = Config::from_json(config).unwrap();
    assert_eq!(t.space().index_of(&config).unwrap(), index, "{name}: {config}");
    t.check(workload, &config, &Target::sim()).unwrap_or_else(|e| panic!("{name} {config}: {e}"));
}

/// Leases with `worker` until it gets nothing for a while; returns what it got.
async fn lease_all(worker: &mut FakeWorker) -> Vec<pb::Task> {
    let mut out = Vec::new();
    loop {
        let got = worker.lease(64, 300).await;
        if got.is_empty() {
            return out;
        }
        out.extend(got);
    }
}

#[tokio::test]
async fn a_job_without_a_template_searches_both_and_each_worker_gets_only_its_templates() {
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    let mut wmma_only = FakeWorker::register(&tracker, "wmma-only").await;
    let mut both = FakeWorker::register_with(&tracker, both_templates("both")).await;
    let wl = matmul(256, 128, 256);
    let workload = Workload::try_from(&wl).unwrap();
    let req = pb::SubmitJobRequest { tuner: "grid".into(), ..job_with_finalists(vec![wl], 24, 24, Some(4)) };
    let id = submit(&mut tuning, req).await;

    let job = get_job(&mut tuning, id).await;
    assert_eq!((job.template.as_str(), job.template_version), ("wmma_gemm+wgmma_gemm", 0));
    let names: Vec<(&str, u32)> = job.templates.iter().map(|t| (t.name.as_str(), t.version)).collect();
    assert_eq!(names, [("wmma_gemm", WmmaGemm.version()), ("wgmma_gemm", WgmmaGemm.version())]);
    let space = WmmaGemm.valid_indices(&workload, &Target::sim()).unwrap().len()
        + WgmmaGemm.valid_indices(&workload, &Target::sim()).unwrap().len();
    assert_eq!(job.workloads[0].space_size, space as u64, "the space is the union");

    // The wmma-only worker takes every wmma_gemm task and nothing else; its results are in.
    let mine = lease_all(&mut wmma_only).await;
    assert_eq!(mine.len(), 12, "grid takes the templates in turns: 12 of the 24 are wmma_gemm");
    for task in &mine {
        assert_eq!((task.template.as_str(), task.template_version), ("wmma_gemm", WmmaGemm.version()));
        assert_valid(&task.template, task.template_version, &workload, &task.config, task.config_index);
    }
    // The first of each template is made the fastest, so the finalists hold both.
    let mut firsts: HashMap<String, u64> = HashMap::new();
    let mut time = |t: &pb::Task| {
        let first = *firsts.entry(t.template.clone()).or_insert(t.task_id);
        if first == t.task_id { if t.template == "wgmma_gemm" { 1.5 } else { 1.0 } } else { 10.0 + fake_us(t) }
    };
    for task in &mine {
        assert!(wmma_only.report(task, ok(time(task))).await.unwrap().stored);
    }

    // The tracker restarts: the wgmma_gemm tasks wait in the store and are leased again.
    tracker.stop().await;
    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    let mut req = registration("wmma-only", sim_device());
    req.previous_id = wmma_only.id;
    let mut wmma_only = FakeWorker::register_with(&tracker, req).await;
    let mut req = both_templates("both");
    req.previous_id = both.id;
    both = FakeWorker::register_with(&tracker, req).await;
    assert!(wmma_only.lease(64, 300).await.is_empty(), "the wmma-only worker got a task it cannot run");
    let theirs = lease_all(&mut both).await;
    assert_eq!(theirs.len(), 12);
    for task in &theirs {
        assert_eq!((task.template.as_str(), task.template_version), ("wgmma_gemm", WgmmaGemm.version()));
        assert_valid(&task.template, task.template_version, &workload, &task.config, task.config_index);
        assert!(both.report(task, ok(time(task))).await.unwrap().stored);
    }

    // The finalists are of both templates: only the worker that runs both gets their task, and
    // each finalist names its own template.
    assert!(wmma_only.lease(64, 300).await.is_empty(), "the wmma-only worker got a finalist of wgmma_gemm");
    let task = both.lease_some(1).await.remove(0);
    assert!(is_finalist(&task));
    let finalists: Vec<&str> = task.finalist_templates.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(&finalists[..2], ["wmma_gemm", "wgmma_gemm"], "the fastest two, fastest first");
    assert_eq!(finalists.len(), 4);
    for (i, t) in task.finalist_templates.iter().enumerate() {
        assert_valid(&t.name, t.version, &workload, &task.finalist_configs[i], task.finalist_indices[i]);
    }
    // Re-measured, the wgmma_gemm finalist wins.
    let remeasured: Vec<pb::Measurement> = (0..4).map(|i| ok(if i == 1 { 0.9 } else { 2.0 + i as f64 })).collect();
    let reply = both.report_finalists(&task, remeasured).await.unwrap();
    let job = get_job(&mut tuning, id).await;
    assert_eq!(job.state, pb::JobState::Done as i32, "{job:?}");
    let w = &job.workloads[0];
    let best = w.best.as_ref().unwrap();
    assert_eq!((best.id, best.template.as_str(), best.remeasure), (reply.record_id, "wgmma_gemm", true));
    assert_eq!(w.finalists[0].template, "wgmma_gemm");
    assert!(w.finalists.iter().any(|f| f.template == "wmma_gemm"));

    // Every record keeps its concrete template and a config valid for it; best answers across.
    let records = all_records(&mut tuning).await;
    assert_eq!(records.len(), 24 + 4);
    for r in &records {
        assert_valid(&r.template, r.template_version, &workload, &r.config, r.config_index);
    }
    assert_eq!(records.iter().filter(|r| r.template == "wgmma_gemm" && !r.remeasure).count(), 12);
    let query = pb::QueryBestRequest { workload: Some(matmul(256, 128, 256)), ..Default::default() };
    let best = tuning.query_best(query).await.unwrap().into_inner().best;
    assert_eq!((best[0].id, best[0].template.as_str()), (reply.record_id, "wgmma_gemm"));
    tracker.stop().await;
}

#[tokio::test]
async fn a_template_that_rejects_a_workload_contributes_nothing_and_a_named_one_narrows() {
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    let mut worker = FakeWorker::register_with(&tracker, both_templates("both")).await;
    // wgmma_gemm takes i8 in layout tn only: an i8 nn job searches wmma_gemm alone.
    let i8 = pb::Workload {
        op: Some(pb::workload::Op::Matmul(pb::Matmul {
            m: 128,
            n: 128,
            k: 128,
            layout: pb::Layout::Nn as i32,
            input: pb::Dtype::I8 as i32,
            ..Default::default()
        })),
    };
    let id = submit(&mut tuning, job(vec![i8], 6, 6)).await;
    let job_i8 = get_job(&mut tuning, id).await;
    assert_eq!((job_i8.template.as_str(), job_i8.template_version), ("wmma_gemm", WmmaGemm.version()));
    assert_eq!(job_i8.templates.len(), 1);
    let tasks = drive(&mut worker, &mut tuning, id).await;
    assert!(tasks.iter().all(|t| t.template == "wmma_gemm"));

    // --template narrows a job to one template, as before.
    let req = pb::SubmitJobRequest { template: "wgmma_gemm".into(), ..job(vec![matmul(256, 128, 256)], 6, 6) };
    let id = submit(&mut tuning, req).await;
    let named = get_job(&mut tuning, id).await;
    assert_eq!((named.template.as_str(), named.template_version), ("wgmma_gemm", WgmmaGemm.version()));
    let tasks = drive(&mut worker, &mut tuning, id).await;
    assert_eq!(tasks.len(), 6);
    assert!(tasks.iter().all(|t| t.template == "wgmma_gemm"));
    tracker.stop().await;
}
