//! Record packs: a new database starts its model jobs warm from the packs the tracker ships
//! (measured on another GPU of the same architecture), `ImportRecords` stores a pack once however
//! often it is sent, and bad packs are refused naming the line and the field.

use tensortune_kernels::Target;
use tensortune_proto::convert::device_from_target;
use tensortune_proto::pb;
use tensortune_tracker::TrackerConfig;

use crate::harness::*;

/// The config indices of the first batch a model job with transfer proposes for a workload no
/// pack holds, on a fresh database of a generic sm_90 class (not the class the packs were
/// measured on), with the shipped packs on or off.
async fn first_batch(prior_pack: bool) -> Vec<u64> {
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(TrackerConfig { prior_pack, ..config(&dir) }).await;
    let mut tuning = tracker.tuning().await;
    let mut worker =
        FakeWorker::register_with(&tracker, registration("box/0", device_from_target(&Target::sm90()))).await;
    let req = pb::SubmitJobRequest {
        tuner: "model".into(),
        template: "wmma_gemm".into(),
        transfer: Some(true),
        ..job(vec![matmul(1536, 768, 1280)], 16, 16)
    };
    submit(&mut tuning, req).await;
    let mut got = Vec::new();
    while got.len() < 16 {
        got.extend(worker.lease_some(16).await.into_iter().map(|t| t.config_index));
    }
    tracker.stop().await;
    got.sort_unstable();
    got
}

#[tokio::test]
async fn a_new_database_starts_model_jobs_from_the_shipped_packs() {
    let warm = first_batch(true).await;
    let cold = first_batch(false).await;
    assert_eq!((warm.len(), cold.len()), (16, 16));
    // Without a pack the first batch is the analytic model's; with one, the prior's model ranks
    // the configs, and it does not pick the same sixteen.
    assert_ne!(warm, cold, "the shipped packs changed nothing in the first batch");
}

/// Two records of a pack, as `records export` writes them.
fn pack_lines() -> String {
    let line = |config_block_m: u32, status: &str, t: f64| {
        format!(
            r#"{{"workload":"matmul/m512n64k512/nn/f16,f32,f32/alpha=1,beta=0","template":"wmma_gemm","template_version":6,"config":{{"block_m":{config_block_m}}},"device_class":"nvidia-h100/sm90/132sm","status":"{status}","median_us":{t}}}"#
        )
    };
    format!("{}\n{}\n", line(64, "ok", 3.5), line(128, "wrong_result", 0.0))
}

#[tokio::test]
async fn an_imported_pack_is_stored_once_and_bad_packs_name_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    let import = |pack: &str, lines: String| pb::ImportRecordsRequest { pack: pack.into(), lines: lines.into_bytes() };
    let first = tuning.import_records(import("h100", pack_lines())).await.unwrap().into_inner();
    assert_eq!((first.added, first.skipped, first.unknown_template), (2, 0, 0));
    let again = tuning.import_records(import("h100", pack_lines())).await.unwrap().into_inner();
    assert_eq!((again.added, again.skipped), (0, 2), "a repeated import stored records twice");
    let other = tuning.import_records(import("h100-b", pack_lines())).await.unwrap().into_inner();
    assert_eq!(other.added, 2, "another pack's records are its own");

    let bad = pack_lines().replace("wrong_result", "so-so");
    let e = tuning.import_records(import("h100", bad)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains(":2:") && e.message().contains("status"), "{}", e.message());
    let e = tuning.import_records(import(" ", pack_lines())).await.unwrap_err();
    assert!(e.code() == tonic::Code::InvalidArgument && e.message().contains("pack"), "{}", e.message());
    // Pack records are never an answer to `best`: they were measured on another machine.
    let best = tuning
        .query_best(pb::QueryBestRequest {
            workload: Some(matmul(512, 64, 512)),
            device_class: "nvidia-h100/sm90/132sm".into(),
            ..Default::default()
        })
        .await;
    match best {
        Ok(answer) => assert!(answer.into_inner().best.is_empty(), "best answered from a pack"),
        Err(e) => assert_eq!(e.code(), tonic::Code::NotFound, "{}", e.message()),
    }
    tracker.stop().await;
}
