//! The daemon's side of the measuring child: start it, say Hello, send one `Measure` at a time
//! under a deadline, and replace it when it dies, hangs, answers garbage or reports a poisoned
//! context. A kernel can take a child down, never the daemon: each of those ends as a record
//! (`launch_error` or `timeout`) and the next task gets a fresh child.

use std::collections::{HashSet, VecDeque};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, anyhow};
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{ChildStderr, ChildStdin, ChildStdout};
use tokio::task::JoinHandle;

use crate::config::{DeviceSpec, WorkerConfig};
use crate::frame::{self, FrameError};
use crate::protocol::{Device, MeasureOutcome, MeasureRequest, Request, Response, Status};
use crate::sim::SIM_FAULTS_ENV;

/// How long a child may take to open its device and answer Hello (CUDA context creation and
/// library loading take seconds on a busy machine).
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a child that was asked to exit, or whose pipe broke, gets before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(3);
/// Lines of the child's stderr kept to explain its death in the record.
const STDERR_TAIL: usize = 20;
/// Longest stderr line kept in the tail; a runaway line must not bloat every record.
const STDERR_LINE: usize = 1000;
/// Starts tried before a child that used to work is declared gone for good.
const RESTART_ATTEMPTS: u32 = 3;

/// One measuring child process.
struct Child {
    process: tokio::process::Child,
    pid: u32,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// The last lines of stderr, shared with the pump that forwards them to the log.
    tail: Arc<Mutex<VecDeque<String>>>,
    /// Forwards stderr to the log until the child closes it; awaited when the child is retired.
    pump: JoinHandle<()>,
}

/// How a child is ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    /// Send `Shutdown` and wait for it to exit (killed after a grace period).
    Ask,
    /// Kill it now (it hangs, or speaks garbage).
    Kill,
    /// It is dying already (its pipe broke): collect its exit status (killed after a grace period).
    Reap,
}

impl End {
    /// A child whose pipe closed is dying; one that sent garbage is alive and must be stopped.
    fn after(error: &FrameError) -> End {
        match error {
            FrameError::Closed => End::Reap,
            _ => End::Kill,
        }
    }
}

impl Child {
    async fn exchange(&mut self, request: &Request) -> Result<Response, FrameError> {
        frame::write_async(&mut self.stdin, request).await?;
        frame::read_async(&mut self.stdout).await
    }

    /// Ends the child and says how it ended, with the tail of its stderr.
    async fn retire(mut self, end: End) -> String {
        if end == End::Ask {
            let _ = tokio::time::timeout(EXIT_GRACE, frame::write_async(&mut self.stdin, &Request::Shutdown)).await;
        }
        drop(self.stdin);
        if end == End::Kill {
            let _ = self.process.start_kill();
        }
        let status = match tokio::time::timeout(EXIT_GRACE, self.process.wait()).await {
            Ok(status) => status,
            Err(_) => {
                let _ = self.process.start_kill();
                self.process.wait().await
            }
        };
        // The pump ends when the child's stderr closes; a grandchild holding it open must not
        // hold us up.
        if tokio::time::timeout(EXIT_GRACE, &mut self.pump).await.is_err() {
            self.pump.abort();
        }
        let tail: Vec<String> = self.tail.lock().expect("stderr tail lock").iter().cloned().collect();
        let status = match status {
            Ok(s) => s.to_string(),
            Err(e) => format!("unknown status ({e})"),
        };
        if tail.is_empty() {
            format!("child {} ended with {status}; its stderr was empty", self.pid)
        } else {
            format!("child {} ended with {status}; its stderr ends with:\n{}", self.pid, tail.join("\n"))
        }
    }
}

async fn pump_stderr(stderr: ChildStderr, tail: Arc<Mutex<VecDeque<String>>>, pid: u32, gpu: String) {
    let mut reader = BufReader::new(stderr);
    let mut buf = Vec::new();
    // Bytes, not `lines()`: a line of invalid UTF-8 must not stop the pump (the child would then
    // block on a full pipe).
    while let Ok(n) = reader.read_until(b'\n', &mut buf).await {
        if n == 0 {
            break;
        }
        let line = String::from_utf8_lossy(&buf).trim_end().to_owned();
        buf.clear();
        if line.is_empty() {
            continue;
        }
        tracing::info!(target: "tensortune_worker::child", child = pid, gpu = %gpu, "{line}");
        let mut tail = tail.lock().expect("stderr tail lock");
        if tail.len() == STDERR_TAIL {
            tail.pop_front();
        }
        tail.push_back(line.chars().take(STDERR_LINE).collect());
    }
}

/// Starts measuring children: the configured command plus the device spec.
struct Launcher {
    command: Vec<String>,
    device: DeviceSpec,
    /// `TENSORTUNE_SIM_FAULTS` for sim children, when faults are configured.
    faults: Option<String>,
}

impl Launcher {
    /// Starts a child and waits for its Hello.
    async fn spawn(&self) -> anyhow::Result<(Child, Device)> {
        let (program, args) = self.command.split_first().ok_or_else(|| {
            anyhow!("no command starts the measuring child (the current executable was not found); set child_command")
        })?;
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(args)
            .arg(self.device.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some(faults) = &self.faults {
            cmd.env(SIM_FAULTS_ENV, faults);
        }
        let mut process = cmd.spawn().with_context(|| format!("could not start the measuring child {program:?}"))?;
        let pid = process.id().unwrap_or(0);
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (process.stdin.take(), process.stdout.take(), process.stderr.take())
        else {
            unreachable!("all three pipes were requested");
        };
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        let pump = tokio::spawn(pump_stderr(stderr, tail.clone(), pid, self.device.to_string()));
        let mut child = Child { process, pid, stdin, stdout: BufReader::new(stdout), tail, pump };

        match tokio::time::timeout(STARTUP_TIMEOUT, child.exchange(&Request::Hello)).await {
            Ok(Ok(Response::Hello(facts))) => Ok((child, facts)),
            Ok(Ok(Response::Fatal(text))) => {
                child.retire(End::Reap).await;
                Err(anyhow!("{text}"))
            }
            Ok(Ok(other)) => {
                let detail = child.retire(End::Kill).await;
                Err(anyhow!("the measuring child {program:?} answered hello with {}; {detail}", kind(&other)))
            }
            Ok(Err(e)) => {
                let detail = child.retire(End::after(&e)).await;
                Err(anyhow!("the measuring child {program:?} did not say hello ({e}); {detail}"))
            }
            Err(_) => {
                let detail = child.retire(End::Kill).await;
                Err(anyhow!(
                    "the measuring child {program:?} did not say hello within {} s; {detail}",
                    STARTUP_TIMEOUT.as_secs()
                ))
            }
        }
    }
}

/// Owns the current measuring child and replaces it when needed.
pub(crate) struct Supervisor {
    launcher: Launcher,
    timeout: Duration,
    /// The device as the first child described it; later children must describe the same one.
    facts: Device,
    /// `None` after a child was retired, until the next measurement starts a fresh one.
    child: Option<Child>,
    /// Workload keys whose support module the current child holds (so they are not sent again).
    support_loaded: HashSet<String>,
}

impl Supervisor {
    /// Starts the first child and asks it for the device. A child that cannot open the device
    /// fails this with the child's own explanation; there is no retry (a machine without the GPU
    /// will not grow one).
    pub(crate) async fn start(config: &WorkerConfig) -> anyhow::Result<Supervisor> {
        let faults = match config.device {
            DeviceSpec::Sim if !config.sim_faults.is_empty() => Some(serde_json::to_string(&config.sim_faults)?),
            _ => None,
        };
        let launcher = Launcher { command: config.child_command.clone(), device: config.device.clone(), faults };
        // The one place a worker opens its device: the daemon and `probe` both come here.
        let (child, facts) = launcher.spawn().await.with_context(|| format!("opening {}", config.device))?;
        tracing::info!(gpu = %config.device, child = child.pid, device = %facts.target.name, class = %facts.target.class_key, "measuring child started");
        Ok(Supervisor {
            launcher,
            timeout: config.measure_timeout,
            facts,
            child: Some(child),
            support_loaded: HashSet::new(),
        })
    }

    /// The device, as the first child described it.
    pub(crate) fn facts(&self) -> &Device {
        &self.facts
    }

    /// Measures one config in the current child, starting a fresh one if the last was retired.
    /// A child that dies, hangs past the deadline or answers garbage is retired and the task gets
    /// a `launch_error` or `timeout` outcome; `Err` only means no child can be started any more.
    pub(crate) async fn measure(&mut self, mut request: MeasureRequest) -> anyhow::Result<MeasureOutcome> {
        let device = self.launcher.device.clone();
        let timeout = self.timeout;
        let skip_support = self.support_loaded.contains(&request.workload_key);
        let child = self.ensure_child().await?;
        if skip_support {
            request.support_cubin = Vec::new();
        }
        let task = request.task_id;
        let exchanged = tokio::time::timeout(timeout, child.exchange(&Request::Measure(Box::new(request)))).await;
        let outcome = match exchanged {
            Ok(Ok(Response::Measured { outcome, support_loaded, poisoned })) => {
                self.support_loaded = support_loaded.into_iter().collect();
                if poisoned {
                    tracing::warn!(task, gpu = %device, "the child's CUDA context is poisoned; replacing the child");
                    self.retire(End::Ask).await;
                }
                outcome
            }
            Ok(Ok(other)) => {
                let detail = self.retire(End::Kill).await;
                MeasureOutcome::failed(
                    Status::LaunchError,
                    format!("the measuring child answered a measure request with {}; {detail}", kind(&other)),
                )
            }
            Ok(Err(e)) => {
                let detail = self.retire(End::after(&e)).await;
                MeasureOutcome::failed(
                    Status::LaunchError,
                    format!("the measuring child died during the measurement ({e}); {detail}"),
                )
            }
            Err(_) => {
                let detail = self.retire(End::Kill).await;
                MeasureOutcome::failed(
                    Status::Timeout,
                    format!(
                        "the measurement ran past the deadline of {:.1} s and its child was killed; {detail}",
                        timeout.as_secs_f64()
                    ),
                )
            }
        };
        if outcome.status != Status::Ok {
            tracing::warn!(task, gpu = %device, status = ?outcome.status, "{}", outcome.error);
        }
        Ok(outcome)
    }

    /// Asks the child to exit and goes on without waiting for it: the daemon's last step, where
    /// nothing waits on the GPU any more. A background task collects its exit status while the
    /// runtime lives (killing it after the grace period); should the runtime end first (the
    /// command line's embedded worker, once its job is done), the child is killed with it. Saves
    /// the child's exit from the end of every `tune` (0.2-0.4 s on an H200).
    pub(crate) fn shutdown_detached(mut self) {
        if let Some(child) = self.child.take() {
            let device = self.launcher.device.clone();
            tokio::spawn(async move {
                let how = child.retire(End::Ask).await;
                tracing::debug!(gpu = %device, "measuring child stopped: {how}");
            });
        }
    }

    /// Asks the child to exit, killing it after a grace period.
    pub(crate) async fn shutdown(mut self) {
        if self.child.is_some() {
            let how = self.retire(End::Ask).await;
            tracing::debug!(gpu = %self.launcher.device, "measuring child stopped: {how}");
        }
    }

    async fn retire(&mut self, end: End) -> String {
        self.support_loaded.clear();
        match self.child.take() {
            Some(child) => child.retire(end).await,
            None => "no child was running".to_owned(),
        }
    }

    async fn ensure_child(&mut self) -> anyhow::Result<&mut Child> {
        if self.child.is_none() {
            let device = self.launcher.device.clone();
            let mut attempt = 0;
            let child = loop {
                attempt += 1;
                match self.launcher.spawn().await {
                    Ok((child, facts))
                        if facts.target.class_key == self.facts.target.class_key && facts.uuid == self.facts.uuid =>
                    {
                        break child;
                    }
                    Ok((child, facts)) => {
                        child.retire(End::Ask).await;
                        anyhow::bail!(
                            "a restarted measuring child reports device {:?} ({}); the first one reported {:?} ({})",
                            facts.target.class_key,
                            facts.uuid,
                            self.facts.target.class_key,
                            self.facts.uuid
                        );
                    }
                    Err(e) if attempt < RESTART_ATTEMPTS => {
                        tracing::warn!(gpu = %device, attempt, "could not restart the measuring child: {e:#}");
                        tokio::time::sleep(Duration::from_secs(1 << attempt)).await;
                    }
                    Err(e) => return Err(e.context(format!("{attempt} starts of a fresh measuring child failed"))),
                }
            };
            tracing::info!(gpu = %device, child = child.pid, "started a fresh measuring child");
            self.child = Some(child);
        }
        Ok(self.child.as_mut().expect("a child was just started"))
    }
}

fn kind(response: &Response) -> &'static str {
    match response {
        Response::Hello(_) => "a hello",
        Response::Measured { .. } => "a measurement",
        Response::Fatal(_) => "a fatal error",
    }
}
