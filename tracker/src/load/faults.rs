//! The faults of a load run: how each is made and how its recovery is timed, and the start-up
//! checks (a corrupted or read-only database must be refused with a clear error).

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use anyhow::Context;
use rand::{Rng, RngExt};
use serde::Serialize;
use sqlx::SqliteConnection;
use tensortune_proto::pb;
use tensortune_proto::pb::tuning_client::TuningClient;
use tokio::io::AsyncWriteExt;
use tokio::process::Command;
use tokio::time::Instant;

use super::LoadConfig;
use super::check;
use super::procs::{GroupProc, TrackerProc, signal};

/// A fault to inject.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// SIGKILL the worker group process holding the most tasks, then start a fresh one in its
    /// place.
    KillWorkers,
    /// SIGSTOP the worker group holding the most tasks past the lease, then SIGCONT: its late
    /// reports must be refused (or acknowledged as already done) without duplicates.
    StopWorkers,
    /// SIGKILL the tracker and start it again on the same database and port.
    KillTracker,
    /// Random bytes (and a valid HTTP/2 preface followed by junk) on the tracker's port.
    Garbage,
    /// Fill the tmpfs the database lives on, hold, free it (needs `--tmpfs-mib`, root).
    DiskFull,
    /// Set the tracker's file-size limit (RLIMIT_FSIZE) to 0, hold, lift it: every write of the
    /// database fails, as on a device that turned read-only.
    Fsize,
    /// Start a tracker on a database whose header is garbage: it must refuse, naming the file.
    CorruptDb,
    /// Start a tracker on a database it cannot write: it must refuse, naming the file.
    ReadonlyDb,
}

impl Fault {
    /// Every fault, in the order of their names.
    pub const ALL: [Fault; 8] = [
        Fault::KillWorkers,
        Fault::StopWorkers,
        Fault::KillTracker,
        Fault::Garbage,
        Fault::DiskFull,
        Fault::Fsize,
        Fault::CorruptDb,
        Fault::ReadonlyDb,
    ];

    /// The fault's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Fault::KillWorkers => "kill-workers",
            Fault::StopWorkers => "stop-workers",
            Fault::KillTracker => "kill-tracker",
            Fault::Garbage => "garbage",
            Fault::DiskFull => "disk-full",
            Fault::Fsize => "fsize",
            Fault::CorruptDb => "corrupt-db",
            Fault::ReadonlyDb => "readonly-db",
        }
    }

    /// Whether it is checked before the load rather than fired during it.
    pub fn at_start(self) -> bool {
        matches!(self, Fault::CorruptDb | Fault::ReadonlyDb)
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Fault {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Fault::ALL.into_iter().find(|f| f.name() == s).ok_or_else(|| {
            let names: Vec<&str> = Fault::ALL.iter().map(|f| f.name()).collect();
            format!("unknown fault {s:?}; allowed: {}", names.join(", "))
        })
    }
}

/// What became of a fault fired during the load.
#[derive(Clone, Debug, Serialize)]
pub struct FaultRound {
    /// The fault.
    pub fault: Fault,
    /// When it fired, seconds after submission.
    pub at_s: f64,
    /// Whether the run recovered: the tasks it hit were done again (or the tracker served again).
    pub recovered: bool,
    /// From the fault (or, for held faults, its removal) until recovery, seconds.
    pub recovery_s: f64,
    /// Tasks held by the workers or tracker it hit.
    pub tasks_hit: usize,
    /// What was seen, in words.
    pub note: String,
}

impl FaultRound {
    pub(crate) fn not_fired(fault: Fault) -> FaultRound {
        FaultRound {
            fault,
            at_s: 0.0,
            recovered: false,
            recovery_s: 0.0,
            tasks_hit: 0,
            note: "not fired: the jobs ended (or the deadline came) first".into(),
        }
    }
}

/// What a start-up check saw.
#[derive(Clone, Debug, Serialize)]
pub struct StartCheck {
    /// The fault.
    pub fault: Fault,
    /// The tracker refused to start, said why naming the file, and did not panic.
    pub passed: bool,
    /// Its last error line.
    pub said: String,
}

/// What a fault works on.
pub(crate) struct Env<'a> {
    pub(crate) config: &'a LoadConfig,
    pub(crate) url: &'a str,
    pub(crate) tmpfs: Option<&'a Tmpfs>,
    pub(crate) conn: &'a mut SqliteConnection,
    pub(crate) groups: &'a mut Vec<GroupProc>,
    pub(crate) tracker: &'a mut TrackerProc,
    pub(crate) started: Instant,
    pub(crate) restarts: u32,
}

/// Jobs ended and records stored so far; a read that fails (the tracker is being killed, the
/// disk is full) counts as no progress rather than failing the run.
pub(crate) async fn progress(conn: &mut SqliteConnection) -> anyhow::Result<(i64, i64)> {
    Ok(check::progress(conn).await.unwrap_or((0, 0)))
}

/// Fires `fault` and waits for the run to recover from it (or for `deadline`).
pub(crate) async fn fire(fault: Fault, env: &mut Env<'_>, deadline: Instant) -> anyhow::Result<FaultRound> {
    let at_s = env.started.elapsed().as_secs_f64();
    let mut round = FaultRound { fault, at_s, recovered: false, recovery_s: 0.0, tasks_hit: 0, note: String::new() };
    let lease = Duration::from_secs(env.config.lease_secs);
    match fault {
        Fault::KillWorkers | Fault::StopWorkers => {
            // The group holding the most tasks: with leases held while reports queue (the lease
            // window) most workers hold none at a time, and a group picked at random held 0 in a
            // run of 2026-11-28, which tested nothing.
            let mut g = 0;
            let mut most = None;
            for (i, group) in env.groups.iter().enumerate() {
                let held = check::held_by(env.conn, &format!("{}/", group.name)).await.map_or(0, |h| h.len());
                if most.is_none_or(|m| held > m) {
                    (g, most) = (i, Some(held));
                }
            }
            let name = env.groups[g].name.clone();
            let pid = env.groups[g].pid().context("the worker group is gone")?;
            let t0 = Instant::now();
            if fault == Fault::KillWorkers {
                env.groups[g].kill().await?;
            } else {
                signal(pid, "STOP").await?;
            }
            let held = check::held_by(env.conn, &format!("{name}/")).await?;
            round.tasks_hit = held.len();
            if fault == Fault::KillWorkers {
                env.restarts += 1;
                let fresh = format!("{name}r{}", env.restarts);
                let workers = env.config.workers / env.config.groups;
                env.groups[g] = GroupProc::spawn(env.config, env.url, &fresh, workers)?;
                round.note = format!(
                    "group {name} (pid {pid}) killed holding {} tasks; {fresh} started in its place",
                    held.len()
                );
            } else {
                // Past the lease (and a reaper period) so that its tasks go to other workers; the
                // tasks are watched meanwhile, since others should finish them before it wakes.
                let wake = t0 + lease + lease / 2 + Duration::from_millis(500);
                let done = wait_done(env.conn, &held, wake).await;
                tokio::time::sleep_until(wake).await;
                signal(pid, "CONT").await?;
                if let Some(t) = done {
                    round.recovered = true;
                    round.recovery_s = (t - t0).as_secs_f64();
                }
                round.note = format!(
                    "group {name} (pid {pid}) stopped for {:.1} s (lease {} s) holding {} tasks, then continued",
                    t0.elapsed().as_secs_f64(),
                    lease.as_secs(),
                    held.len()
                );
            }
            if !round.recovered {
                let done = wait_done(env.conn, &held, deadline).await;
                round.recovered = done.is_some();
                round.recovery_s = done.map_or(0.0, |t| (t - t0).as_secs_f64());
            }
            round.note.push_str("; recovery: until every task it held was done");
        }
        Fault::KillTracker => {
            let held: Vec<i64> =
                sqlx::query_scalar("SELECT id FROM tasks WHERE state = 'leased'").fetch_all(&mut *env.conn).await?;
            let t0 = Instant::now();
            env.tracker.kill().await?;
            env.tracker.restart().await?;
            let serving = t0.elapsed().as_secs_f64();
            round.tasks_hit = held.len();
            let done = wait_done(env.conn, &held, deadline).await;
            round.recovered = done.is_some();
            round.recovery_s = done.map_or(0.0, |t| (t - t0).as_secs_f64());
            round.note = format!(
                "SIGKILL with {} tasks leased; serving again after {serving:.2} s; recovery: until every task leased at the kill was done",
                held.len()
            );
        }
        Fault::Garbage => {
            let (sent, conns) = garbage(env.url).await?;
            let t0 = Instant::now();
            let answered = answers(env.url).await;
            let (_, before) = progress(env.conn).await?;
            let mut moved = None;
            while Instant::now() < deadline && moved.is_none() {
                let (ended, now) = progress(env.conn).await?;
                if now > before || ended >= i64::from(env.config.jobs) {
                    moved = Some(Instant::now());
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let alive = env.tracker.alive();
            round.recovered = answered && alive && moved.is_some();
            round.recovery_s = moved.map_or(0.0, |t| (t - t0).as_secs_f64());
            round.note = format!(
                "{sent} bytes of garbage on {conns} connections; tracker alive {alive}, answered GetJob {answered}; \
                 recovery: until the next record was stored"
            );
        }
        Fault::DiskFull | Fault::Fsize => {
            let (_, before) = progress(env.conn).await?;
            let what = if fault == Fault::DiskFull {
                let tmpfs = env.tmpfs.context("disk-full needs the database on a tmpfs (--tmpfs-mib)")?;
                let filled = tmpfs.fill().await?;
                format!("tmpfs filled ({} KiB of filler)", filled / 1024)
            } else {
                let pid = env.tracker.pid().context("the tracker is gone")?;
                prlimit(pid, "0:unlimited").await?;
                "RLIMIT_FSIZE of the tracker set to 0".to_owned()
            };
            tokio::time::sleep(env.config.hold).await;
            let (_, during) = progress(env.conn).await?;
            if fault == Fault::DiskFull {
                env.tmpfs.context("tmpfs")?.free()?;
            } else {
                prlimit(env.tracker.pid().context("the tracker is gone")?, "unlimited:unlimited").await?;
            }
            let t0 = Instant::now();
            let mut moved = None;
            while Instant::now() < deadline && moved.is_none() {
                let (ended, now) = progress(env.conn).await?;
                if now > during || ended >= i64::from(env.config.jobs) {
                    moved = Some(Instant::now());
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let alive = env.tracker.alive();
            round.recovered = alive && moved.is_some();
            round.recovery_s = moved.map_or(0.0, |t| (t - t0).as_secs_f64());
            round.note = format!(
                "{what} for {:.1} s: records {before} -> {during} while it held; tracker alive {alive}; \
                 recovery: from its removal until the next record was stored",
                env.config.hold.as_secs_f64()
            );
        }
        Fault::CorruptDb | Fault::ReadonlyDb => unreachable!("start-up checks are not fired during the load"),
    }
    Ok(round)
}

/// Waits until every task of `tasks` is done; when, or `None` at `deadline`.
async fn wait_done(conn: &mut SqliteConnection, tasks: &[i64], deadline: Instant) -> Option<Instant> {
    loop {
        if let Ok(n) = check::done_among(conn, tasks).await
            && n == tasks.len() as i64
        {
            return Some(Instant::now());
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether the tracker answers a `GetJob` within 5 s.
async fn answers(url: &str) -> bool {
    let call = async {
        let mut client = TuningClient::connect(url.to_owned()).await.ok()?;
        client.get_job(pb::JobRef { job_id: 1 }).await.ok()
    };
    matches!(tokio::time::timeout(Duration::from_secs(5), call).await, Ok(Some(_)))
}

/// Sends garbage to the tracker's port: random bytes on fresh connections, a valid HTTP/2 client
/// preface followed by junk frames, and a connection that sends half a preface and stays silent.
/// Returns the bytes sent and the connections used.
pub async fn garbage(url: &str) -> anyhow::Result<(usize, usize)> {
    let addr = url.trim_start_matches("http://").to_owned();
    let mut sent = 0;
    let mut conns = 0;
    let mut silent = Vec::new();
    for i in 0..40 {
        let mut stream = tokio::net::TcpStream::connect(&addr).await?;
        conns += 1;
        let len = rand::rng().random_range(1..=16 * 1024);
        let mut bytes = vec![0u8; len];
        rand::rng().fill_bytes(&mut bytes);
        if i % 4 == 1 {
            let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
            bytes.splice(0..0, preface.iter().copied());
        }
        if i % 10 == 9 {
            // Half a preface, then nothing: the server must not wait on it forever or for others.
            let _ = stream.write_all(b"PRI * HTTP/2").await;
            silent.push(stream);
            continue;
        }
        // The server may close the connection before everything is written; that is its right.
        if stream.write_all(&bytes).await.is_ok() {
            sent += bytes.len();
        }
        let _ = stream.shutdown().await;
    }
    drop(silent);
    Ok((sent, conns))
}

async fn prlimit(pid: u32, fsize: &str) -> anyhow::Result<()> {
    let status = Command::new("prlimit")
        .arg("--pid")
        .arg(pid.to_string())
        .arg(format!("--fsize={fsize}"))
        .status()
        .await
        .context("running prlimit (util-linux)")?;
    anyhow::ensure!(status.success(), "prlimit --pid {pid} --fsize={fsize} failed: {status}");
    Ok(())
}

/// A small tmpfs for the database (root only).
pub(crate) struct Tmpfs {
    pub(crate) path: PathBuf,
}

impl Tmpfs {
    pub(crate) async fn mount(path: &Path, mib: u64) -> anyhow::Result<Tmpfs> {
        std::fs::create_dir_all(path)?;
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(path)
            .status()
            .await
            .context("running mount")?;
        anyhow::ensure!(
            status.success(),
            "mount -t tmpfs on {} failed ({status}); disk-full needs root",
            path.display()
        );
        Ok(Tmpfs { path: path.to_path_buf() })
    }

    fn filler(&self) -> PathBuf {
        self.path.join("filler")
    }

    /// Writes a filler file until the disk is full; returns its size.
    async fn fill(&self) -> anyhow::Result<u64> {
        let mut file = tokio::fs::File::create(self.filler()).await?;
        let chunk = vec![0xa5u8; 64 * 1024];
        let mut size = 0u64;
        loop {
            match file.write(&chunk).await {
                Ok(0) => break,
                Ok(n) => size += n as u64,
                Err(e) if e.raw_os_error() == Some(28) => break,
                Err(e) => return Err(e).context("filling the tmpfs"),
            }
        }
        let _ = file.flush().await;
        Ok(size)
    }

    fn free(&self) -> anyhow::Result<()> {
        std::fs::remove_file(self.filler()).context("removing the filler")
    }

    pub(crate) async fn unmount(self) -> anyhow::Result<()> {
        let status = Command::new("umount").arg(&self.path).status().await?;
        anyhow::ensure!(status.success(), "umount {} failed: {status}", self.path.display());
        Ok(())
    }
}

/// Starts a tracker on a database spoiled as `fault` says and checks that it refuses with an
/// error naming the file and no panic.
pub async fn start_check(fault: Fault, tracker_bin: &Path, dir: &Path) -> anyhow::Result<StartCheck> {
    anyhow::ensure!(fault.at_start(), "{fault} is not a start-up check (those are corrupt-db and readonly-db)");
    let dir = dir.join(fault.name());
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let db = dir.join("spoiled.db");
    // A real database first (migrated, closed), then spoiled.
    crate::store::open(&db).await?.close().await;
    let mut undo = None;
    match fault {
        Fault::CorruptDb => {
            let mut bytes = std::fs::read(&db)?;
            let n = bytes.len().min(4096);
            rand::rng().fill_bytes(&mut bytes[..n]);
            std::fs::write(&db, bytes)?;
        }
        Fault::ReadonlyDb => undo = Some(read_only(&dir).await?),
        _ => unreachable!("checked above"),
    }
    let out = Command::new(tracker_bin)
        .args(["--listen", "127.0.0.1:0", "--db"])
        .arg(&db)
        .env("RUST_LOG", "warn")
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(30), out).await;
    if let Some(undo) = undo {
        undo.await?;
    }
    let out = match out {
        Ok(out) => out?,
        Err(_) => {
            return Ok(StartCheck { fault, passed: false, said: "the tracker started and served for 30 s".into() });
        }
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    let said = stderr
        .lines()
        .find(|l| l.starts_with("Error:"))
        .or_else(|| stderr.lines().rev().find(|l| !l.trim().is_empty()))
        .unwrap_or_default()
        .trim()
        .to_owned();
    let names_file = stderr.contains(&db.display().to_string());
    let passed = !out.status.success() && names_file && !stderr.contains("panicked");
    Ok(StartCheck { fault, passed, said })
}

/// Makes `dir` read-only (a read-only bind mount when root, which ignores permissions; the
/// permission bits otherwise); returns what undoes it.
async fn read_only(dir: &Path) -> anyhow::Result<std::pin::Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>>> {
    let root = Command::new("id").arg("-u").output().await.map(|o| o.stdout.starts_with(b"0")).unwrap_or(false);
    if root {
        let d = dir.display().to_string();
        let status = Command::new("sh")
            .arg("-c")
            .arg(format!("mount --bind '{d}' '{d}' && mount -o remount,bind,ro '{d}'"))
            .status()
            .await?;
        anyhow::ensure!(status.success(), "making {d} a read-only bind mount failed");
        Ok(Box::pin(async move {
            let status = Command::new("umount").arg(&d).status().await?;
            anyhow::ensure!(status.success(), "umount {d} failed");
            Ok(())
        }))
    } else {
        use std::os::unix::fs::PermissionsExt;
        for entry in std::fs::read_dir(dir)? {
            std::fs::set_permissions(entry?.path(), std::fs::Permissions::from_mode(0o444))?;
        }
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o555))?;
        let dir = dir.to_path_buf();
        Ok(Box::pin(async move {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
            Ok(())
        }))
    }
}
