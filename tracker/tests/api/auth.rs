//! Tokens, roles, TLS and mutual TLS, forged and implausible reports, quarantine.

use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair};
use tempfile::TempDir;
use tensortune_kernels::Target;
use tensortune_proto::access::{Access, Authed};
use tensortune_proto::convert::device_from_target;
use tensortune_proto::pb;
use tensortune_proto::pb::dispatch_client::DispatchClient;
use tensortune_proto::pb::tuning_client::TuningClient;
use tensortune_tracker::{Role, ServerTls, TrackerConfig, add_token, revoke_token};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::Code;

use crate::harness::{
    FakeWorker, PATIENCE, TestTracker, all_records, config, get_job, is_finalist, job, job_with_finalists, matmul, ok,
    registration, sim_device,
};

/// A tracker whose database holds a token of each role (and a second client and worker).
struct Secured {
    tracker: TestTracker,
    _dir: TempDir,
    db: std::path::PathBuf,
    admin: String,
    client: String,
    other_client: String,
    worker: String,
    other_worker: String,
}

async fn secured(cfg: impl FnOnce(&TempDir) -> TrackerConfig) -> Secured {
    let dir = TempDir::new().unwrap();
    let cfg = cfg(&dir);
    let db = cfg.db.clone();
    let admin = add_token(&db, "root", Role::Admin).await.unwrap();
    let client = add_token(&db, "alice", Role::Client).await.unwrap();
    let other_client = add_token(&db, "bob", Role::Client).await.unwrap();
    let worker = add_token(&db, "gpu-1", Role::Worker).await.unwrap();
    let other_worker = add_token(&db, "gpu-2", Role::Worker).await.unwrap();
    let tracker = TestTracker::start(cfg).await;
    Secured { tracker, _dir: dir, db, admin, client, other_client, worker, other_worker }
}

async fn tuning(addr: &str, token: Option<&str>) -> TuningClient<Authed> {
    let access = Access::new(token, None, None).unwrap();
    let channel = access.endpoint(addr).unwrap().connect().await.unwrap();
    TuningClient::with_interceptor(channel, access.bearer())
}

async fn dispatch(addr: &str, token: Option<&str>) -> DispatchClient<Authed> {
    let access = Access::new(token, None, None).unwrap();
    let channel = access.endpoint(addr).unwrap().connect().await.unwrap();
    DispatchClient::with_interceptor(channel, access.bearer())
}

fn code<T>(r: Result<T, tonic::Status>) -> Code {
    match r {
        Ok(_) => Code::Ok,
        Err(s) => s.code(),
    }
}

/// The code of every Tuning rpc, called with harmless arguments.
async fn tuning_codes(c: &mut TuningClient<Authed>) -> Vec<(&'static str, Code)> {
    vec![
        ("SubmitJob", code(c.submit_job(job(vec![matmul(64, 64, 64)], 2, 1)).await)),
        ("GetJob", code(c.get_job(pb::JobRef { job_id: 999 }).await)),
        ("WatchJob", code(c.watch_job(pb::JobRef { job_id: 999 }).await)),
        ("CancelJob", code(c.cancel_job(pb::JobRef { job_id: 999 }).await)),
        ("ListJobs", code(c.list_jobs(pb::ListJobsRequest::default()).await)),
        (
            "QueryBest",
            code(c.query_best(pb::QueryBestRequest { workload: Some(matmul(64, 64, 64)), ..Default::default() }).await),
        ),
        ("ListWorkers", code(c.list_workers(pb::ListWorkersRequest {}).await)),
        ("ExportRecords", code(c.export_records(pb::ExportRecordsRequest::default()).await)),
        (
            "QuarantineWorker",
            code(c.quarantine_worker(pb::QuarantineWorkerRequest { worker_id: 999, reason: "x".into() }).await),
        ),
    ]
}

/// The code of every Dispatch rpc, called with harmless arguments.
async fn dispatch_codes(c: &mut DispatchClient<Authed>) -> Vec<(&'static str, Code)> {
    vec![
        ("Register", code(c.register(registration("probe", sim_device())).await)),
        ("Heartbeat", code(c.heartbeat(pb::HeartbeatRequest { worker_id: 999, ..Default::default() }).await)),
        ("LeaseTasks", code(c.lease_tasks(pb::LeaseTasksRequest { worker_id: 999, max_tasks: 1, wait_ms: 0 }).await)),
        (
            "ReportResult",
            code(
                c.report_result(pb::ReportResultRequest {
                    worker_id: 999,
                    task_id: 999,
                    lease_serial: 1,
                    measurement: Some(ok(5.0)),
                    ..Default::default()
                })
                .await,
            ),
        ),
    ]
}

fn assert_all(codes: &[(&str, Code)], want: Code, who: &str) {
    for (rpc, got) in codes {
        assert_eq!(*got, want, "{rpc} {who}: {codes:?}");
    }
}

#[tokio::test]
async fn every_rpc_needs_a_token_of_its_role() {
    let s = secured(config).await;
    let addr = &s.tracker.addr;

    // No token, a malformed one, an unknown one: Unauthenticated everywhere.
    for token in [None, Some("tt_1_not-the-secret"), Some("tt_999_abc")] {
        assert_all(&tuning_codes(&mut tuning(addr, token).await).await, Code::Unauthenticated, &format!("{token:?}"));
        assert_all(
            &dispatch_codes(&mut dispatch(addr, token).await).await,
            Code::Unauthenticated,
            &format!("{token:?}"),
        );
    }
    let e = tuning(addr, None).await.list_jobs(pb::ListJobsRequest::default()).await.unwrap_err();
    assert!(e.message().contains("requires a token") && e.message().contains("TENSORTUNE_TOKEN_FILE"), "{e}");

    // The wrong role: PermissionDenied, with the roles the service takes.
    assert_all(&tuning_codes(&mut tuning(addr, Some(&s.worker)).await).await, Code::PermissionDenied, "worker");
    assert_all(&dispatch_codes(&mut dispatch(addr, Some(&s.client)).await).await, Code::PermissionDenied, "client");
    let e = dispatch(addr, Some(&s.client)).await.register(registration("x", sim_device())).await.unwrap_err();
    assert!(e.message().contains("a client token may not call Dispatch"), "{e}");

    // The right role passes the gate (the calls then fail or succeed on their own merits); the
    // worker first, so that jobs have a device class.
    for (rpc, got) in dispatch_codes(&mut dispatch(addr, Some(&s.worker)).await).await {
        let want = if rpc == "Register" { Code::Ok } else { Code::NotFound };
        assert_eq!(got, want, "{rpc} as a worker");
    }
    for (rpc, got) in tuning_codes(&mut tuning(addr, Some(&s.client)).await).await {
        let want = match rpc {
            "QuarantineWorker" => Code::PermissionDenied,
            "GetJob" | "WatchJob" | "CancelJob" => Code::NotFound,
            _ => Code::Ok,
        };
        assert_eq!(got, want, "{rpc} as a client");
    }
    for (rpc, got) in tuning_codes(&mut tuning(addr, Some(&s.admin)).await).await {
        let want = match rpc {
            "GetJob" | "WatchJob" | "CancelJob" | "QuarantineWorker" => Code::NotFound,
            _ => Code::Ok,
        };
        assert_eq!(got, want, "{rpc} as an admin");
    }

    // A revoked token stops working on the running tracker within its refresh.
    assert!(revoke_token(&s.db, "alice").await.unwrap());
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let r = tuning(addr, Some(&s.client)).await.list_jobs(pb::ListJobsRequest::default()).await;
        if let Err(e) = r {
            assert_eq!(e.code(), Code::Unauthenticated);
            assert!(e.message().contains("revoked"), "{e}");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "revocation never took effect");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    s.tracker.stop().await;
}

#[tokio::test]
async fn tokens_own_their_jobs_and_workers() {
    let s = secured(config).await;
    let addr = &s.tracker.addr;
    let mut gpu = dispatch(addr, Some(&s.worker)).await;
    let worker_id = gpu.register(registration("gpu-1", sim_device())).await.unwrap().into_inner().worker_id;

    let mut alice = tuning(addr, Some(&s.client)).await;
    let job_id = alice.submit_job(job(vec![matmul(128, 128, 128)], 3, 1)).await.unwrap().into_inner().job_id;
    // Bob may read Alice's job but not cancel it; an admin may.
    let mut bob = tuning(addr, Some(&s.other_client)).await;
    bob.get_job(pb::JobRef { job_id }).await.unwrap();
    let e = bob.cancel_job(pb::JobRef { job_id }).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    assert!(e.message().contains("another token"), "{e}");

    // Another worker token cannot act for worker 1, not even by re-registering as it.
    let mut intruder = dispatch(addr, Some(&s.other_worker)).await;
    let lease = pb::LeaseTasksRequest { worker_id, max_tasks: 1, wait_ms: 0 };
    assert_eq!(intruder.lease_tasks(lease).await.unwrap_err().code(), Code::PermissionDenied);
    let req = pb::HeartbeatRequest { worker_id, ..Default::default() };
    assert_eq!(intruder.heartbeat(req).await.unwrap_err().code(), Code::PermissionDenied);
    let again = pb::RegisterRequest { previous_id: worker_id, ..registration("gpu-1", sim_device()) };
    assert_eq!(intruder.register(again).await.unwrap_err().code(), Code::PermissionDenied);

    // The rightful worker measures; its record names its token.
    let task = gpu.lease_tasks(lease).await.unwrap().into_inner().tasks.remove(0);
    let forged = pb::ReportResultRequest {
        worker_id,
        task_id: task.task_id,
        lease_serial: task.lease_serial,
        measurement: Some(ok(4.0)),
        ..Default::default()
    };
    assert_eq!(intruder.report_result(forged.clone()).await.unwrap_err().code(), Code::PermissionDenied);
    gpu.report_result(forged).await.unwrap();
    let records: Vec<pb::Record> = {
        let mut stream = alice.export_records(pb::ExportRecordsRequest::default()).await.unwrap().into_inner();
        let mut out = Vec::new();
        while let Some(r) = stream.message().await.unwrap() {
            out.push(r);
        }
        out
    };
    assert_eq!(records.len(), 1);
    let workers = alice.list_workers(pb::ListWorkersRequest {}).await.unwrap().into_inner().workers;
    assert_eq!(records[0].token_id, workers[0].token_id);
    assert_ne!(records[0].token_id, 0);

    alice.cancel_job(pb::JobRef { job_id }).await.unwrap();
    s.tracker.stop().await;
}

#[tokio::test]
async fn forged_reports_are_refused_and_leave_no_record() {
    let dir = TempDir::new().unwrap();
    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    let mut a = tracker.dispatch().await;
    let mut b = tracker.dispatch().await;
    let a_id = a.register(registration("a", sim_device())).await.unwrap().into_inner().worker_id;
    let b_id = b.register(registration("b", sim_device())).await.unwrap().into_inner().worker_id;
    tuning.submit_job(job(vec![matmul(128, 128, 128)], 4, 2)).await.unwrap();
    let leased = a.lease_tasks(pb::LeaseTasksRequest { worker_id: a_id, max_tasks: 2, wait_ms: 5000 }).await;
    let tasks = leased.unwrap().into_inner().tasks;
    assert!(!tasks.is_empty());
    let task = &tasks[0];
    let report = |worker_id: u64, lease_serial: u32| pb::ReportResultRequest {
        worker_id,
        task_id: task.task_id,
        lease_serial,
        measurement: Some(ok(1.0)),
        ..Default::default()
    };
    // Another worker, a serial of no lease, a serial never handed out, an unknown task.
    let cases = [
        ("wrong worker", report(b_id, task.lease_serial), Code::FailedPrecondition),
        ("serial 0", report(a_id, 0), Code::InvalidArgument),
        ("future serial", report(a_id, task.lease_serial + 1), Code::InvalidArgument),
        ("unknown task", pb::ReportResultRequest { task_id: 1 << 40, ..report(a_id, 1) }, Code::NotFound),
    ];
    for (what, req, want) in cases {
        let e = b.report_result(req).await.unwrap_err();
        assert_eq!(e.code(), want, "{what}: {e}");
    }
    let count = |t: &mut TuningClient<tonic::transport::Channel>| {
        let mut t = t.clone();
        async move {
            let mut stream = t.export_records(pb::ExportRecordsRequest::default()).await.unwrap().into_inner();
            let mut n = 0;
            while stream.message().await.unwrap().is_some() {
                n += 1;
            }
            n
        }
    };
    assert_eq!(count(&mut tuning).await, 0, "a refused report left a record");
    // The holder's own report is stored once.
    a.report_result(report(a_id, task.lease_serial)).await.unwrap();
    assert_eq!(count(&mut tuning).await, 1);
    tracker.stop().await;
}

/// An H200-like device that is not the simulator, so its reports are judged.
fn gpu_device() -> pb::DeviceInfo {
    let target = Target { class_key: "nvidia-h200/sm90/132sm".into(), ..Target::sm90() };
    pb::DeviceInfo { uuid: "GPU-test".into(), sm_clock_mhz: 1980, ..device_from_target(&target) }
}

#[tokio::test]
async fn implausible_reports_never_become_best_and_quarantine_distrusts_a_worker() {
    let s = secured(config).await;
    let addr = &s.tracker.addr;
    let mut liar = dispatch(addr, Some(&s.worker)).await;
    let liar_id = liar.register(registration("liar", gpu_device())).await.unwrap().into_inner().worker_id;
    let mut honest = dispatch(addr, Some(&s.other_worker)).await;
    let honest_id = honest.register(registration("honest", gpu_device())).await.unwrap().into_inner().worker_id;
    let mut admin = tuning(addr, Some(&s.admin)).await;
    // 4096^3 f16: at least ~130 us on 132 SMs at any clock.
    let w = matmul(4096, 4096, 4096);
    admin.submit_job(job(vec![w.clone()], 6, 3)).await.unwrap();

    let take = |worker_id| pb::LeaseTasksRequest { worker_id, max_tasks: 1, wait_ms: 5000 };
    let t1 = liar.lease_tasks(take(liar_id)).await.unwrap().into_inner().tasks.remove(0);
    let fast = pb::ReportResultRequest {
        worker_id: liar_id,
        task_id: t1.task_id,
        lease_serial: t1.lease_serial,
        measurement: Some(ok(1.0)),
        ..Default::default()
    };
    // Stored (the worker is not made to retry) but untrusted.
    assert!(liar.report_result(fast).await.unwrap().into_inner().stored);
    let t2 = honest.lease_tasks(take(honest_id)).await.unwrap().into_inner().tasks.remove(0);
    let real = pb::ReportResultRequest {
        worker_id: honest_id,
        task_id: t2.task_id,
        lease_serial: t2.lease_serial,
        measurement: Some(ok(250.0)),
        ..Default::default()
    };
    honest.report_result(real).await.unwrap();
    // A plausible but suspiciously good one from the liar: 240 us, best of the job so far.
    let t3 = liar.lease_tasks(take(liar_id)).await.unwrap().into_inner().tasks.remove(0);
    let good = pb::ReportResultRequest {
        worker_id: liar_id,
        task_id: t3.task_id,
        lease_serial: t3.lease_serial,
        measurement: Some(ok(240.0)),
        ..Default::default()
    };
    liar.report_result(good).await.unwrap();

    let best = |admin: &mut TuningClient<Authed>| {
        let mut admin = admin.clone();
        let w = w.clone();
        async move {
            let req = pb::QueryBestRequest { workload: Some(w), ..Default::default() };
            admin.query_best(req).await.unwrap().into_inner().best
        }
    };
    let now = best(&mut admin).await;
    assert_eq!(now.len(), 1);
    assert_eq!(now[0].measurement.as_ref().unwrap().median_us, 240.0);
    let mut stream = admin.export_records(pb::ExportRecordsRequest::default()).await.unwrap().into_inner();
    let mut untrusted = Vec::new();
    while let Some(r) = stream.message().await.unwrap() {
        if !r.untrusted.is_empty() {
            untrusted.push(r);
        }
    }
    assert_eq!(untrusted.len(), 1);
    assert!(untrusted[0].untrusted.contains("below the device bound"), "{}", untrusted[0].untrusted);
    assert_eq!(untrusted[0].measurement.as_ref().unwrap().median_us, 1.0);

    // Quarantine: a client may not; an admin distrusts the liar's records, and best falls back.
    let req = pb::QuarantineWorkerRequest { worker_id: liar_id, reason: "timer bug".into() };
    let e = tuning(addr, Some(&s.client)).await.quarantine_worker(req.clone()).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    let marked = admin.quarantine_worker(req).await.unwrap().into_inner().records;
    assert_eq!(marked, 1, "the one record not already untrusted");
    let now = best(&mut admin).await;
    assert_eq!(now[0].measurement.as_ref().unwrap().median_us, 250.0);
    let e = liar.lease_tasks(take(liar_id)).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    assert!(e.message().contains("quarantined"), "{e}");
    s.tracker.stop().await;
}

#[tokio::test]
async fn submissions_are_rate_limited_per_token() {
    let s = secured(|dir| TrackerConfig { submit_rate: 0.001, ..config(dir) }).await;
    let addr = &s.tracker.addr;
    let mut gpu = dispatch(addr, Some(&s.worker)).await;
    gpu.register(registration("gpu-1", sim_device())).await.unwrap();
    let mut alice = tuning(addr, Some(&s.client)).await;
    let burst = tensortune_tracker::SUBMIT_BURST;
    for _ in 0..burst {
        alice.submit_job(job(vec![matmul(64, 64, 64)], 1, 1)).await.unwrap();
    }
    let e = alice.submit_job(job(vec![matmul(64, 64, 64)], 1, 1)).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted);
    assert!(e.message().contains("too many job submissions"), "{e}");
    // Bad input is still named first, and another token has its own allowance.
    let bad = job(vec![matmul(64, 64, 63)], 1, 1);
    assert_eq!(alice.submit_job(bad).await.unwrap_err().code(), Code::InvalidArgument);
    tuning(addr, Some(&s.other_client)).await.submit_job(job(vec![matmul(64, 64, 64)], 1, 1)).await.unwrap();
    s.tracker.stop().await;
}

/// A CA, the tracker's certificate (127.0.0.1) and a worker's client certificate, all PEM.
struct Pki {
    ca: String,
    server: (String, String),
    client: (String, String),
    stranger: (String, String),
}

fn pki() -> Pki {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let leaf = |names: Vec<String>, usage: ExtendedKeyUsagePurpose, issuer: &Issuer<'_, KeyPair>| {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(names).unwrap();
        params.extended_key_usages = vec![usage];
        let cert = params.signed_by(&key, issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    };
    let server = leaf(vec!["127.0.0.1".into(), "localhost".into()], ExtendedKeyUsagePurpose::ServerAuth, &issuer);
    let client = leaf(vec!["worker-1".into()], ExtendedKeyUsagePurpose::ClientAuth, &issuer);
    // A client certificate from a CA the tracker does not know.
    let other_key = KeyPair::generate().unwrap();
    let mut other_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    other_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let other_issuer = Issuer::new(other_params, other_key);
    let stranger = leaf(vec!["worker-x".into()], ExtendedKeyUsagePurpose::ClientAuth, &other_issuer);
    Pki { ca: ca.pem(), server, client, stranger }
}

async fn tls_tracker(dir: &TempDir, tls: ServerTls) -> (String, CancellationToken, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let shutdown = CancellationToken::new();
    let cfg = TrackerConfig { tls: Some(tls), ..config(dir) };
    let token = shutdown.clone();
    let handle = tokio::spawn(async move { tensortune_tracker::run(cfg, listener, token).await.unwrap() });
    (format!("https://127.0.0.1:{port}"), shutdown, handle)
}

async fn connect_tls(
    url: &str,
    ca: &str,
    identity: Option<&(String, String)>,
) -> Result<tonic::transport::Channel, String> {
    let identity = identity.map(|(c, k)| (c.as_bytes().to_vec(), k.as_bytes().to_vec()));
    let access = Access::new(None, Some(ca.as_bytes().to_vec()), identity).unwrap();
    access.endpoint(url).unwrap().connect().await.map_err(|e| format!("{e:?}"))
}

#[tokio::test]
async fn tls_and_mutual_tls_round_trips() {
    let pki = pki();
    let dir = TempDir::new().unwrap();
    let tls = ServerTls {
        cert_pem: pki.server.0.clone().into_bytes(),
        key_pem: pki.server.1.clone().into_bytes(),
        client_ca_pem: Some(pki.ca.clone().into_bytes()),
    };
    let (url, shutdown, handle) = tls_tracker(&dir, tls).await;

    // Tuning over TLS without a client certificate.
    let channel = connect_tls(&url, &pki.ca, None).await.unwrap();
    let mut tuning = TuningClient::new(channel.clone());
    tuning.list_jobs(pb::ListJobsRequest::default()).await.unwrap();
    // Dispatch without a client certificate: refused.
    let e = DispatchClient::new(channel).register(registration("w", sim_device())).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    assert!(e.message().contains("client certificate"), "{e}");
    // With one the CA signed: registered.
    let channel = connect_tls(&url, &pki.ca, Some(&pki.client)).await.unwrap();
    DispatchClient::new(channel).register(registration("w", sim_device())).await.unwrap();
    // With one from another CA: the handshake or the first call fails.
    match connect_tls(&url, &pki.ca, Some(&pki.stranger)).await {
        Err(_) => {}
        Ok(channel) => {
            let r = DispatchClient::new(channel).register(registration("x", sim_device())).await;
            assert!(r.is_err(), "a certificate from an unknown CA was accepted");
        }
    }
    // A client that does not trust the tracker's CA cannot talk to it, nor can plain HTTP/2.
    let stranger_ca = pki.stranger.0.clone();
    let refused = match connect_tls(&url, &stranger_ca, None).await {
        Err(_) => true,
        Ok(channel) => TuningClient::new(channel).list_jobs(pb::ListJobsRequest::default()).await.is_err(),
    };
    assert!(refused, "a client trusting another CA reached the tracker");
    let plain = url.replace("https://", "http://");
    let plain = match tonic::transport::Endpoint::from_shared(plain).unwrap().connect().await {
        Err(_) => true,
        Ok(channel) => TuningClient::new(channel).list_jobs(pb::ListJobsRequest::default()).await.is_err(),
    };
    assert!(plain, "plain HTTP/2 reached a TLS tracker");

    shutdown.cancel();
    tokio::time::timeout(PATIENCE, handle).await.unwrap().unwrap();
}

#[tokio::test]
async fn non_loopback_addresses_need_tokens_and_tls_or_insecure() {
    let dir = TempDir::new().unwrap();
    // Any non-loopback local address will do; without one (a sandbox) the case is skipped loudly.
    let Ok(listener) = TcpListener::bind("0.0.0.0:0").await else {
        eprintln!("skipping: cannot bind 0.0.0.0 here");
        return;
    };
    let e = tensortune_tracker::run(config(&dir), listener, CancellationToken::new()).await.unwrap_err();
    let e = format!("{e:#}");
    assert!(
        e.contains("refusing to serve") && e.contains("without tokens and without TLS") && e.contains("--insecure"),
        "{e}"
    );
    // With --insecure it serves (stopped at once).
    let listener = TcpListener::bind("0.0.0.0:0").await.unwrap();
    let stop = CancellationToken::new();
    stop.cancel();
    let cfg = TrackerConfig { insecure: true, ..config(&dir) };
    tensortune_tracker::run(cfg, listener, stop).await.unwrap();
}

#[tokio::test]
async fn winners_are_confirmed_on_another_worker_and_times_that_do_not_reproduce_are_distrusted() {
    let dir = TempDir::new().unwrap();
    let tracker = TestTracker::start(config(&dir)).await;
    let mut tuning = tracker.tuning().await;
    let mut a = FakeWorker::register(&tracker, "a").await;
    let mut b = FakeWorker::register(&tracker, "b").await;
    let w = matmul(256, 256, 256);
    tuning.submit_job(job_with_finalists(vec![w.clone()], 4, 4, Some(2))).await.unwrap();
    let tasks = a.lease_some(4).await;
    assert_eq!(tasks.len(), 4);
    // One time a's GPU cannot really reach, three ordinary ones.
    for (i, task) in tasks.iter().enumerate() {
        let us = if i == 0 { 1.0 } else { 10.0 + i as f64 };
        assert!(a.report(task, ok(us)).await.unwrap().stored);
    }
    // a timed the fastest finalist: the finalist task waits for b.
    assert!(a.lease(1, 300).await.is_empty(), "the worker that timed the fastest finalist got its confirmation");
    let finalist = b.lease_some(1).await.remove(0);
    assert!(is_finalist(&finalist));
    assert_eq!(finalist.finalist_indices[0], tasks[0].config_index);
    b.report_finalists(&finalist, vec![ok(9.5), ok(11.2)]).await.unwrap();

    let records = all_records(&mut tuning).await;
    let fast = records.iter().find(|r| r.measurement.as_ref().unwrap().median_us == 1.0).unwrap();
    assert!(fast.untrusted.starts_with("not reproduced"), "{}", fast.untrusted);
    let req = pb::QueryBestRequest { workload: Some(w), ..Default::default() };
    let best = tuning.query_best(req).await.unwrap().into_inner().best;
    assert_eq!(best[0].measurement.as_ref().unwrap().median_us, 9.5);
    assert_eq!(best[0].worker_id, b.id);
    let job = get_job(&mut tuning, 1).await;
    let winner = job.workloads[0].best.as_ref().unwrap();
    assert_eq!((winner.worker_id, winner.measurement.as_ref().unwrap().median_us), (b.id, 9.5));
    tracker.stop().await;
}
