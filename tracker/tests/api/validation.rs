//! Bad requests get the right status code and a message naming the field; the tracker keeps
//! serving after each.

use tensortune_kernels::gemm::WmmaGemm;
use tensortune_kernels::{Target, Template};
use tensortune_proto::convert::device_from_target;
use tensortune_proto::pb;
use tonic::Code;

use crate::harness::*;

fn with_matmul(mut w: pb::Workload, f: impl FnOnce(&mut pb::Matmul)) -> pb::Workload {
    if let Some(pb::workload::Op::Matmul(m)) = &mut w.op {
        f(m);
    }
    w
}

fn conv() -> pb::Workload {
    pb::Workload {
        op: Some(pb::workload::Op::Conv2d(pb::Conv2d {
            n: 1,
            h: 8,
            w: 8,
            c: 16,
            k: 16,
            r: 3,
            s: 3,
            pad_h: 1,
            pad_w: 1,
            input: pb::Dtype::F16 as i32,
            ..Default::default()
        })),
    }
}

#[tokio::test]
async fn bad_submissions_name_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;

    let (c, message) = code(tuning.submit_job(job(vec![matmul(64, 64, 64)], 4, 0)).await);
    assert_eq!(c, Code::FailedPrecondition);
    assert!(message.contains("no worker has registered yet; start a worker or pass --device-class"), "{message}");
    // A field the template rules out is named before any device lookup, with no worker yet.
    let (c, message) = code(tuning.submit_job(job(vec![matmul(512, 64, 513)], 4, 0)).await);
    assert_eq!(c, Code::InvalidArgument, "{message}");
    // With no template named, every matmul template is asked, and each one's reason is given.
    assert!(message.contains("invalid workloads[0].matmul.k: no template takes this workload"), "{message}");
    assert!(message.contains("wmma_gemm: 513 must be a multiple of 8"), "{message}");
    assert!(message.contains("wgmma_gemm: 513 must be a multiple of 8"), "{message}");
    let named = pb::SubmitJobRequest { template: "wmma_gemm".into(), ..job(vec![matmul(512, 64, 513)], 4, 0) };
    let (c, message) = code(tuning.submit_job(named).await);
    assert_eq!(c, Code::InvalidArgument, "{message}");
    assert!(message.contains("invalid workloads[0].matmul.k: 513 must be a multiple of 8"), "{message}");
    let wgmma = pb::SubmitJobRequest { template: "wgmma_gemm".into(), ..job(vec![matmul(1001, 64, 512)], 4, 0) };
    let (c, message) = code(tuning.submit_job(wgmma).await);
    assert_eq!(c, Code::InvalidArgument, "{message}");
    assert!(message.contains("invalid workloads[0].matmul.m: 1001 must be a multiple of 8"), "{message}");

    let base = || job(vec![matmul(64, 64, 64)], 4, 0);
    let cases = || -> Vec<(&str, pb::SubmitJobRequest, &str)> {
        vec![
            ("no workloads", pb::SubmitJobRequest { workloads: vec![], ..base() }, "invalid workloads:"),
            (
                "a label of 10 kB",
                pb::SubmitJobRequest { label: "x".repeat(10_000), ..base() },
                "invalid label: is 10000 bytes long; at most 256 are allowed",
            ),
            (
                "a template name of 1 kB",
                pb::SubmitJobRequest { template: "t".repeat(1000), ..base() },
                "invalid template: is 1000 bytes long; at most 128 are allowed",
            ),
            (
                "too many workloads",
                pb::SubmitJobRequest { workloads: vec![matmul(64, 64, 64); 1025], ..base() },
                "invalid workloads:",
            ),
            ("m = 0", job(vec![matmul(64, 64, 64), matmul(0, 64, 64)], 4, 0), "invalid workloads[1].matmul.m:"),
            ("k not a multiple of 8", job(vec![matmul(64, 64, 20)], 4, 0), "invalid workloads[0].matmul.k:"),
            (
                "layout unset",
                job(vec![with_matmul(matmul(64, 64, 64), |m| m.layout = 0)], 4, 0),
                "invalid workloads[0].matmul.layout:",
            ),
            (
                "i8 accumulating in f32",
                job(
                    vec![with_matmul(matmul(64, 64, 64), |m| {
                        m.input = pb::Dtype::I8 as i32;
                        m.accumulator = pb::Dtype::F32 as i32;
                    })],
                    4,
                    0,
                ),
                "invalid workloads[0].matmul.accumulator:",
            ),
            ("no op", job(vec![pb::Workload { op: None }], 4, 0), "invalid workloads[0].op:"),
            (
                "conv whose channels no conv template can load",
                job(
                    vec![pb::Workload {
                        op: match conv().op {
                            Some(pb::workload::Op::Conv2d(c)) => {
                                Some(pb::workload::Op::Conv2d(pb::Conv2d { c: 12, ..c }))
                            }
                            other => other,
                        },
                    }],
                    4,
                    0,
                ),
                // Each template's reason (wgmma_conv2d's says what to pad to).
                "invalid workloads[0].conv2d.c: no template takes this workload; wmma_conv2d: 12 must be a multiple of 8 for f16 inputs",
            ),
            (
                "conv with wmma_gemm",
                pb::SubmitJobRequest { template: "wmma_gemm".into(), ..job(vec![conv()], 4, 0) },
                "invalid workloads[0]: template wmma_gemm does not support conv2d",
            ),
            (
                "mixed ops with one template",
                pb::SubmitJobRequest { template: "wmma_gemm".into(), ..job(vec![matmul(64, 64, 64), conv()], 4, 0) },
                "invalid workloads[1]:",
            ),
            ("unknown template", pb::SubmitJobRequest { template: "cutlass".into(), ..base() }, "known: wmma_gemm"),
            (
                "unknown tuner",
                pb::SubmitJobRequest { tuner: "bayes".into(), ..base() },
                "invalid tuner: unknown tuner \"bayes\"; known: random, grid, model",
            ),
            (
                "no trials",
                pb::SubmitJobRequest { trials: 0, ..base() },
                "invalid trials: 0 is out of range; allowed 1 ..= 100000",
            ),
            ("too many trials", pb::SubmitJobRequest { trials: 100_001, ..base() }, "invalid trials: 100001"),
            ("huge batch", pb::SubmitJobRequest { batch_size: 4097, ..base() }, "invalid batch_size: 4097"),
            (
                "cold-L2 timing for the energy objective",
                pb::SubmitJobRequest { flush_l2: true, objective: "energy".into(), ..base() },
                "invalid flush_l2: cold-L2 timing reads no energy and no steady clock, so it cannot serve objective energy",
            ),
            (
                "cold-L2 timing in the sustained regime",
                pb::SubmitJobRequest { flush_l2: true, regime: "sustained".into(), ..base() },
                "invalid flush_l2: cold-L2 timing reads no energy and no steady clock, so it cannot serve regime sustained",
            ),
            ("too many samples", pb::SubmitJobRequest { samples: 1001, ..base() }, "invalid samples: 1001"),
            (
                "margin above 1",
                pb::SubmitJobRequest { early_stop_margin: 1.5, ..base() },
                "invalid early_stop_margin: 1.5",
            ),
            (
                "margin NaN",
                pb::SubmitJobRequest { early_stop_margin: f64::NAN, ..base() },
                "invalid early_stop_margin:",
            ),
            (
                "too many finalists",
                pb::SubmitJobRequest { finalists: Some(17), ..base() },
                "invalid finalists: 17 is out of range; allowed 0 ..= 16",
            ),
            (
                "too many finalist rounds",
                pb::SubmitJobRequest { finalist_rounds: 21, ..base() },
                "invalid finalist_rounds: 21 is out of range; allowed 1 ..= 20",
            ),
            (
                "a budget above the limit",
                pb::SubmitJobRequest { total_trials: 1_000_001, ..base() },
                "invalid total_trials: 1000001 is out of range; allowed 1 ..= 1000000",
            ),
            (
                "a budget below the workloads",
                pb::SubmitJobRequest {
                    total_trials: 2,
                    ..job(vec![matmul(64, 64, 64), matmul(128, 64, 64), matmul(64, 64, 128)], 4, 0)
                },
                "invalid total_trials: 2 is fewer than the job's 3 workloads",
            ),
            (
                "weights for some workloads",
                pb::SubmitJobRequest { weights: vec![1.0, 2.0], ..base() },
                "invalid weights: holds 2 weights for 1 workloads; give one per workload, or none",
            ),
            (
                "a weight that is not a count",
                pb::SubmitJobRequest { weights: vec![f64::NAN], ..base() },
                "invalid weights[0]: NaN is out of range; allowed 0 < weight <= 1e9",
            ),
            (
                "margin negative",
                pb::SubmitJobRequest { early_stop_margin: -0.1, early_stop_trials: 5, ..base() },
                "invalid early_stop_margin:",
            ),
        ]
    };
    // Every bad field is named before anything is looked up: with no worker yet (no device class
    // to check against), and again with one.
    for registered in [false, true] {
        if registered {
            FakeWorker::register(&tracker, "box/0").await;
        }
        for (what, req, expected) in cases() {
            let (c, message) = code(tuning.submit_job(req).await);
            assert_eq!(c, Code::InvalidArgument, "{what} (worker registered: {registered}): {message}");
            assert!(message.contains(expected), "{what}: {message:?} lacks {expected:?}");
        }
    }

    // Without a template each workload has its op's templates that take it on the class (sm_90 sim:
    // the conv is on both conv templates): a job of a matmul and a conv is one.
    let mixed = submit(&mut tuning, job(vec![matmul(64, 64, 64), conv()], 4, 0)).await;
    assert_eq!(get_job(&mut tuning, mixed).await.template, "wmma_gemm+wmma_conv2d+wgmma_conv2d");

    let (c, message) = code(tuning.submit_job(pb::SubmitJobRequest { device_class: "h100".into(), ..base() }).await);
    assert_eq!(c, Code::FailedPrecondition);
    assert!(message.contains("\"h100\"") && message.contains("known classes: sim"), "{message}");

    let (c, message) = code(tuning.get_job(pb::JobRef { job_id: 77 }).await);
    assert_eq!((c, message.as_str()), (Code::NotFound, "job 77 does not exist"));
    assert_eq!(code(tuning.get_job(pb::JobRef { job_id: u64::MAX }).await).0, Code::InvalidArgument);

    let (c, message) = code(tuning.query_best(pb::QueryBestRequest::default()).await);
    assert_eq!((c, message.as_str()), (Code::InvalidArgument, "invalid workload: must be set"));
    let bad_query = pb::QueryBestRequest { workload: Some(matmul(64, 0, 64)), ..Default::default() };
    let (c, message) = code(tuning.query_best(bad_query).await);
    assert!(c == Code::InvalidArgument && message.contains("invalid workload.matmul.n:"), "{message}");
    let bad_template =
        pb::QueryBestRequest { workload: Some(matmul(64, 64, 64)), template: "x".into(), ..Default::default() };
    assert_eq!(code(tuning.query_best(bad_template).await).0, Code::InvalidArgument);

    // Still serving: a good job goes through, with its defaults filled in.
    let id = submit(&mut tuning, base()).await;
    let j = get_job(&mut tuning, id).await;
    let built = (j.template.as_str(), j.template_version, j.device_class.as_str());
    assert_eq!(built, ("wmma_gemm", WmmaGemm.version(), "sim"));
    assert_eq!((j.finalists, j.finalist_rounds, j.flush_l2), (0, 3, false));
    // Unset finalists and 0 rounds are the defaults, 3 and 3; 0 finalists is none; the bounds
    // themselves are accepted.
    let defaults = submit(&mut tuning, pb::SubmitJobRequest { finalists: None, ..base() }).await;
    let j = get_job(&mut tuning, defaults).await;
    assert_eq!((j.finalists, j.finalist_rounds), (3, 3));
    let none = submit(&mut tuning, pb::SubmitJobRequest { finalists: Some(0), ..base() }).await;
    assert_eq!(get_job(&mut tuning, none).await.finalists, 0);
    let bounds = pb::SubmitJobRequest { finalists: Some(16), finalist_rounds: 20, ..base() };
    let bounds = submit(&mut tuning, bounds).await;
    let j = get_job(&mut tuning, bounds).await;
    assert_eq!((j.finalists, j.finalist_rounds), (16, 20));
    // Transfer is on unless turned off; no job-wide budget unless asked; the budget's bounds (at
    // least one trial per workload) are accepted.
    let j = get_job(&mut tuning, id).await;
    assert_eq!((j.tuner.as_str(), j.transfer, j.total_trials), ("random", true, 0));
    let model = pb::SubmitJobRequest { tuner: "model".into(), transfer: Some(false), total_trials: 1, ..base() };
    let model = submit(&mut tuning, model).await;
    let j = get_job(&mut tuning, model).await;
    assert_eq!((j.tuner.as_str(), j.transfer, j.total_trials), ("model", false, 1));
    let most = submit(&mut tuning, pb::SubmitJobRequest { total_trials: 1_000_000, ..base() }).await;
    assert_eq!(get_job(&mut tuning, most).await.total_trials, 1_000_000);
    tracker.stop().await;
}

#[tokio::test]
async fn the_device_class_is_resolved_or_refused() {
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    FakeWorker::register(&tracker, "box/0").await;
    // A second class whose GPU is too small for any config of the space.
    let mut tiny = Target::sim();
    tiny.class_key = "tiny/sm80/1sm".into();
    tiny.arch = 80;
    tiny.max_smem_per_block = 512;
    FakeWorker::register_with(&tracker, registration("tiny/0", device_from_target(&tiny))).await;

    let (c, message) = code(tuning.submit_job(job(vec![matmul(64, 64, 64)], 4, 0)).await);
    assert_eq!(c, Code::FailedPrecondition);
    assert!(message.contains("(sim, tiny/sm80/1sm); pass --device-class"), "{message}");

    let on_tiny = pb::SubmitJobRequest { device_class: "tiny/sm80/1sm".into(), ..job(vec![matmul(64, 64, 64)], 4, 0) };
    let (c, message) = code(tuning.submit_job(on_tiny).await);
    assert_eq!(c, Code::InvalidArgument);
    let expected = format!("invalid workloads[0]: no config of wmma_gemm v{} is valid", WmmaGemm.version());
    assert!(message.starts_with(&expected), "{message}");

    let on_sim = pb::SubmitJobRequest { device_class: "sim".into(), ..job(vec![matmul(64, 64, 64)], 4, 0) };
    let response = tuning.submit_job(on_sim).await.unwrap().into_inner();
    assert_eq!(response.device_class, "sim");
    tracker.stop().await;
}

#[tokio::test]
async fn bad_dispatch_requests_name_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(config(&dir)).await;
    let mut client = tracker.dispatch().await;

    let good = || registration("box/0", sim_device());
    let mut old_gpu = sim_device();
    old_gpu.arch = 60;
    let cases: Vec<(&str, pb::RegisterRequest, &str)> = vec![
        ("empty name", pb::RegisterRequest { name: String::new(), ..good() }, "invalid name:"),
        ("long name", pb::RegisterRequest { name: "x".repeat(129), ..good() }, "invalid name:"),
        ("no device", pb::RegisterRequest { device: None, ..good() }, "invalid device: must be set"),
        ("pre-Volta", pb::RegisterRequest { device: Some(old_gpu), ..good() }, "invalid device.arch: sm_60"),
        (
            "no class",
            pb::RegisterRequest { device: Some(pb::DeviceInfo { class_key: String::new(), ..sim_device() }), ..good() },
            "invalid device.class_key:",
        ),
        ("no templates", pb::RegisterRequest { templates: vec![], ..good() }, "invalid templates:"),
        (
            "template v0",
            pb::RegisterRequest { templates: vec![pb::TemplateRef { name: "wmma_gemm".into(), version: 0 }], ..good() },
            "invalid templates[0].version:",
        ),
    ];
    for (what, req, expected) in cases {
        let (c, message) = code(client.register(req).await);
        assert_eq!(c, Code::InvalidArgument, "{what}: {message}");
        assert!(message.contains(expected), "{what}: {message:?} lacks {expected:?}");
    }
    assert_eq!(
        client.register(pb::RegisterRequest { name: "x".repeat(128), ..good() }).await.unwrap().into_inner().lease_ms,
        30_000
    );

    let (c, message) =
        code(client.lease_tasks(pb::LeaseTasksRequest { worker_id: 99, max_tasks: 1, wait_ms: 0 }).await);
    assert_eq!(c, Code::NotFound);
    assert!(message.contains("worker 99 is not registered"), "{message}");
    assert_eq!(
        code(client.heartbeat(pb::HeartbeatRequest { worker_id: 99, task_ids: vec![], ..Default::default() }).await).0,
        Code::NotFound
    );

    let mut tuning = tracker.tuning().await;
    let mut worker = FakeWorker::register(&tracker, "box/1").await;
    for (max_tasks, wait_ms, field) in [(0, 0, "max_tasks"), (1025, 0, "max_tasks"), (1, 30_001, "wait_ms")] {
        let (c, message) =
            code(worker.client.lease_tasks(pb::LeaseTasksRequest { worker_id: worker.id, max_tasks, wait_ms }).await);
        assert_eq!(c, Code::InvalidArgument);
        assert!(message.starts_with(&format!("invalid {field}:")), "{message}");
    }

    submit(&mut tuning, job(vec![matmul(64, 64, 64)], 2, 0)).await;
    let task = worker.lease_some(1).await.remove(0);
    let unknown = pb::Task { task_id: 123_456, ..task.clone() };
    let (c, message) = code(worker.report(&unknown, measure(&task)).await);
    assert_eq!((c, message.as_str()), (Code::NotFound, "task 123456 does not exist"));

    let report = |m: Option<pb::Measurement>| pb::ReportResultRequest {
        worker_id: worker.id,
        task_id: task.task_id,
        measurement: m,
        lease_serial: task.lease_serial,
        ..Default::default()
    };
    let bad: Vec<(&str, Option<pb::Measurement>, &str)> = vec![
        ("no measurement", None, "invalid measurement: must be set"),
        ("no status", Some(pb::Measurement { status: 0, ..ok(3.0) }), "invalid measurement.status:"),
        (
            "unknown status",
            Some(pb::Measurement { status: 99, ..ok(3.0) }),
            "invalid measurement.status: unknown status value 99",
        ),
        ("ok without a time", Some(ok(0.0)), "invalid measurement.median_us:"),
        ("NaN time", Some(ok(f64::NAN)), "invalid measurement.median_us:"),
        ("infinite time", Some(ok(f64::INFINITY)), "invalid measurement.median_us:"),
        (
            "negative sample",
            Some(pb::Measurement { samples_us: vec![1.0, -1.0], ..ok(3.0) }),
            "invalid measurement.samples_us[1]:",
        ),
        (
            "zero baseline",
            Some(pb::Measurement { baseline_us: Some(0.0), ..ok(3.0) }),
            "invalid measurement.baseline_us:",
        ),
        (
            "NaN error",
            Some(pb::Measurement { max_abs_err: Some(f64::NAN), ..ok(3.0) }),
            "invalid measurement.max_abs_err:",
        ),
    ];
    for (what, m, expected) in bad {
        let (c, message) = code(worker.client.report_result(report(m)).await);
        assert_eq!(c, Code::InvalidArgument, "{what}: {message}");
        assert!(message.contains(expected), "{what}: {message:?} lacks {expected:?}");
    }
    let stranger = pb::ReportResultRequest { worker_id: 4242, ..report(Some(ok(3.0))) };
    assert_eq!(code(worker.client.report_result(stranger).await).0, Code::NotFound);
    // After all that, the real report is stored.
    assert!(worker.report(&task, measure(&task)).await.unwrap().stored);
    tracker.stop().await;
}
