//! The read-only HTTP side: `/metrics` in Prometheus text format, the dashboard's JSON, and the
//! page itself in a real headless browser.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use tempfile::TempDir;
use tensortune_proto::pb;
use tensortune_tracker::TrackerConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::harness::{FakeWorker, PATIENCE, config, drive, fake_us, job, matmul, ok, submit};

/// A tracker serving gRPC and HTTP.
struct Served {
    grpc: String,
    http: String,
    stop: CancellationToken,
    handle: tokio::task::JoinHandle<anyhow::Result<()>>,
}

async fn serve(cfg: TrackerConfig) -> Served {
    let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (g, h) = (grpc.local_addr().unwrap(), http.local_addr().unwrap());
    let stop = CancellationToken::new();
    let handle = tokio::spawn(tensortune_tracker::run_with_http(cfg, grpc, Some(http), stop.clone()));
    Served { grpc: format!("http://{g}"), http: h.to_string(), stop, handle }
}

impl Served {
    fn tracker(&self) -> crate::harness::TestTracker {
        crate::harness::TestTracker::attach(&self.grpc)
    }

    async fn stop(self) {
        self.stop.cancel();
        tokio::time::timeout(PATIENCE, self.handle).await.unwrap().unwrap().unwrap();
    }
}

/// `GET path` over HTTP/1.1: (status, body).
pub(crate) async fn get(addr: &str, path: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, body.to_owned())
}

/// The samples of a metrics page by name and sorted labels.
fn parse_metrics(text: &str) -> HashMap<(String, Vec<(String, String)>), f64> {
    let lines = text.lines().map(|l| Ok(l.to_owned()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("the text format parses");
    let mut out = HashMap::new();
    for s in scrape.samples {
        let mut labels: Vec<(String, String)> = s.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        labels.sort();
        let value = match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            other => panic!("unexpected sample {other:?}"),
        };
        out.insert((s.metric, labels), value);
    }
    out
}

fn key(name: &str, labels: &[(&str, &str)]) -> (String, Vec<(String, String)>) {
    let mut l: Vec<(String, String)> = labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    l.sort();
    (name.to_owned(), l)
}

#[tokio::test]
async fn metrics_parse_and_count_what_the_store_holds() {
    let dir = TempDir::new().unwrap();
    let served = serve(config(&dir)).await;
    let tracker = served.tracker();
    let mut tuning = tracker.tuning().await;
    let mut worker = FakeWorker::register(&tracker, "box/0").await;
    let done = submit(&mut tuning, job(vec![matmul(64, 64, 64)], 5, 5)).await;
    let reported = drive(&mut worker, &mut tuning, done).await;
    assert_eq!(reported.len(), 5);
    // A second job waits with its first batch proposed.
    let mut waiting = job(vec![matmul(128, 64, 64)], 6, 2);
    waiting.label = "second job".into();
    let waiting = submit(&mut tuning, waiting).await;

    let (status, text) = get(&served.http, "/metrics").await;
    assert_eq!(status, 200);
    let m = parse_metrics(&text);
    let at = |name: &str, labels: &[(&str, &str)]| {
        *m.get(&key(name, labels)).unwrap_or_else(|| panic!("no {name} {labels:?} in:\n{text}"))
    };
    assert_eq!(at("tensortune_tasks", &[("state", "pending"), ("kind", "tuning")]), 2.0);
    assert_eq!(at("tensortune_tasks", &[("state", "done"), ("kind", "tuning")]), 5.0);
    assert_eq!(at("tensortune_records", &[("status", "ok"), ("trust", "trusted")]), 5.0);
    assert_eq!(at("tensortune_workers", &[("state", "online")]), 1.0);
    assert_eq!(at("tensortune_workers_drift_flagged", &[]), 0.0);
    assert_eq!(at("tensortune_reports_stored_total", &[]), 5.0);
    assert_eq!(at("tensortune_leases_held", &[]), 0.0);
    assert_eq!(at("tensortune_jobs", &[("state", "done")]), 1.0);
    assert_eq!(at("tensortune_jobs", &[("state", "queued")]), 1.0);
    let id = waiting.to_string();
    let labels = [("job", id.as_str()), ("label", "second job")];
    assert_eq!(at("tensortune_job_trials_done", &labels), 0.0);
    assert_eq!(at("tensortune_job_trials_target", &labels), 6.0);
    assert!(at("tensortune_records_per_second", &[]) > 0.0);
    assert!(!m.keys().any(|(n, l)| n == "tensortune_job_trials_done" && l.iter().any(|(_, v)| v == &done.to_string())));

    // The dashboard's JSON.
    let (status, jobs) = get(&served.http, "/api/jobs").await;
    assert_eq!(status, 200);
    let jobs: serde_json::Value = serde_json::from_str(&jobs).unwrap();
    let first = jobs.as_array().unwrap().iter().find(|j| j["id"] == done).unwrap();
    assert_eq!((first["state"].as_str(), first["trials_done"].as_u64()), (Some("done"), Some(5)));
    assert!(first["workloads"][0]["best_us"].as_f64().is_some());
    let (_, trials) = get(&served.http, &format!("/api/jobs/{done}/trials")).await;
    let trials: serde_json::Value = serde_json::from_str(&trials).unwrap();
    assert_eq!(trials["workloads"][0]["times_us"].as_array().unwrap().len(), 5);
    assert_eq!(get(&served.http, "/api/jobs/999/trials").await.0, 404);
    let (_, page) = get(&served.http, "/").await;
    assert!(page.contains("<title>tensortune tracker</title>"));
    served.stop().await;
}

/// The browser to drive, if this machine has one (scripts/test.sh installs Debian's chromium).
fn browser() -> Option<PathBuf> {
    ["chromium", "chromium-browser", "google-chrome", "google-chrome-stable"].iter().find_map(|name| {
        std::env::var_os("PATH")?.to_str()?.split(':').map(|d| PathBuf::from(d).join(name)).find(|p| p.is_file())
    })
}

/// A headless browser showing one page, driven over the DevTools protocol.
struct Page {
    child: std::process::Child,
    socket: tungstenite::WebSocket<tungstenite::stream::MaybeTlsStream<std::net::TcpStream>>,
    next_id: u64,
    _profile: TempDir,
}

impl Page {
    /// Opens `url` in a new headless browser.
    fn open(browser: &PathBuf, url: &str) -> Page {
        use std::io::BufRead as _;
        let profile = TempDir::new().unwrap();
        let mut child = std::process::Command::new(browser)
            .args(["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"])
            .arg("--remote-debugging-port=0")
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("--window-size=1280,1100")
            .arg(url)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // "DevTools listening on ws://127.0.0.1:PORT/devtools/browser/..."; the rest of its stderr
        // is drained on a thread, so the browser never blocks on a full pipe.
        let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
        let port = stderr
            .by_ref()
            .map_while(Result::ok)
            .find_map(|l| l.split("ws://127.0.0.1:").nth(1).and_then(|r| r.split('/').next()).map(str::to_owned))
            .expect("the browser did not say where DevTools listens");
        std::thread::spawn(move || stderr.for_each(drop));
        let list: serde_json::Value = {
            let deadline = std::time::Instant::now() + PATIENCE;
            loop {
                let body = http_get_blocking(&format!("127.0.0.1:{port}"), "/json/list");
                let v: serde_json::Value = serde_json::from_str(&body).unwrap();
                if v.as_array().is_some_and(|a| a.iter().any(|t| t["type"] == "page")) {
                    break v;
                }
                assert!(std::time::Instant::now() < deadline, "no page target");
                std::thread::sleep(Duration::from_millis(100));
            }
        };
        let ws = list.as_array().unwrap().iter().find(|t| t["type"] == "page").unwrap()["webSocketDebuggerUrl"]
            .as_str()
            .unwrap()
            .to_owned();
        let (socket, _) = tungstenite::connect(ws).unwrap();
        Page { child, socket, next_id: 1, _profile: profile }
    }

    /// Sends a DevTools command and returns its result.
    fn call(&mut self, method: &str, params: serde_json::Value) -> serde_json::Value {
        let id = self.next_id;
        self.next_id += 1;
        let msg = serde_json::json!({ "id": id, "method": method, "params": params });
        self.socket.send(tungstenite::Message::text(msg.to_string())).unwrap();
        loop {
            let reply = self.socket.read().unwrap();
            let Ok(text) = reply.to_text() else { continue };
            let v: serde_json::Value = serde_json::from_str(text).unwrap();
            if v["id"] == id {
                assert!(v.get("error").is_none(), "{method} failed: {v}");
                return v["result"].clone();
            }
        }
    }

    /// The text of the element `id` (empty when it does not exist yet).
    fn text_of(&mut self, id: &str) -> String {
        let expr = format!("(document.getElementById('{id}') || {{textContent: ''}}).textContent");
        let r = self.call("Runtime.evaluate", serde_json::json!({ "expression": expr, "returnByValue": true }));
        r["result"]["value"].as_str().unwrap_or_default().to_owned()
    }

    /// The page's HTML now.
    fn html(&mut self) -> String {
        let expr = "document.documentElement.outerHTML";
        let r = self.call("Runtime.evaluate", serde_json::json!({ "expression": expr, "returnByValue": true }));
        r["result"]["value"].as_str().unwrap_or_default().to_owned()
    }

    /// Waits until the text of `id` contains `want`; returns the whole page when it does not.
    fn wait_for(&mut self, id: &str, want: &str) -> Result<(), String> {
        let deadline = std::time::Instant::now() + PATIENCE;
        while std::time::Instant::now() < deadline {
            if self.text_of(id).contains(want) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(self.html())
    }

    /// A PNG of the viewport.
    fn screenshot(&mut self) -> Vec<u8> {
        use base64::Engine as _;
        let r = self.call("Page.captureScreenshot", serde_json::json!({ "format": "png" }));
        base64::engine::general_purpose::STANDARD.decode(r["data"].as_str().unwrap()).unwrap()
    }
}

impl Drop for Page {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `GET path` on `addr`, blocking: the body (by its Content-Length: DevTools keeps connections open).
fn http_get_blocking(addr: &str, path: &str) -> String {
    use std::io::{BufRead as _, Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
    let mut reader = std::io::BufReader::new(stream);
    let mut length = 0;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().unwrap();
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).unwrap();
    String::from_utf8(body).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_a_running_job_and_updates_in_a_real_browser() {
    let Some(browser) = browser() else {
        eprintln!(
            "SKIPPED: no chromium on PATH; scripts/test.sh installs Debian's chromium (apt-get install chromium)"
        );
        return;
    };
    let dir = TempDir::new().unwrap();
    let served = serve(config(&dir)).await;
    let tracker = served.tracker();
    let mut tuning = tracker.tuning().await;
    let mut worker = FakeWorker::register(&tracker, "box/0").await;
    let mut req = job(vec![matmul(256, 64, 256)], 8, 8);
    req.label = "dashboard-test".into();
    (req.regime, req.objective) = ("sustained".into(), "energy".into());
    let id = submit(&mut tuning, req).await;
    let tasks = worker.lease_some(8).await;
    // Energies that disagree with time: the front holds more than one trial.
    let measure = |t: &pb::Task| {
        let us = fake_us(t);
        let watts = 300.0 + 40.0 * ((t.config_index * 7) % 17) as f64;
        pb::Measurement {
            energy_mj: Some(watts * us * 1e-3),
            power_w: Some(watts),
            regime: "sustained".into(),
            steady: true,
            baseline_energy_mj: Some(0.5),
            ..ok(us)
        }
    };
    for task in &tasks[..3] {
        worker.report(task, measure(task)).await.unwrap();
    }
    let url = format!("http://{}/", served.http);

    // The page loads and shows the running job's progress, its plot and the worker.
    let mut page = tokio::task::spawn_blocking(move || {
        let mut page = Page::open(&browser, &url);
        page.wait_for("history", &format!("{id}:3/8")).map_err(|html| format!("never showed 3/8:\n{html}")).unwrap();
        // The job's detail (tables, plots) comes after its trials are fetched.
        page.wait_for("detail", "Time and energy").map_err(|html| format!("no job detail:\n{html}")).unwrap();
        page
    })
    .await
    .unwrap();
    let html = page.html();
    assert!(html.contains("dashboard-test") && html.contains(">running<"), "{html}");
    // Drawn, not only in the script's text: an attribute the script writes as `${...}` appears
    // with a number after it.
    let drawn =
        |before: &str| html.match_indices(before).any(|(i, _)| html[i + before.len()..].starts_with(char::is_numeric));
    assert!(drawn("height=\"220\" class=\"convergence\"><rect x=\""), "no convergence plot:\n{html}");
    // Energy: the job's regime and objective, the best's energy, and the time-energy front.
    assert!(html.contains("sustained regime, objective energy"), "{html}");
    assert!(drawn("class=\"front\" points=\""), "no time-energy front:\n{html}");
    assert!(html.contains(" mJ @ ") && html.contains("energy/launch against time"), "no energy column:\n{html}");
    assert!(html.contains("box/0"), "no worker row:\n{html}");

    // More trials finish while it is open: it shows them without a reload.
    for task in &tasks[3..6] {
        worker.report(task, measure(task)).await.unwrap();
    }
    let (mut page, shown) = tokio::task::spawn_blocking(move || {
        let shown = page.wait_for("history", &format!("{id}:6/8"));
        (page, shown)
    })
    .await
    .unwrap();
    shown.unwrap_or_else(|html| panic!("the open page never moved to 6/8:\n{html}"));
    let history = page.text_of("history");
    assert!(history.find(&format!("{id}:3/8")) < history.find(&format!("{id}:6/8")), "{history}");

    // A screenshot, kept as the test's artifact.
    let png = tokio::task::spawn_blocking(move || page.screenshot()).await.unwrap();
    assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "not a real screenshot");
    let shot = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dashboard.png");
    std::fs::write(&shot, &png).unwrap();
    eprintln!("dashboard screenshot: {}", shot.display());
    served.stop().await;
}
