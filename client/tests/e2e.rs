//! End to end on the `sim` device: a real tracker on a loopback port with a temporary SQLite file,
//! real worker daemons with real measuring child processes (this crate's `tensortune` binary),
//! NVRTC compiling every generated kernel when libnvrtc is reachable (scripts/test.sh).

use std::collections::HashSet;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tensortune_kernels::{DType, Layout, Matmul, Types, Workload};
use tensortune_proto::pb;
use tensortune_proto::pb::tuning_client::TuningClient;
use tensortune_tracker::TrackerConfig;
use tensortune_worker::{DeviceSpec, WorkerConfig};
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

const BIN: &str = env!("CARGO_BIN_EXE_tensortune");

struct Tracker {
    url: String,
    token: CancellationToken,
    handle: JoinHandle<anyhow::Result<()>>,
}

impl Tracker {
    async fn start(db: &Path, lease: Duration) -> Tracker {
        Tracker::start_on("127.0.0.1:0", db, lease).await
    }

    /// A tracker listening on `addr` (a restarted one takes its predecessor's address).
    async fn start_on(addr: &str, db: &Path, lease: Duration) -> Tracker {
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let token = CancellationToken::new();
        let config = TrackerConfig {
            db: db.to_owned(),
            lease,
            heartbeat: lease / 4,
            max_attempts: 3,
            ..TrackerConfig::default()
        };
        let handle = tokio::spawn(tensortune_tracker::run(config, listener, token.clone()));
        Tracker { url, token, handle }
    }

    async fn client(&self) -> TuningClient<Channel> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            match TuningClient::connect(self.url.clone()).await {
                Ok(c) => return c,
                Err(e) if tokio::time::Instant::now() > deadline => panic!("tracker at {} unreachable: {e}", self.url),
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    async fn stop(self) {
        self.token.cancel();
        self.handle.await.unwrap().unwrap();
    }
}

fn worker_config(url: &str, name: &str) -> WorkerConfig {
    let mut c = WorkerConfig::new(url, DeviceSpec::Sim);
    c.name = Some(name.into());
    c.compile_threads = 1;
    c.cache_dir = None;
    c.child_command = vec![BIN.into(), tensortune_worker::CHILD_ARG.into()];
    c
}

fn spawn_worker(url: &str, name: &str, token: &CancellationToken) -> JoinHandle<anyhow::Result<()>> {
    tokio::spawn(tensortune_worker::run(worker_config(url, name), token.child_token()))
}

fn workload() -> Workload {
    Workload::Matmul(Matmul::new(512, 64, 512, Layout::Nn, Types::default_for(DType::F16).unwrap()).unwrap())
}

fn submit(trials: u32, batch: u32) -> pb::SubmitJobRequest {
    pb::SubmitJobRequest {
        workloads: vec![pb::Workload::from(&workload())],
        tuner: "random".into(),
        trials,
        batch_size: batch,
        seed: 7,
        samples: 5,
        ..Default::default()
    }
}

/// Waits for `n` online workers.
async fn wait_workers(client: &mut TuningClient<Channel>, n: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let ws = client.list_workers(pb::ListWorkersRequest {}).await.unwrap().into_inner().workers;
        if ws.iter().filter(|w| w.state == "online").count() >= n {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "workers did not register: {ws:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Follows the job to its end through WatchJob.
async fn wait_done(client: &mut TuningClient<Channel>, job_id: u64) -> pb::Job {
    let watch = async {
        let mut stream = client.watch_job(pb::JobRef { job_id }).await.unwrap().into_inner();
        let mut last = None;
        while let Some(job) = stream.next().await {
            last = Some(job.unwrap());
        }
        last.expect("the stream sent the job")
    };
    tokio::time::timeout(Duration::from_secs(240), watch).await.expect("the job finished in time")
}

async fn export(client: &mut TuningClient<Channel>, job_id: u64) -> Vec<pb::Record> {
    let req = pb::ExportRecordsRequest { job_id, ..Default::default() };
    let mut stream = client.export_records(req).await.unwrap().into_inner();
    let mut out = Vec::new();
    while let Some(r) = stream.next().await {
        out.push(r.unwrap());
    }
    out
}

async fn best(client: &mut TuningClient<Channel>) -> Vec<pb::Record> {
    let req = pb::QueryBestRequest { workload: Some(pb::Workload::from(&workload())), ..Default::default() };
    client.query_best(req).await.unwrap().into_inner().best
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_sim_workers_tune_and_the_tracker_restarts_with_everything_kept() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("tt.db");
    let tracker = Tracker::start(&db, Duration::from_secs(5)).await;
    let mut client = tracker.client().await;
    let workers = CancellationToken::new();
    let w1 = spawn_worker(&tracker.url, "sim-a", &workers);
    let w2 = spawn_worker(&tracker.url, "sim-b", &workers);
    wait_workers(&mut client, 2).await;

    let job_id = client.submit_job(submit(16, 4)).await.unwrap().into_inner().job_id;
    let job = wait_done(&mut client, job_id).await;
    assert_eq!(job.state(), pb::JobState::Done, "{job:?}");
    let progress = &job.workloads[0];
    assert_eq!((progress.trials_target, progress.trials_done), (16, 16));
    let records = export(&mut client, job_id).await;
    let (remeasured, tuning): (Vec<&pb::Record>, Vec<&pb::Record>) = records.iter().partition(|r| r.remeasure);
    assert_eq!(tuning.len(), 16, "one tuning record per trial");
    assert_eq!(remeasured.len(), progress.finalists.len(), "one re-measurement per finalist");
    assert!((2..=3).contains(&remeasured.len()), "the default is 3 finalists: {}", remeasured.len());
    let by_worker: HashSet<u64> = tuning.iter().map(|r| r.worker_id).collect();
    assert_eq!(by_worker.len(), 2, "both workers measured");
    let ok: Vec<&pb::Record> =
        records.iter().filter(|r| r.measurement.as_ref().unwrap().status() == pb::RecordStatus::Ok).collect();
    assert!(!ok.is_empty());
    // best answers the job's verdict: the winner's re-measurement, however fast a trial read.
    let verdict = progress.best.as_ref().expect("a done workload has a best record");
    assert!(verdict.remeasure, "{verdict:?}");
    let best_before = best(&mut client).await;
    assert_eq!(best_before.len(), 1);
    assert_eq!(best_before[0].id, verdict.id);
    assert_eq!(best_before[0].device_class, "sim");
    // The vendor's algorithm travels from the sim child through the tracker's store.
    let vendor = best_before[0].measurement.as_ref().unwrap();
    assert_eq!(vendor.baseline_kind, "model");
    assert!(vendor.vendor_algo.starts_with("algo=sim tile=128x64x64 "), "{:?}", vendor.vendor_algo);

    workers.cancel();
    w1.await.unwrap().unwrap();
    w2.await.unwrap().unwrap();
    tracker.stop().await;

    let tracker = Tracker::start(&db, Duration::from_secs(5)).await;
    let mut client = tracker.client().await;
    let best_after = best(&mut client).await;
    assert_eq!(best_after, best_before, "the best config survives a restart");
    assert_eq!(export(&mut client, 0).await.len(), records.len(), "no record lost or added");
    let job = client.get_job(pb::JobRef { job_id }).await.unwrap().into_inner();
    assert_eq!(job.state(), pb::JobState::Done);
    tracker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_worker_loses_its_tasks_to_another_without_duplicates() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("tt.db");
    let lease = Duration::from_millis(1500);
    let tracker = Tracker::start(&db, lease).await;
    let mut client = tracker.client().await;

    // A worker in its own process, so it can be killed without a chance to clean up.
    let mut victim = tokio::process::Command::new(BIN)
        .args(["--tracker", &tracker.url, "worker", "--device", "sim", "--name", "victim", "--compile-threads", "1"])
        .env("XDG_CACHE_HOME", dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    wait_workers(&mut client, 1).await;
    let job_id = client.submit_job(submit(12, 6)).await.unwrap().into_inner().job_id;

    // Kill it while it holds leases.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let ws = client.list_workers(pb::ListWorkersRequest {}).await.unwrap().into_inner().workers;
        let held = ws.iter().find(|w| w.name == "victim").map_or(0, |w| w.leased);
        if held > 0 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the worker never leased a task");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    victim.start_kill().unwrap();
    victim.wait().await.unwrap();

    let workers = CancellationToken::new();
    let rescuer = spawn_worker(&tracker.url, "rescuer", &workers);
    let job = wait_done(&mut client, job_id).await;
    assert_eq!(job.state(), pb::JobState::Done, "{job:?}");
    assert_eq!(job.workloads[0].trials_done, 12);
    let records = export(&mut client, job_id).await;
    let tuning: Vec<&pb::Record> = records.iter().filter(|r| !r.remeasure).collect();
    assert_eq!(tuning.len(), 12, "every trial has exactly one record");
    let tasks: HashSet<u64> = tuning.iter().map(|r| r.task_id).collect();
    assert_eq!(tasks.len(), 12, "no task was recorded twice");
    let finalists = &job.workloads[0].finalists;
    assert_eq!(records.len() - tuning.len(), finalists.len(), "one re-measurement per finalist");
    let ws = client.list_workers(pb::ListWorkersRequest {}).await.unwrap().into_inner().workers;
    let rescuer_id = ws.iter().find(|w| w.name == "rescuer").unwrap().id;
    assert!(records.iter().any(|r| r.worker_id == rescuer_id), "the tasks went to the second worker");

    workers.cancel();
    rescuer.await.unwrap().unwrap();
    tracker.stop().await;
}

/// The CLI end to end for a conv: `tune conv2d` with the embedded tracker and a `sim` worker, as a
/// user runs it; on `sim` (an sm_90 class) the layer's space is the union of wmma_conv2d and
/// wgmma_conv2d, every trial is measured, and the model tuner says at the end how sure it is.
#[test]
fn the_cli_tunes_a_conv_on_sim() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(BIN)
        .args(["--db", dir.path().join("tt.db").to_str().unwrap()])
        .args(["tune", "conv2d", "--n", "1", "--h", "14", "--w", "14", "--c", "64", "--k", "64"])
        .args(["--r", "3", "--s", "3", "--pad", "1", "--stride", "1", "--trials", "12", "--seed", "5"])
        .args(["--device", "sim", "--compile-threads", "1"])
        .env("XDG_CACHE_HOME", dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "tune conv2d failed:\n{stdout}\n{stderr}");
    let templates = conv_templates_on_sim();
    for want in [
        templates.as_str(),
        "trials  12/12",
        "(ok 12)",
        "best ",
        "config  block_",
        "chance that an untried config is >= 2% faster",
    ] {
        assert!(stdout.contains(want), "missing {want:?} in:\n{stdout}\n{stderr}");
    }

    // The read commands answer in JSON when asked, from the same database.
    let read = |args: &[&str]| -> serde_json::Value {
        let out = std::process::Command::new(BIN)
            .args(["--db", dir.path().join("tt.db").to_str().unwrap()])
            .args(args)
            .env("XDG_CACHE_HOME", dir.path())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{args:?} printed no JSON ({e}):\n{text}"))
    };
    let jobs = read(&["jobs", "--json"]);
    assert_eq!(jobs.as_array().map(Vec::len), Some(1), "{jobs}");
    let id = jobs[0]["id"].as_u64().unwrap();
    assert_eq!(jobs[0]["workloads"][0]["trials_done"], 12);
    let job = read(&["job", &id.to_string(), "--json"]);
    assert_eq!((job["state"].as_str(), job["template"].as_str()), (Some("done"), Some("wmma_conv2d+wgmma_conv2d")));
    assert!(job["workloads"][0]["best"]["median_us"].as_f64().is_some_and(|us| us > 0.0), "{job}");
    assert!(read(&["workers", "--json"]).is_array());
}

/// A local run waits for its own worker. The database keeps the workers of earlier runs, and one
/// that stopped a moment ago is still `online` until its lease runs out: a run on another device
/// in the same database must not take that worker's class for its own (it once submitted the job
/// for `sim` and answered with the sim's records).
#[test]
fn a_local_run_waits_for_its_own_worker_not_one_an_earlier_run_left_online() {
    let dir = tempfile::tempdir().unwrap();
    let tune = |device: &str| {
        std::process::Command::new(BIN)
            .args(["--db", dir.path().join("tt.db").to_str().unwrap()])
            .args(["tune", "matmul", "--m", "512", "--n", "64", "--k", "512", "--trials", "2", "--seed", "1"])
            .args(["--device", device, "--compile-threads", "1"])
            .env("XDG_CACHE_HOME", dir.path())
            .output()
            .unwrap()
    };
    let first = tune("sim");
    assert!(first.status.success(), "the sim run failed: {}", String::from_utf8_lossy(&first.stderr));
    // No GPU has ordinal 99, here or on a GPU machine: its worker stops before registering.
    let second = tune("cuda:99");
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success(), "a run on cuda:99 succeeded:\n{stderr}");
    assert!(!stderr.contains("submitted for"), "a job was submitted without this run's worker:\n{stderr}");
    assert!(stderr.contains("opening cuda:99"), "the error does not name the device:\n{stderr}");
}

/// A tf32 conv end to end on `sim`: `tune conv2d --dtype f32 --allow-tf32` searches the union of
/// the two tensor-core conv templates (both take TF32 on an sm_90 class), every trial is measured,
/// and the records carry the tf32 workload key, never the exact f32 one.
#[test]
fn the_cli_tunes_a_tf32_conv_on_sim() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("tt.db");
    let run = |args: &[&str]| {
        std::process::Command::new(BIN)
            .args(["--db", db.to_str().unwrap()])
            .args(args)
            .env("XDG_CACHE_HOME", dir.path())
            .output()
            .unwrap()
    };
    let layer = ["conv2d", "--n", "2", "--h", "14", "--w", "14", "--c", "64", "--k", "64", "--r", "3", "--s", "3"];
    let tune = [&["tune"][..], &layer, &["--pad", "1", "--dtype", "f32", "--allow-tf32"]].concat();
    let out =
        run(&[&tune[..], &["--trials", "10", "--seed", "7", "--device", "sim", "--compile-threads", "1"]].concat());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "tune conv2d tf32 failed:\n{stdout}\n{stderr}");
    let templates = conv_templates_on_sim();
    for want in [templates.as_str(), "trials  10/10", "(ok 10)", "best "] {
        assert!(stdout.contains(want), "missing {want:?} in:\n{stdout}\n{stderr}");
    }
    let out = run(&["jobs", "--json"]);
    let jobs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let key = jobs[0]["workloads"][0]["workload"].as_str().map(str::to_owned);
    assert_eq!(key.as_deref(), Some("conv2d/n2h14w14c64/k64r3s3/pad1x1,stride1x1,dil1x1/nhwc/tf32,f32,f32"), "{jobs}");
    // The exact f32 layer is another workload: nothing tuned for it.
    let best = [&["best"][..], &layer, &["--pad", "1", "--dtype", "f32", "--json"]].concat();
    let out = run(&best);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!text.contains("tf32,f32,f32") && !text.contains("\"median_us\""), "{text}");
}

/// A client following a job through `--tracker` keeps following it when the tracker goes away
/// and comes back on the same address, and the job finishes there with nothing lost (seen on an
/// H200: `tune` exited with "h2 protocol error" while its job finished on the restarted tracker).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn watch_follows_a_job_across_a_tracker_restart() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("tt.db");
    let tracker = Tracker::start(&db, Duration::from_secs(5)).await;
    let addr = tracker.url.trim_start_matches("http://").to_owned();
    let mut client = tracker.client().await;
    // A worker registers the device class, then goes: the job waits, queued, for the next one.
    let gone = CancellationToken::new();
    let w = spawn_worker(&tracker.url, "sim-first", &gone);
    wait_workers(&mut client, 1).await;
    gone.cancel();
    w.await.unwrap().unwrap();
    let job_id = client.submit_job(submit(6, 3)).await.unwrap().into_inner().job_id;

    let watcher = tokio::process::Command::new(BIN)
        .args(["--tracker", &tracker.url, "watch", &job_id.to_string(), "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // Time for the CLI to start and open its watch stream, with room for a busy CI machine (a
    // watcher that has not connected when the tracker goes would fail to connect instead).
    tokio::time::sleep(Duration::from_secs(3)).await;
    tracker.stop().await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    let tracker = Tracker::start_on(&addr, &db, Duration::from_secs(5)).await;
    let workers = CancellationToken::new();
    let w = spawn_worker(&tracker.url, "sim-second", &workers);
    let out = tokio::time::timeout(Duration::from_secs(90), watcher.wait_with_output()).await.unwrap().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "watch failed:\n{stdout}\n{stderr}");
    let job: serde_json::Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}:\n{stdout}\n{stderr}"));
    assert_eq!(job["state"], "done", "{job}");
    assert_eq!(job["workloads"][0]["trials_done"], 6);
    workers.cancel();
    w.await.unwrap().unwrap();
    tracker.stop().await;
}

/// A matmul job that names no template on `sim` (an sm_90 device class) searches wmma_gemm and
/// wgmma_gemm in one space, measured end to end by a real sim worker: records of both, each with
/// its own template and a config valid for it, best across them, finalists re-measured with their
/// own templates.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_without_a_template_searches_both_matmul_templates_on_sim() {
    use tensortune_kernels::{Config, Target, registry};
    let dir = tempfile::tempdir().unwrap();
    let tracker = Tracker::start(&dir.path().join("tt.db"), Duration::from_secs(5)).await;
    let mut client = tracker.client().await;
    let workers = CancellationToken::new();
    let w = spawn_worker(&tracker.url, "sim-a", &workers);
    wait_workers(&mut client, 1).await;
    assert_eq!(Target::sim().arch, 90, "sim is an sm_90 device class");

    // grid takes the templates in turns, so 16 trials are 8 of each; 6 finalists of 16 trials.
    let req = pb::SubmitJobRequest { tuner: "grid".into(), finalists: Some(6), ..submit(16, 8) };
    let job_id = client.submit_job(req).await.unwrap().into_inner().job_id;
    let job = wait_done(&mut client, job_id).await;
    assert_eq!(job.state(), pb::JobState::Done, "{job:?}");
    assert_eq!(job.template, "wmma_gemm+wgmma_gemm");
    assert_eq!(job.templates.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["wmma_gemm", "wgmma_gemm"]);
    let records = export(&mut client, job_id).await;
    let tuning: Vec<&pb::Record> = records.iter().filter(|r| !r.remeasure).collect();
    assert_eq!(tuning.len(), 16);
    for name in ["wmma_gemm", "wgmma_gemm"] {
        assert_eq!(tuning.iter().filter(|r| r.template == name).count(), 8, "{name}");
    }
    for r in &records {
        let t = registry::by_name(&r.template).unwrap();
        assert_eq!(r.template_version, t.version());
        let config = Config::from_json(&r.config).unwrap();
        assert_eq!(t.space().index_of(&config).unwrap(), r.config_index, "{} {}", r.template, r.config);
        t.check(&workload(), &config, &Target::sim()).unwrap();
        assert_eq!(r.measurement.as_ref().unwrap().status(), pb::RecordStatus::Ok, "{r:?}");
    }
    // Each finalist was re-measured as its own template's config.
    let progress = &job.workloads[0];
    assert_eq!(progress.finalists.len(), 6);
    for f in &progress.finalists {
        let again = records.iter().find(|r| r.id == f.record_id).unwrap();
        assert!(again.remeasure);
        assert_eq!((again.template.as_str(), again.config.as_str()), (f.template.as_str(), f.config.as_str()));
        assert!(tuning.iter().any(|r| r.template == f.template && r.config == f.config));
    }
    // best answers across both templates: the job's verdict, the winner's re-measurement.
    let verdict = progress.best.as_ref().expect("a done workload has a best record");
    assert!(verdict.remeasure && progress.finalists.iter().any(|f| f.record_id == verdict.id), "{verdict:?}");
    let best = best(&mut client).await;
    assert_eq!(best.len(), 1);
    assert_eq!((best[0].id, best[0].template.as_str()), (verdict.id, verdict.template.as_str()));

    workers.cancel();
    w.await.unwrap().unwrap();
    tracker.stop().await;
}

/// On a tracker with tokens, the CLI and the workers read theirs from a file or the environment;
/// without one the CLI says which token it needs, and a worker token cannot submit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_and_workers_present_tokens_from_files_and_the_environment() {
    use tensortune_tracker::{Role, add_token};
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("tt.db");
    let client_token = add_token(&db, "alice", Role::Client).await.unwrap();
    let worker_token = add_token(&db, "gpu", Role::Worker).await.unwrap();
    let token_file = dir.path().join("alice.token");
    std::fs::write(&token_file, format!("{client_token}\n")).unwrap();
    let tracker = Tracker::start(&db, Duration::from_secs(5)).await;
    let stop = CancellationToken::new();
    let mut config = worker_config(&tracker.url, "gpu");
    config.access = tensortune_proto::access::Access::new(Some(&worker_token), None, None).unwrap();
    let worker = tokio::spawn(tensortune_worker::run(config, stop.child_token()));

    let cli = |args: &[&str], env: &[(&str, &str)]| {
        let mut cmd = std::process::Command::new(BIN);
        cmd.args(["--tracker", &tracker.url]).args(args).env("XDG_CACHE_HOME", dir.path());
        cmd.env_remove("TENSORTUNE_TOKEN").env_remove("TENSORTUNE_TOKEN_FILE");
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    };
    let refused = tokio::task::block_in_place(|| cli(&["jobs"], &[]));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(stderr.contains("requires a token") && stderr.contains("TENSORTUNE_TOKEN_FILE"), "{stderr}");

    // The tune below needs the worker's device class: wait for it to register.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let listed =
            tokio::task::block_in_place(|| cli(&["workers", "--json"], &[("TENSORTUNE_TOKEN", &client_token)]));
        if listed.status.success() && String::from_utf8_lossy(&listed.stdout).contains("online") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the worker did not register: {listed:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let file = token_file.to_str().unwrap();
    let tune = ["tune", "matmul", "--m", "256", "--n", "64", "--k", "256", "--trials", "4", "--seed", "3"];
    let tuned = tokio::task::block_in_place(|| cli(&[&["--token-file", file][..], &tune[..]].concat(), &[]));
    let (stdout, stderr) = (String::from_utf8_lossy(&tuned.stdout), String::from_utf8_lossy(&tuned.stderr));
    assert!(tuned.status.success(), "tune with a token file failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("trials  4/4"), "{stdout}");
    let listed = tokio::task::block_in_place(|| cli(&["jobs"], &[("TENSORTUNE_TOKEN", &client_token)]));
    assert!(listed.status.success(), "{}", String::from_utf8_lossy(&listed.stderr));
    let wrong_role = tokio::task::block_in_place(|| cli(&["jobs"], &[("TENSORTUNE_TOKEN", &worker_token)]));
    let stderr = String::from_utf8_lossy(&wrong_role.stderr);
    assert!(!wrong_role.status.success() && stderr.contains("a worker token may not call Tuning"), "{stderr}");

    stop.cancel();
    worker.await.unwrap().unwrap();
    tracker.stop().await;
}

/// The Python example client (examples/python, stubs generated from proto/tensortune.proto by
/// grpc_tools) submits a job to a tracker on loopback, follows it and reads the best kernel; a bad
/// field comes back from the tracker named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_example_client_tunes_through_the_proto() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/python");
    let setup =
        std::process::Command::new(examples.join("setup.sh")).output().expect("running examples/python/setup.sh");
    assert!(
        setup.status.success(),
        "examples/python/setup.sh (python3 and pip install the client's packages) failed:\n{}",
        String::from_utf8_lossy(&setup.stderr)
    );
    let pythonpath = String::from_utf8(setup.stdout).unwrap().trim().to_owned();

    let dir = tempfile::tempdir().unwrap();
    let tracker = Tracker::start(&dir.path().join("tt.db"), Duration::from_secs(10)).await;
    let mut client = tracker.client().await;
    let workers = CancellationToken::new();
    let worker = spawn_worker(&tracker.url, "py", &workers);
    wait_workers(&mut client, 1).await;

    let python = |args: &[&str]| {
        let addr = tracker.url.trim_start_matches("http://");
        std::process::Command::new("python3")
            .arg(examples.join("tune.py"))
            .args(["--tracker", addr])
            .args(args)
            .env("PYTHONPATH", &pythonpath)
            .env_remove("TENSORTUNE_TOKEN")
            .env_remove("TENSORTUNE_TOKEN_FILE")
            .output()
            .unwrap()
    };
    let out = dir.path().join("best.json");
    let shape = ["--m", "512", "--n", "64", "--k", "512", "--trials", "6", "--tuner", "random", "--seed", "5"];
    let tuned = tokio::task::block_in_place(|| python(&[&shape[..], &["--json", out.to_str().unwrap()]].concat()));
    let stdout = String::from_utf8_lossy(&tuned.stdout);
    assert!(tuned.status.success(), "tune.py failed:\n{stdout}\n{}", String::from_utf8_lossy(&tuned.stderr));
    assert!(stdout.lines().any(|l| l.starts_with("job 1 done: 6/6 ")), "{stdout}");

    // What it wrote is the record QueryBest answers in Rust.
    let view: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let best = best(&mut client).await;
    assert_eq!(best.len(), 1);
    assert_eq!(view["record_id"], best[0].id);
    assert_eq!(view["template"], best[0].template.as_str());
    let config: serde_json::Value = serde_json::from_str(&best[0].config).unwrap();
    assert_eq!(view["config"], config);
    assert_eq!(view["median_us"], best[0].measurement.as_ref().unwrap().median_us);

    let refused = tokio::task::block_in_place(|| python(&["--m", "512", "--n", "64", "--k", "513"]));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("INVALID_ARGUMENT") && stderr.contains("workloads[0].matmul.k"), "{stderr}");

    workers.cancel();
    worker.await.unwrap().unwrap();
    tracker.stop().await;
}

/// The client as a library: connect, submit, wait, best; a refusal names the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_library_client_submits_waits_and_answers_best() {
    use tensortune::api::{Client, JobSpec};
    let dir = tempfile::tempdir().unwrap();
    let tracker = Tracker::start(&dir.path().join("tt.db"), Duration::from_secs(10)).await;
    let mut raw = tracker.client().await;
    let workers = CancellationToken::new();
    let worker = spawn_worker(&tracker.url, "lib", &workers);
    wait_workers(&mut raw, 1).await;

    let mut client = Client::connect(&tracker.url).await.unwrap();
    let spec = JobSpec::new(vec![workload()]).trials(5).tuner("random").seed(3).finalists(0);
    let id = client.submit(spec).await.unwrap();
    let job = client.wait(id).await.unwrap();
    assert_eq!(job.state(), pb::JobState::Done);
    assert_eq!((job.workloads[0].trials_done, job.finalists), (5, 0));
    let best = client.best(&workload(), None).await.unwrap();
    assert_eq!(best.len(), 1);
    assert_eq!(Some(best[0].id), job.workloads[0].best.as_ref().map(|r| r.id));
    assert_eq!(client.job(id).await.unwrap().state(), pb::JobState::Done);

    let refused = client.submit(JobSpec::new(vec![workload()]).trials(0)).await.unwrap_err();
    assert!(format!("{refused:#}").contains("trials"), "{refused:#}");

    workers.cancel();
    worker.await.unwrap().unwrap();
    tracker.stop().await;
}

/// Runs the CLI on database `db` with `dir` as its cache; (success, stdout, stderr).
fn cli_in(dir: &std::path::Path, db: &std::path::Path, args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(BIN)
        .arg("--db")
        .arg(db)
        .args(args)
        .env("XDG_CACHE_HOME", dir)
        .env_remove("TENSORTUNE_TRACKER")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `tensortune plot` draws a job's convergence (from the tracker and from exported records), a
/// bench run's speedups and replayed tuners, as SVG and PNG; bad requests are refused by name.
#[test]
fn plot_draws_jobs_records_benches_and_replays() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("tt.db");
    let cli = |args: &[&str]| cli_in(dir.path(), &db, args);
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_owned();
    let shape = ["--m", "512", "--n", "64", "--k", "512", "--device", "sim", "--tuner", "random", "--seed", "4"];
    let (ok, _, err) = cli(&[&["tune", "matmul", "--trials", "12"][..], &shape[..]].concat());
    assert!(ok, "{err}");

    let (ok, _, err) = cli(&["plot", "--job", "1", "-o", &path("job.svg")]);
    assert!(ok, "{err}");
    let svg = std::fs::read_to_string(path("job.svg")).unwrap();
    assert!(svg.contains("job 1: matmul/m512n64k512/nn/f16,f32,f32"), "{svg}");
    assert!(svg.contains("best kernel") && svg.contains("vendor "), "{svg}");
    assert!(svg.contains("<polyline"), "no line drawn");

    let (ok, _, err) = cli(&["records", "export", "--job", "1", "-o", &path("r.jsonl")]);
    assert!(ok, "{err}");
    let (ok, _, err) = cli(&["plot", "--records", &path("r.jsonl"), "-o", &path("records.png")]);
    assert!(ok, "{err}");
    let png = std::fs::read(path("records.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    // One panel: 560 x 360 pixels (IHDR width and height).
    assert_eq!(
        (u32::from_be_bytes(png[16..20].try_into().unwrap()), u32::from_be_bytes(png[20..24].try_into().unwrap())),
        (560, 360)
    );

    let (ok, _, err) =
        cli(&["plot", "--replay", &path("r.jsonl"), "--seeds", "3", "--budget", "12", "-o", &path("replay.svg")]);
    assert!(ok, "{err}");
    let svg = std::fs::read_to_string(path("replay.svg")).unwrap();
    assert!(svg.contains("random") && svg.contains("model") && svg.contains("best found / true best"), "{svg}");

    let suite = path("suite.json");
    std::fs::write(
        &suite,
        r#"{"name": "two", "workloads": [{"workload": "matmul/m512n64k512/nn/f16,f32,f32/alpha=1,beta=0"},
            {"workload": "matmul/m256n32k256/tn/i8,i32,i32/alpha=1,beta=0"}]}"#,
    )
    .unwrap();
    let (ok, _, err) =
        cli(&["bench", "--suite", &suite, "--device", "sim", "--trials", "3", "--json", &path("bench.json")]);
    assert!(ok, "{err}");
    let (ok, _, err) = cli(&["plot", "--bench", &path("bench.json"), "-o", &path("bench.svg")]);
    assert!(ok, "{err}");
    let svg = std::fs::read_to_string(path("bench.svg")).unwrap();
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path("bench.json")).unwrap()).unwrap();
    for row in report["rows"].as_array().unwrap() {
        let label = format!("{:.2}x", row["speedup"].as_f64().unwrap());
        assert!(svg.contains(&label), "bar label {label} missing");
    }
    assert!(svg.contains("matmul/m256n32k256/tn/i8,i32,i32"));
    // With --db, bench keeps its records in that database (without it, a fresh one beside its JSON).
    let (ok, out, err) = cli(&["records", "export", "--workload", "matmul/m256n32k256/tn/i8,i32,i32/alpha=1,beta=0"]);
    assert!(ok, "{err}");
    assert!(out.lines().count() >= 3, "the bench's records are not in --db: {out:?}");
    assert!(!std::path::Path::new(&path("bench.db")).exists(), "bench made its own database despite --db");

    let (ok, _, err) = cli(&["plot", "--job", "1", "-o", &path("job.pdf")]);
    assert!(!ok && err.contains("invalid --output") && err.contains(".svg or .png"), "{err}");
    let (ok, _, err) = cli(&["plot", "--job", "1", "--workload", "conv2d", "-o", &path("none.svg")]);
    assert!(!ok && err.contains("nothing to plot for --workload \"conv2d\""), "{err}");
    let (ok, _, err) = cli(&["plot", "-o", &path("x.svg")]);
    assert!(!ok && err.contains("--job") && err.contains("--bench"), "{err}");
}

/// Energy and regimes from a sim `tune` to `job`, `best`, `records export` and `plot --pareto`:
/// every record carries its energy, power, clock, temperature and regime; `best` answers per
/// regime; bad flags are refused naming the flag and the allowed values.
#[test]
fn energy_and_the_regime_flow_from_tune_to_best_export_and_the_pareto_plot() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("tt.db");
    let cli = |args: &[&str]| cli_in(dir.path(), &db, args);
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_owned();
    let shape = ["--m", "512", "--n", "64", "--k", "512"];
    let run = ["--device", "sim", "--tuner", "random", "--seed", "4", "--trials", "12"];
    let energy = ["--regime", "sustained", "--objective", "energy", "--max-slowdown", "5%"];
    let (ok, out, err) = cli(&[&["tune", "matmul"][..], &shape[..], &run[..], &energy[..]].concat());
    assert!(ok, "{err}");
    for want in [
        "tuned   sustained regime, objective energy, the least energy within 5.0% of the fastest",
        "  energy  ",
        " mJ/launch  ",
        "(sustained, steady after ",
    ] {
        assert!(out.contains(want), "missing {want:?} in:\n{out}\n{err}");
    }

    let (ok, out, err) = cli(&[&["best", "--json", "matmul"][..], &shape[..], &["--regime", "sustained"][..]].concat());
    assert!(ok, "{err}");
    let best: serde_json::Value = serde_json::from_str(&out).unwrap();
    let r = &best[0];
    assert_eq!(r["regime"], "sustained", "{best}");
    assert!(r["energy_mj"].as_f64().is_some_and(|e| e > 0.0) && r["power_w"].as_f64().is_some_and(|w| w > 0.0), "{r}");
    assert!(r["mean_clock_mhz"].as_f64().is_some() && r["temperature_c"].as_f64().is_some(), "{r}");
    // Only sustained records exist: a burst query has no answer for the shape (a nearest one
    // would be another workload's).
    let (ok, out, err) = cli(&[&["best", "--json", "matmul"][..], &shape[..]].concat());
    assert!(ok, "{err}");
    let burst: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(burst.as_array().map(Vec::len), Some(0), "{burst}");

    let (ok, out, err) = cli(&["records", "export", "--job", "1"]);
    assert!(ok, "{err}");
    let lines: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(lines.len() >= 12, "{out}");
    for l in lines.iter().filter(|l| l["status"] == "ok") {
        assert_eq!(l["regime"], "sustained");
        let (e, w, us) =
            (l["energy_mj"].as_f64().unwrap(), l["power_w"].as_f64().unwrap(), l["median_us"].as_f64().unwrap());
        assert!((e - w * us * 1e-3).abs() < 1e-6 * e.max(1.0), "energy is power x time: {l}");
    }

    let (ok, _, err) = cli(&["plot", "--job", "1", "--pareto", "-o", &path("pareto.svg")]);
    assert!(ok, "{err}");
    let svg = std::fs::read_to_string(path("pareto.svg")).unwrap();
    for want in ["energy per launch (mJ)", "time per launch (us)", "front (", "vendor "] {
        assert!(svg.contains(want), "missing {want:?} in the SVG");
    }
    let (ok, _, err) = cli(&["plot", "--bench", &path("none.json"), "--pareto", "-o", &path("x.svg")]);
    assert!(!ok && err.contains("--pareto"), "{err}");

    let (ok, _, err) = cli(&[&["tune", "matmul"][..], &shape[..], &run[..], &["--regime", "hot"][..]].concat());
    assert!(!ok && err.contains("--regime") && err.contains("burst or sustained"), "{err}");
    let (ok, _, err) = cli(&[&["tune", "matmul"][..], &shape[..], &run[..], &["--max-slowdown", "150%"][..]].concat());
    assert!(!ok && err.contains("--max-slowdown") && err.contains("0 ..= 100%"), "{err}");
    let (ok, _, err) = cli(&[&["tune", "matmul"][..], &shape[..], &run[..], &["--objective", "watts"][..]].concat());
    assert!(!ok && err.contains("--objective") && err.contains("time, energy or edp"), "{err}");
}

/// `tensortune export` on sim: two tuned workloads (one of them on the TMA template) become a
/// bundle whose manifest the bundle crate reads back, with every launch fact equal to the kernel
/// the generator makes for the record, cubins when NVRTC is reachable, and a nearest-shape
/// lookup that picks the right entry and says so. A workload without a record is named.
#[test]
fn export_writes_a_bundle_the_bundle_crate_reads_back() {
    use tensortune_bundle::{Bundle, MapRecipe, Operand, Param, select};
    use tensortune_kernels::{Arg, Config, Target, TensorOperand, registry};

    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("tt.db");
    let cli = |args: &[&str]| {
        std::process::Command::new(BIN)
            .args(["--db", db.to_str().unwrap()])
            .args(args)
            .env("XDG_CACHE_HOME", dir.path())
            .output()
            .unwrap()
    };
    let wmma = "matmul/m256n128k256/nn/f16,f32,f32/alpha=1,beta=0";
    let wgmma = "matmul/m512n256k512/tn/f16,f32,f32/alpha=1,beta=0.5";
    for args in [
        &["tune", "matmul", "--m", "256", "--n", "128", "--k", "256", "--template", "wmma_gemm"][..],
        &[
            "tune",
            "matmul",
            "--m",
            "512",
            "--n",
            "256",
            "--k",
            "512",
            "--layout",
            "tn",
            "--beta",
            "0.5",
            "--template",
            "wgmma_gemm",
        ][..],
        &[
            "tune",
            "conv2d",
            "--n",
            "2",
            "--h",
            "9",
            "--w",
            "9",
            "--c",
            "64",
            "--k",
            "64",
            "--r",
            "3",
            "--s",
            "3",
            "--pad",
            "1",
            "--stride",
            "2",
            "--template",
            "wgmma_conv2d",
        ][..],
        &[
            "tune",
            "matmul",
            "--m",
            "256",
            "--n",
            "128",
            "--k",
            "256",
            "--layout",
            "tn",
            "--dtype",
            "f32",
            "--allow-tf32",
            "--template",
            "wgmma_gemm",
        ][..],
    ] {
        let out = cli(&[args, &["--trials", "6", "--seed", "3", "--device", "sim", "--compile-threads", "1"]].concat());
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }

    let missing = "matmul/m333n128k256/nn/f16,f32,f32/alpha=1,beta=0";
    let bundle_dir = dir.path().join("bundle");
    let out = cli(&["export", "--workload", wmma, "--workload", missing, "-o", bundle_dir.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains(missing) && stderr.contains("no trusted ok record"), "{stderr}");
    assert!(!bundle_dir.exists(), "nothing is written when a workload has no record");

    let nvrtc = tensortune_worker::nvrtc::available() && tensortune_worker::nvrtc::find_include_dir().is_some();
    // `tune conv2d` with f16 writes f16 (its default output, as cuDNN's).
    let conv = "conv2d/n2h9w9c64/k64r3s3/pad1x1,stride2x2,dil1x1/nhwc/f16,f32,f16";
    let tf32 = "matmul/m256n128k256/tn/tf32,f32,f32/alpha=1,beta=0";
    let mut args = vec![
        "export",
        "--workload",
        wmma,
        "--workload",
        wgmma,
        "--workload",
        conv,
        "--workload",
        tf32,
        "-o",
        bundle_dir.to_str().unwrap(),
        "--json",
    ];
    if !nvrtc {
        args.push("--no-cubin");
    }
    let out = cli(&args);
    assert!(out.status.success(), "export: {}", String::from_utf8_lossy(&out.stderr));
    let printed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(printed["format"], 1);

    let bundle = Bundle::open(&bundle_dir).unwrap();
    let m = &bundle.manifest;
    assert_eq!(m.kernels.len(), 4, "one entry per workload on the one class");
    let index = std::fs::read_to_string(bundle_dir.join("index.txt")).unwrap();
    assert_eq!(index, Bundle::index_text(m));
    for e in &m.kernels {
        assert_eq!(e.device.class_key, "sim");
        let workload = Workload::from_key(&e.workload_key).unwrap();
        let t = registry::by_name(&e.template).unwrap();
        assert_eq!(t.version(), e.template_version);
        let config = Config::from_json(&e.config.to_string()).unwrap();
        let spec = t.generate(&workload, &config, &Target::sim()).unwrap();
        assert_eq!(std::fs::read_to_string(bundle_dir.join(&e.source)).unwrap(), spec.source);
        assert_eq!((e.entry.as_str(), e.launch.grid, e.launch.block), (spec.entry.as_str(), spec.grid, spec.block));
        assert_eq!((e.launch.dynamic_smem_bytes, e.workspace_bytes), (spec.smem_bytes, spec.workspace_bytes));
        assert_eq!(e.params.len(), spec.args.len());
        for (p, a) in e.params.iter().zip(&spec.args) {
            let ok = match (p, a) {
                (Param::Pointer { operand: Operand::A }, Arg::A)
                | (Param::Pointer { operand: Operand::B }, Arg::B)
                | (Param::Pointer { operand: Operand::C }, Arg::C)
                | (Param::Pointer { operand: Operand::D }, Arg::D)
                | (Param::Pointer { operand: Operand::Workspace }, Arg::Workspace) => true,
                (Param::TensorMap(MapRecipe { operand, dims, strides_bytes, box_dims, .. }), Arg::Map(map)) => {
                    let same_operand = matches!(
                        (operand, map.operand),
                        (Operand::A, TensorOperand::A)
                            | (Operand::B, TensorOperand::B)
                            | (Operand::C, TensorOperand::C)
                            | (Operand::D, TensorOperand::D)
                    );
                    same_operand && *dims == map.dims && strides_bytes[0] == map.row_bytes && *box_dims == map.box_dims
                }
                (Param::Im2colMap(r), Arg::Im2col(map)) => {
                    r.operand == Operand::A
                        && map.operand == TensorOperand::A
                        && (r.dims, r.strides_bytes, r.element_strides)
                            == (map.dims, map.strides_bytes, map.element_strides)
                        && (r.lower_corner, r.upper_corner) == (map.lower, map.upper)
                        && (r.channels_per_pixel, r.pixels_per_column) == (map.channels, map.pixels)
                }
                _ => false,
            };
            assert!(ok, "{}: parameter {p:?} is not the generator's {a:?}", e.name);
        }
        assert!(e.time_us > 0.0 && e.provenance.record_id > 0 && e.vendor_us.is_some(), "{e:?}");
        if nvrtc {
            let cubin = std::fs::read(bundle_dir.join(e.cubin_for(90).expect("an sm_90a cubin"))).unwrap();
            assert_eq!(&cubin[..4], b"\x7fELF");
        } else {
            assert!(e.cubins.is_empty());
        }
    }
    let im2col = m.kernels.iter().find(|e| e.workload_key == conv).unwrap();
    assert!(
        im2col.params.iter().any(|p| matches!(p, Param::Im2colMap(r) if r.element_strides == [1, 2, 2, 1])),
        "the stride-2 3x3 layer of 64 channels loads its input by an im2col map: {:?}",
        im2col.params
    );
    // The tf32 kernel states tf32 in its problem, its maps copy f32, and an exact-f32 problem of
    // its shape finds nothing (it would get TF32's rounding).
    let t = m.kernels.iter().find(|e| e.workload_key == tf32).unwrap();
    assert!(matches!(t.problem, tensortune_bundle::Problem::Matmul { input: tensortune_bundle::DType::Tf32, .. }));
    assert!(t.params.iter().any(|p| matches!(p, Param::TensorMap(r) if r.dtype == tensortune_bundle::DType::F32)));
    let exact =
        tensortune::export::problem(&Workload::from_key("matmul/m256n128k256/tn/f32,f32,f32/alpha=1,beta=0").unwrap());
    assert!(select(m, &exact, 90, 132).is_none_or(|s| s.entry.workload_key != tf32));
    let tma = m.kernels.iter().find(|e| e.template == "wgmma_gemm" && e.workload_key == wgmma).unwrap();
    assert!(tma.params.iter().any(|p| matches!(p, Param::TensorMap(_))), "the wgmma kernel takes tensor maps");
    assert!(tma.launch.grid.iter().zip(tma.launch.cluster).all(|(g, c)| g % c == 0));

    // Lookups: exact, nearest (flagged), none of another layout.
    let problem = |key: &str| tensortune::export::problem(&Workload::from_key(key).unwrap());
    let s = select(m, &problem(wmma), 90, 132).unwrap();
    assert_eq!((s.entry.workload_key.as_str(), s.nearest), (wmma, false));
    let s = select(m, &problem("matmul/m240n120k300/nn/f16,f32,f32/alpha=1,beta=0"), 90, 132).unwrap();
    assert_eq!((s.entry.workload_key.as_str(), s.nearest), (wmma, true));
    let s = select(m, &problem("matmul/m500n250k500/tn/f16,f32,f32/alpha=1,beta=0.5"), 90, 132).unwrap();
    assert_eq!((s.entry.workload_key.as_str(), s.nearest), (wgmma, true));
    assert!(select(m, &problem("matmul/m256n128k256/tt/f16,f32,f32/alpha=1,beta=0"), 90, 132).is_none());

    // The C loader reads the same bundle: its parse of index.txt equals the manifest, and its
    // lookups agree with the crate's (compiled with the system C compiler against the CUDA
    // headers NVRTC uses; skipped, and said so, where either is missing).
    let include = tensortune_worker::nvrtc::find_include_dir().filter(|d| d.join("cuda.h").is_file());
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let c_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../bundle/c");
    let exe = dir.path().join("index_check");
    let built = include.as_ref().and_then(|inc| {
        std::process::Command::new(&cc)
            .args(["-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-I"])
            .arg(&c_dir)
            .arg("-I")
            .arg(inc)
            .arg(c_dir.join("index_check.c"))
            .args(["-lm", "-o"])
            .arg(&exe)
            .output()
            .ok()
    });
    match built {
        Some(out) if out.status.success() => {
            let run = |args: &[&str]| {
                let out = std::process::Command::new(&exe).arg(&bundle_dir).args(args).output().unwrap();
                assert!(out.status.success(), "index_check {args:?}: {}", String::from_utf8_lossy(&out.stderr));
                String::from_utf8(out.stdout).unwrap()
            };
            let dump = run(&[]);
            let lines: Vec<&str> = dump.lines().collect();
            assert_eq!(lines.len(), m.kernels.len(), "{dump}");
            for (line, e) in lines.iter().zip(&m.kernels) {
                let l = &e.launch;
                let mut want = format!(
                    "{} {} {} {},{},{} {},{},{} {} {},{},{} {} {}",
                    e.name,
                    e.entry,
                    e.problem.op(),
                    l.grid[0],
                    l.grid[1],
                    l.grid[2],
                    l.block[0],
                    l.block[1],
                    l.block[2],
                    l.dynamic_smem_bytes,
                    l.cluster[0],
                    l.cluster[1],
                    l.cluster[2],
                    e.workspace_bytes,
                    e.cubin_for(90).unwrap_or("-")
                );
                for p in &e.params {
                    match p {
                        Param::Pointer { operand } => want += &format!(" ptr:{}", operand.name()),
                        Param::TensorMap(r) => {
                            want += &format!(
                                " map:{}:{}:{},{}:{}:{},{}",
                                r.operand.name(),
                                r.dtype.name(),
                                r.dims[0],
                                r.dims[1],
                                r.strides_bytes[0],
                                r.box_dims[0],
                                r.box_dims[1]
                            )
                        }
                        Param::Im2colMap(r) => {
                            let j = |v: &[i64]| v.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
                            want += &format!(
                                " im2col:{}:{}:{}:{}:{}:{}:{},{}:{}",
                                r.operand.name(),
                                r.dtype.name(),
                                j(&r.dims.map(|v| v as i64)),
                                j(&r.strides_bytes.map(|v| v as i64)),
                                j(&r.lower_corner.map(i64::from)),
                                j(&r.upper_corner.map(i64::from)),
                                r.channels_per_pixel,
                                r.pixels_per_column,
                                j(&r.element_strides.map(i64::from)),
                            )
                        }
                    }
                }
                // What the vendor time is, whitespace collapsed (a check times the same call).
                want += &format!(" vendor:{}", e.vendor_kind.split_whitespace().collect::<Vec<_>>().join(" "));
                assert_eq!(*line, want);
            }
            for (key, arch, sms) in [
                (wmma, 90, 132),
                ("matmul/m240n120k300/nn/f16,f32,f32/alpha=1,beta=0", 90, 132),
                ("matmul/m500n250k500/tn/f16,f32,f32/alpha=1,beta=0.5", 90, 114),
                ("matmul/m500n250k500/tn/f16,f32,f32/alpha=1,beta=0", 90, 132),
                ("matmul/m256n128k256/tt/f16,f32,f32/alpha=1,beta=0", 90, 132),
                (wmma, 80, 108),
                (tf32, 90, 132),
                ("matmul/m256n128k256/tn/f32,f32,f32/alpha=1,beta=0", 90, 132),
            ] {
                let w = Workload::from_key(key).unwrap();
                let Workload::Matmul(mm) = w else { unreachable!() };
                let t = mm.types;
                let query = [
                    mm.m.to_string(),
                    mm.n.to_string(),
                    mm.k.to_string(),
                    mm.layout.to_string(),
                    t.input.to_string(),
                    t.accumulator.to_string(),
                    t.output.to_string(),
                    mm.alpha.to_string(),
                    mm.beta.to_string(),
                    arch.to_string(),
                    sms.to_string(),
                ];
                let got = run(&query.iter().map(String::as_str).collect::<Vec<_>>());
                let want = match select(m, &tensortune::export::problem(&w), arch, sms) {
                    // Without cubins the crate matches on the tuning arch; the C loader needs a cubin.
                    Some(s) if nvrtc => format!("{} {}\n", s.entry.name, if s.nearest { "nearest" } else { "exact" }),
                    _ => "none\n".to_string(),
                };
                assert_eq!(got, want, "{key} on sm_{arch}");
            }
        }
        Some(out) => panic!("{cc} could not build index_check.c:\n{}", String::from_utf8_lossy(&out.stderr)),
        None => eprintln!("skipped the C loader's check: no {cc} or no cuda.h"),
    }

    // best offers the nearest tuned shape, marked, in JSON and in the table (`best`'s --json goes
    // before the workload: after it, --json is the workload's JSON output file of `tune`).
    let out = cli(&["best", "--json", "matmul", "--m", "240", "--n", "120", "--k", "300"]);
    let best: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((best[0]["workload"].as_str(), best[0]["nearest"].as_bool()), (Some(wmma), Some(true)), "{best}");
    let out = cli(&["best", "--json", "matmul", "--m", "256", "--n", "128", "--k", "256"]);
    let best: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(best[0]["nearest"].as_bool(), Some(false), "{best}");
    let out = cli(&["best", "matmul", "--m", "240", "--n", "120", "--k", "300"]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains(&format!("NEAREST tuned shape {wmma}")), "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_given_several_trackers_uses_the_first_that_answers() {
    let dir = tempfile::tempdir().unwrap();
    let tracker = Tracker::start(&dir.path().join("tt.db"), Duration::from_secs(5)).await;
    // Ports nothing listens on: trackers that are down. Each stays bound (not listening) to the end,
    // so no tracker another test starts meanwhile can take it (a port freed at once could be).
    let dead = || {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let port = socket.local_addr().unwrap().port();
        (socket, port)
    };
    let ((_held_a, a), (_held_b, b)) = (dead(), dead());
    let list = format!("http://127.0.0.1:{a},{}", tracker.url);
    let mut client = tensortune::api::Client::connect(&list).await.unwrap();
    let err = client.job(7).await.unwrap_err().to_string();
    assert!(err.contains("7"), "the tracker that answered does not know job 7: {err}");

    let none = format!("http://127.0.0.1:{a},http://127.0.0.1:{b}");
    let err = tensortune::api::Client::connect(&none).await.err().expect("no tracker answers").to_string();
    assert!(err.contains("cannot reach any tracker") && err.contains(&format!(":{b}")), "{err}");
    tracker.stop().await;
}

/// Issue 13's types on sim through the real tracker, worker daemon and measuring child (NVRTC
/// compiling each kernel where it is reachable): one job of an exact-f32, a tf32 and an s4
/// workload that names no template searches simt_gemm for the first and mma_ext_gemm for the
/// others; every record is ok and of the template that takes its workload, and `best` answers
/// each workload with a record of its own key (tf32 and f32 never mix).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_of_f32_tf32_and_s4_workloads_tunes_on_sim() {
    let dir = tempfile::tempdir().unwrap();
    let tracker = Tracker::start(&dir.path().join("tt.db"), Duration::from_secs(5)).await;
    let mut client = tracker.client().await;
    let workers = CancellationToken::new();
    let w = spawn_worker(&tracker.url, "sim-types", &workers);
    wait_workers(&mut client, 1).await;

    let matmul = |input, layout, k| {
        Workload::Matmul(Matmul::new(512, 64, k, layout, Types::default_for(input).unwrap()).unwrap())
    };
    let loads = [
        (matmul(DType::F32, Layout::Nn, 512), "simt_gemm"),
        (matmul(DType::Tf32, Layout::Nn, 512), "mma_ext_gemm"),
        (matmul(DType::S4, Layout::Tn, 4096), "mma_ext_gemm"),
    ];
    let req = pb::SubmitJobRequest {
        workloads: loads.iter().map(|(w, _)| pb::Workload::from(w)).collect(),
        finalists: Some(0),
        ..submit(6, 3)
    };
    let job_id = client.submit_job(req).await.unwrap().into_inner().job_id;
    let job = wait_done(&mut client, job_id).await;
    assert_eq!(job.state(), pb::JobState::Done, "{job:?}");
    assert_eq!(job.template, "simt_gemm+mma_ext_gemm");
    let records = export(&mut client, job_id).await;
    for (workload, template) in &loads {
        let key = workload.key();
        let mine: Vec<&pb::Record> = records.iter().filter(|r| r.workload_key == key && !r.remeasure).collect();
        assert_eq!(mine.len(), 6, "{key}: {} records", mine.len());
        for r in &mine {
            assert_eq!(r.template, *template, "{key}");
            assert_eq!(r.measurement.as_ref().unwrap().status(), pb::RecordStatus::Ok, "{r:?}");
        }
        let req = pb::QueryBestRequest { workload: Some(pb::Workload::from(workload)), ..Default::default() };
        let best = client.query_best(req).await.unwrap().into_inner().best;
        assert_eq!(best.len(), 1, "{key}");
        assert_eq!((best[0].workload_key.as_str(), best[0].template.as_str()), (key.as_str(), *template));
    }

    workers.cancel();
    w.await.unwrap().unwrap();
    tracker.stop().await;
}

/// How the CLI names a conv2d job's union of templates on `sim` (an sm_90 class), with the
/// versions this build generates.
fn conv_templates_on_sim() -> String {
    use tensortune_kernels::registry::by_name;
    let v = |name: &str| by_name(name).map(|t| t.version()).unwrap();
    format!("wmma_conv2d v{} + wgmma_conv2d v{} on sim", v("wmma_conv2d"), v("wgmma_conv2d"))
}

/// `tensortune selftest --device sim`: real generation and NVRTC compiles of every template that
/// takes each workload, the sim's check of each cubin, a table, the JSON report; bad flags are
/// named; one config alone is checked and timed.
#[test]
fn selftest_on_sim_checks_every_template_of_each_workload() {
    let dir = tempfile::tempdir().unwrap();
    let nvrtc = tensortune_worker::nvrtc::available() && tensortune_worker::nvrtc::find_include_dir().is_some();
    let selftest = |args: &[&str]| {
        let out = std::process::Command::new(BIN)
            .args(["selftest", "--device", "sim"])
            .args(args)
            .env("XDG_CACHE_HOME", dir.path())
            .output()
            .unwrap();
        let text = format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        (out.status.success(), text)
    };
    let f32_gemm = "matmul/m256n256k256/nn/f32,f32,f32/alpha=1,beta=0";
    let tf32_conv = "conv2d/n2h7w5c16/k24r3s3/pad1x1,stride1x1,dil1x1/nhwc/tf32,f32,f32";
    let f16_gemm = "matmul/m512n64k512/nn/f16,f32,f32/alpha=1,beta=0";
    if !nvrtc {
        assert!(
            std::env::var_os("TENSORTUNE_REQUIRE_NVRTC").is_none(),
            "TENSORTUNE_REQUIRE_NVRTC is set but NVRTC is missing"
        );
        let (ok, text) = selftest(&["--workload", f32_gemm]);
        assert!(!ok && text.contains("libnvrtc was not found"), "{text}");
        return;
    }
    let json = dir.path().join("selftest.json");
    let (ok, text) = selftest(&[
        "--workload",
        f32_gemm,
        "--workload",
        tf32_conv,
        "--workload",
        f16_gemm,
        "--dtype",
        "f32,tf32",
        "--configs",
        "2",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(ok, "{text}");
    for want in ["not checked (sim", "simt_gemm", "wmma_conv2d", "wgmma_conv2d", "total: 6 ok, 0 failed"] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
    assert!(!text.contains("m512n64k512"), "--dtype left the f16 workload in:\n{text}");
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["verified"], false);
    let rows = report["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 3, "{report}");
    for row in rows {
        assert_eq!(
            (row["configs"].as_u64(), row["ok"].as_u64(), row["failed"].as_u64()),
            (Some(2), Some(2), Some(0)),
            "{row}"
        );
    }
    let checks = report["checks"].as_array().unwrap();
    assert_eq!(checks.len(), 6);
    assert!(
        checks.iter().all(|c| c["status"] == "ok" && c["median_us"].as_f64().is_some_and(|us| us > 0.0)),
        "{report}"
    );

    // One config alone: checked and timed, or refused with the template's reason.
    let w = Workload::from_key(f32_gemm).unwrap();
    let simt = tensortune_kernels::registry::by_name("simt_gemm").unwrap();
    let (_, config) = tensortune_kernels::template::valid_configs(simt, &w, &tensortune_kernels::Target::sim())
        .unwrap()
        .into_iter()
        .next()
        .unwrap();
    let (ok, text) = selftest(&["--workload", f32_gemm, "--template", "simt_gemm", "--config", &config.to_json()]);
    assert!(ok && text.contains(": ok ") && text.contains(" us"), "{text}");
    let (ok, text) = selftest(&["--workload", f32_gemm, "--template", "simt_gemm", "--config", r#"{"nope":1}"#]);
    assert!(!ok && text.contains("invalid_config") && text.contains("1 of 1"), "{text}");

    // Chosen kernels from a list, timed as sustained trials: each settled first, with its energy.
    let list = dir.path().join("list.tsv");
    let lines: Vec<String> = tensortune_kernels::template::valid_configs(simt, &w, &tensortune_kernels::Target::sim())
        .unwrap()
        .iter()
        .take(2)
        .map(|(_, c)| format!("{f32_gemm}\tsimt_gemm\t{}", c.to_json()))
        .collect();
    std::fs::write(&list, format!("# two finalists\n{}\n", lines.join("\n"))).unwrap();
    let listed = dir.path().join("listed.json");
    let (ok, text) =
        selftest(&["--list", list.to_str().unwrap(), "--regime", "sustained", "--json", listed.to_str().unwrap()]);
    assert!(ok && text.contains("total: 2 ok, 0 failed"), "{text}");
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&listed).unwrap()).unwrap();
    let checks = report["checks"].as_array().unwrap();
    assert_eq!(checks.len(), 2, "{report}");
    assert!(
        checks.iter().all(|c| c["settle_ms"].as_f64().is_some_and(|ms| ms > 0.0) && c["energy_mj"].as_f64().is_some()),
        "{report}"
    );
    let (ok, text) = selftest(&["--list", list.to_str().unwrap(), "--workload", f32_gemm]);
    assert!(!ok && text.contains("--workload"), "{text}");

    // Bad flags are named, with what is allowed.
    let (ok, text) = selftest(&["--template", "wgmma_gemm", "--knob", "producer:psychic"]);
    assert!(!ok && text.contains("--knob producer:psychic") && text.contains("takes"), "{text}");
    let (ok, text) = selftest(&["--knob", "producer:tma"]);
    assert!(!ok && text.contains("--template"), "{text}");
    let (ok, text) = selftest(&["--dtype", "f7"]);
    assert!(!ok && text.contains("f7"), "{text}");
}
