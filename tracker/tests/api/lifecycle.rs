//! Submit, dispatch, report, finish, and what the tracker says about it afterwards.

use tensortune_proto::pb;

use crate::harness::*;

#[tokio::test]
async fn a_job_runs_to_done_and_query_best_returns_the_fastest() {
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    let mut worker = FakeWorker::register(&tracker, "box/0").await;

    let submitted = tuning.submit_job(job(vec![matmul(256, 128, 256)], 12, 4)).await.unwrap().into_inner();
    assert_eq!(submitted.device_class, "sim");
    let id = submitted.job_id;
    let job0 = get_job(&mut tuning, id).await;
    assert_eq!(job0.state, pb::JobState::Queued as i32);
    assert_eq!(job0.workloads[0].trials_target, 12);
    assert!(job0.workloads[0].space_size >= 12, "space {}", job0.workloads[0].space_size);

    // Every fourth config fails to compile; the rest are ok.
    let reported = drive_with(&mut worker, &mut tuning, id, |t| {
        if t.config_index % 4 == 0 { failed(pb::RecordStatus::CompileError) } else { measure(t) }
    })
    .await;
    assert_eq!(reported.len(), 12);
    let configs: std::collections::HashSet<_> = reported.iter().map(|t| t.config_index).collect();
    assert_eq!(configs.len(), 12, "a config was proposed twice");

    let done = get_job(&mut tuning, id).await;
    assert_eq!(done.state, pb::JobState::Done as i32);
    assert!(done.finished_ms > 0);
    let w = &done.workloads[0];
    assert_eq!((w.trials_done, w.reused, w.state.as_str()), (12, 0, "done"));
    let failures = reported.iter().filter(|t| t.config_index % 4 == 0).count() as u32;
    assert_eq!(w.status_counts.get("compile_error").copied().unwrap_or(0), failures);
    assert_eq!(w.status_counts.get("ok").copied().unwrap_or(0), 12 - failures);

    let fastest =
        reported.iter().filter(|t| t.config_index % 4 != 0).min_by(|a, b| fake_us(a).total_cmp(&fake_us(b))).unwrap();
    let best = w.best.as_ref().unwrap();
    assert_eq!(best.task_id, fastest.task_id);

    let answer = tuning
        .query_best(pb::QueryBestRequest { workload: Some(matmul(256, 128, 256)), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.best.len(), 1);
    let top = &answer.best[0];
    assert_eq!((top.task_id, top.device_class.as_str(), top.template.as_str()), (fastest.task_id, "sim", "wmma_gemm"));
    let m = top.measurement.as_ref().unwrap();
    assert_eq!(m.median_us, fake_us(fastest));
    assert!(top.tflops > 0.0 && (top.speedup - 1.5).abs() < 1e-9, "{top:?}");
    assert_eq!(top.workload_key, "matmul/m256n128k256/nn/f16,f32,f32/alpha=1,beta=0");

    tracker.stop().await;
}

#[tokio::test]
async fn best_without_a_template_answers_across_templates() {
    use tensortune_kernels::Template;
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    let mut reg = registration("box/0", sim_device());
    let wgmma = tensortune_kernels::wgmma::WgmmaGemm;
    reg.templates.push(pb::TemplateRef { name: "wgmma_gemm".into(), version: wgmma.version() });
    let mut worker = FakeWorker::register_with(&tracker, reg).await;

    // wmma_gemm's configs measure fake_us (5 us or more); every wgmma_gemm config 1 us.
    let wmma_job = tuning.submit_job(job(vec![matmul(256, 128, 256)], 6, 3)).await.unwrap().into_inner().job_id;
    drive_with(&mut worker, &mut tuning, wmma_job, measure).await;
    let wgmma_req = pb::SubmitJobRequest { template: "wgmma_gemm".into(), ..job(vec![matmul(256, 128, 256)], 4, 2) };
    let wgmma_job = tuning.submit_job(wgmma_req).await.unwrap().into_inner().job_id;
    drive_with(&mut worker, &mut tuning, wgmma_job, |_| ok(1.0)).await;

    let mut best = async |template: &str| {
        let req = pb::QueryBestRequest {
            workload: Some(matmul(256, 128, 256)),
            template: template.into(),
            ..Default::default()
        };
        let answer = tuning.query_best(req).await.unwrap().into_inner().best;
        assert_eq!(answer.len(), 1, "one device class");
        let m = answer[0].measurement.clone().unwrap();
        (answer[0].template.clone(), m.median_us)
    };
    assert_eq!(best("").await, ("wgmma_gemm".to_string(), 1.0), "across templates, the fastest");
    let (template, us) = best("wmma_gemm").await;
    assert_eq!(template, "wmma_gemm");
    assert!(us >= 5.0, "wmma_gemm's own best is {us}");
    assert_eq!(best("wgmma_gemm").await.0, "wgmma_gemm");
    tracker.stop().await;
}

/// With `nearest`, a shape nobody tuned is answered with the best record of the nearest tuned
/// shape of the same types and layout (its own key), with the limits of its device class; without
/// it, with nothing.
#[tokio::test]
async fn query_best_offers_the_nearest_tuned_shape_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    let mut worker = FakeWorker::register(&tracker, "box/0").await;
    for (m, n, k) in [(256, 128, 256), (1024, 1024, 1024)] {
        let id = tuning.submit_job(job(vec![matmul(m, n, k)], 4, 2)).await.unwrap().into_inner().job_id;
        drive_with(&mut worker, &mut tuning, id, measure).await;
    }
    let mut ask = async |m: u64, n: u64, k: u64, nearest: bool| {
        let req = pb::QueryBestRequest { workload: Some(matmul(m, n, k)), nearest, ..Default::default() };
        tuning.query_best(req).await.unwrap().into_inner()
    };
    assert!(ask(900, 1000, 1100, false).await.best.is_empty(), "no exact record, none asked for");
    let near = ask(900, 1000, 1100, true).await;
    assert_eq!(near.best.len(), 1);
    assert_eq!(near.best[0].workload_key, "matmul/m1024n1024k1024/nn/f16,f32,f32/alpha=1,beta=0");
    assert_eq!(near.devices.len(), 1);
    assert_eq!((near.devices[0].class_key.as_str(), near.devices[0].sm_count), ("sim", 132));
    let small = ask(200, 100, 300, true).await;
    assert_eq!(small.best[0].workload_key, "matmul/m256n128k256/nn/f16,f32,f32/alpha=1,beta=0");
    // An exact record wins over any nearer-looking one.
    let exact = ask(256, 128, 256, true).await;
    assert_eq!(exact.best[0].workload_key, "matmul/m256n128k256/nn/f16,f32,f32/alpha=1,beta=0");
    // Another layout is not comparable.
    let tn = pb::Workload {
        op: Some(pb::workload::Op::Matmul(pb::Matmul {
            m: 1024,
            n: 1024,
            k: 1024,
            layout: pb::Layout::Tn as i32,
            input: pb::Dtype::F16 as i32,
            ..Default::default()
        })),
    };
    let req = pb::QueryBestRequest { workload: Some(tn), nearest: true, ..Default::default() };
    assert!(tuning.query_best(req).await.unwrap().into_inner().best.is_empty());
    tracker.stop().await;
}
