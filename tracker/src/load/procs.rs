//! The processes of a load run: the tracker (started, killed, restarted on the same database and
//! port, its CPU time and peak memory read from `/proc`) and the worker groups; signals.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use tensortune_proto::pb;
use tensortune_proto::pb::tuning_client::TuningClient;
use tokio::process::{Child, Command};
use tokio::time::Instant;

use super::LoadConfig;

/// How long a started tracker may take to answer.
const START_PATIENCE: Duration = Duration::from_secs(30);

/// How a tracker process is started.
#[derive(Clone, Debug)]
pub(crate) struct TrackerSpec {
    pub(crate) bin: PathBuf,
    pub(crate) db: PathBuf,
    pub(crate) port: u16,
    pub(crate) lease_secs: u64,
    pub(crate) heartbeat_secs: u64,
    /// Where its logs go: `tracker-N.log` per start.
    pub(crate) dir: PathBuf,
}

impl TrackerSpec {
    pub(crate) fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The command line of a start.
    fn command(&self) -> Command {
        let mut cmd = Command::new(&self.bin);
        cmd.arg("--listen")
            .arg(format!("127.0.0.1:{}", self.port))
            .arg("--db")
            .arg(&self.db)
            .arg("--lease-secs")
            .arg(self.lease_secs.to_string())
            .arg("--heartbeat-secs")
            .arg(self.heartbeat_secs.to_string())
            .arg("--submit-rate")
            .arg("100")
            .env("RUST_LOG", std::env::var("TENSORTUNE_LOAD_TRACKER_LOG").unwrap_or_else(|_| "info".into()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            // Through a pipe: a file-size limit set on the tracker (the `fsize` fault) must not
            // also cut its log.
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        cmd
    }
}

/// A running tracker and what its earlier incarnations used.
pub(crate) struct TrackerProc {
    spec: TrackerSpec,
    child: Child,
    starts: u32,
    /// CPU seconds of the incarnations that ended, and the latest reading of the running one.
    cpu_done: f64,
    cpu_now: f64,
    /// Peak resident memory over all incarnations, KiB.
    peak_rss_kib: u64,
}

impl TrackerProc {
    /// Starts a tracker and waits until it answers.
    pub(crate) async fn start(spec: TrackerSpec) -> anyhow::Result<TrackerProc> {
        let child = spawn(&spec, 1).await?;
        Ok(TrackerProc { spec, child, starts: 1, cpu_done: 0.0, cpu_now: 0.0, peak_rss_kib: 0 })
    }

    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Reads CPU time and peak memory from `/proc`.
    pub(crate) fn sample(&mut self) {
        if let Some(pid) = self.pid() {
            if let Some(cpu) = cpu_seconds(pid) {
                self.cpu_now = cpu;
            }
            if let Some(rss) = peak_rss_kib(pid) {
                self.peak_rss_kib = self.peak_rss_kib.max(rss);
            }
        }
    }

    /// CPU seconds over every incarnation, and peak RSS in KiB.
    pub(crate) fn usage(&self) -> (f64, u64) {
        (self.cpu_done + self.cpu_now, self.peak_rss_kib)
    }

    /// SIGKILLs the tracker (after a last sample) and waits for it to be gone.
    pub(crate) async fn kill(&mut self) -> anyhow::Result<()> {
        self.sample();
        self.child.kill().await.context("killing the tracker")?;
        self.cpu_done += std::mem::take(&mut self.cpu_now);
        Ok(())
    }

    /// Starts it again on the same database and port.
    pub(crate) async fn restart(&mut self) -> anyhow::Result<()> {
        self.starts += 1;
        self.child = spawn(&self.spec, self.starts).await?;
        Ok(())
    }

    /// Stops it with SIGTERM (a graceful stop: the database is checkpointed and closed).
    pub(crate) async fn stop(mut self) -> anyhow::Result<()> {
        self.sample();
        if let Some(pid) = self.pid() {
            signal(pid, "TERM").await?;
        }
        match tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await {
            Ok(status) => {
                let status = status?;
                anyhow::ensure!(status.success(), "the tracker exited with {status} on SIGTERM");
            }
            Err(_) => anyhow::bail!("the tracker did not stop within 30 s of SIGTERM"),
        }
        Ok(())
    }

    /// Whether the process is still running.
    pub(crate) fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

async fn spawn(spec: &TrackerSpec, start: u32) -> anyhow::Result<Child> {
    let log = spec.dir.join(format!("tracker-{start}.log"));
    let mut child = spec.command().spawn().with_context(|| format!("starting {}", spec.bin.display()))?;
    let mut file = tokio::fs::File::create(&log).await.with_context(|| format!("creating {}", log.display()))?;
    if let Some(mut stderr) = child.stderr.take() {
        // Ends when the tracker exits (its end of the pipe closes).
        tokio::spawn(async move { tokio::io::copy(&mut stderr, &mut file).await });
    }
    let deadline = Instant::now() + START_PATIENCE;
    loop {
        if let Some(status) = child.try_wait()? {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            anyhow::bail!("the tracker exited at start ({status}): {}", text.trim());
        }
        if serving(&spec.url()).await {
            return Ok(child);
        }
        anyhow::ensure!(Instant::now() < deadline, "the tracker did not answer within {START_PATIENCE:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether the tracker at `url` answers calls. A connection alone proves nothing: the listener is
/// bound before the database is opened and migrated.
pub async fn serving(url: &str) -> bool {
    let Ok(mut client) = TuningClient::connect(url.to_owned()).await else { return false };
    match client.get_job(pb::JobRef { job_id: 1 }).await {
        Ok(_) => true,
        Err(status) => status.code() == tonic::Code::NotFound,
    }
}

/// Sends `SIG{name}` to `pid` with kill(1).
pub(crate) async fn signal(pid: u32, name: &str) -> anyhow::Result<()> {
    let status = Command::new("kill").arg(format!("-{name}")).arg(pid.to_string()).status().await?;
    anyhow::ensure!(status.success(), "kill -{name} {pid} failed: {status}");
    Ok(())
}

/// User plus system CPU seconds of `pid`.
pub(crate) fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) start at state, field 3.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / clock_ticks())
}

/// Clock ticks per second (USER_HZ), 100 on Linux unless `getconf` says otherwise.
fn clock_ticks() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// Peak resident set (VmHWM) of `pid`, KiB.
fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// A worker group process (this executable's `group` command).
pub(crate) struct GroupProc {
    pub(crate) name: String,
    child: Child,
}

impl GroupProc {
    pub(crate) fn spawn(config: &LoadConfig, tracker: &str, name: &str, workers: u32) -> anyhow::Result<GroupProc> {
        let (bin, dir, measure) = (&config.load_bin, &config.dir, config.measure);
        let stats = dir.join(format!("group-{name}.json"));
        let log = std::fs::File::create(dir.join(format!("group-{name}.log")))?;
        let child = Command::new(bin)
            .arg("group")
            .args(["--tracker", tracker, "--name", name])
            .arg("--workers")
            .arg(workers.to_string())
            .arg("--measure-ms")
            .arg(measure.as_millis().to_string())
            .arg("--stats")
            .arg(&stats)
            .arg("--batch")
            .arg(config.batch.to_string())
            .arg("--report-gather-ms")
            .arg(config.report_gather.as_millis().to_string())
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting worker group {name} ({})", bin.display()))?;
        Ok(GroupProc { name: name.to_owned(), child })
    }

    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    pub(crate) async fn kill(&mut self) -> anyhow::Result<()> {
        self.child.kill().await.with_context(|| format!("killing worker group {}", self.name))
    }

    /// Stops it with SIGTERM (it writes its stats a last time), or kills it after 10 s.
    pub(crate) async fn stop(mut self) {
        if let Some(pid) = self.pid() {
            let _ = signal(pid, "TERM").await;
            if tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await.is_err() {
                let _ = self.child.kill().await;
            }
        }
    }
}
