//! Workers whose time of the shared reference kernel drifts from their class's median are flagged
//! in the worker listing, and keep getting work.

use tensortune_kernels::Target;
use tensortune_proto::convert::device_from_target;
use tensortune_proto::pb;
use tonic::Code;

use crate::harness::*;

async fn workers(tracker: &TestTracker) -> Vec<pb::Worker> {
    let mut tuning = tracker.tuning().await;
    tuning.list_workers(pb::ListWorkersRequest {}).await.unwrap().into_inner().workers
}

fn find(workers: &[pb::Worker], id: u64) -> &pb::Worker {
    workers.iter().find(|w| w.id == id).unwrap()
}

#[tokio::test]
async fn the_outlier_of_a_class_is_flagged_and_still_served() {
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(config(&dir)).await;
    let mut a = FakeWorker::register(&tracker, "box/0").await;
    let mut b = FakeWorker::register(&tracker, "box/1").await;
    let mut c = FakeWorker::register(&tracker, "box/2").await;
    let silent = FakeWorker::register(&tracker, "box/3").await;
    let mut solo_target = Target::sim();
    solo_target.class_key = "solo/sm90/132sm".into();
    let mut solo = FakeWorker::register_with(&tracker, registration("solo/0", device_from_target(&solo_target))).await;

    // Alone in its class so far: never flagged, whatever its time.
    a.heartbeat_reference(100.0).await.unwrap();
    let listed = workers(&tracker).await;
    assert_eq!(
        (find(&listed, a.id).reference_us, find(&listed, a.id).drift, find(&listed, a.id).flagged),
        (100.0, 0.0, false)
    );

    b.heartbeat_reference(101.0).await.unwrap();
    c.heartbeat_reference(120.0).await.unwrap();
    solo.heartbeat_reference(500.0).await.unwrap();
    let listed = workers(&tracker).await;
    let (wa, wb, wc) = (find(&listed, a.id), find(&listed, b.id), find(&listed, c.id));
    assert!(wc.flagged && (wc.drift - 19.0 / 101.0).abs() < 1e-9, "{wc:?}");
    assert!(!wa.flagged && (wa.drift + 1.0 / 101.0).abs() < 1e-9, "{wa:?}");
    assert!(!wb.flagged && wb.drift == 0.0, "{wb:?}");
    let ws = find(&listed, solo.id);
    assert_eq!((ws.reference_us, ws.drift, ws.flagged), (500.0, 0.0, false), "a single worker is never flagged");
    let wq = find(&listed, silent.id);
    assert_eq!((wq.reference_us, wq.drift, wq.flagged), (0.0, 0.0, false), "no reference yet: nothing to judge");

    // A heartbeat without a reference (0) keeps the stored one.
    assert!(c.heartbeat(&[]).await.is_empty());
    assert!(find(&workers(&tracker).await, c.id).flagged);

    // Flagged, it still gets work.
    let mut tuning = tracker.tuning().await;
    let req = pb::SubmitJobRequest { device_class: "sim".into(), ..job(vec![matmul(64, 64, 64)], 2, 2) };
    submit(&mut tuning, req).await;
    let leased = c.lease_some(2).await;
    assert!(!leased.is_empty());
    for t in &leased {
        assert!(c.report(t, measure(t)).await.unwrap().stored);
    }

    // Back in line, it is no longer flagged.
    c.heartbeat_reference(102.0).await.unwrap();
    let wc = find(&workers(&tracker).await, c.id).clone();
    assert!(!wc.flagged && wc.reference_us == 102.0, "{wc:?}");

    // Times that are not times are refused, naming the field.
    for bad in [f64::NAN, -1.0, f64::INFINITY] {
        let (status, message) = code(c.heartbeat_reference(bad).await);
        assert_eq!(status, Code::InvalidArgument, "{bad}: {message}");
        assert!(message.starts_with("invalid reference_us:"), "{message}");
    }
    tracker.stop().await;
}

#[tokio::test]
async fn a_worker_that_registers_again_forgets_its_reference() {
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(config(&dir)).await;
    let mut a = FakeWorker::register(&tracker, "box/0").await;
    a.heartbeat_reference(100.0).await.unwrap();
    assert_eq!(find(&workers(&tracker).await, a.id).reference_us, 100.0);
    let mut req = registration("box/0", sim_device());
    req.previous_id = a.id;
    let again = FakeWorker::register_with(&tracker, req).await;
    assert_eq!(again.id, a.id);
    assert_eq!(find(&workers(&tracker).await, a.id).reference_us, 0.0, "a new session has not timed it yet");
    tracker.stop().await;
}
