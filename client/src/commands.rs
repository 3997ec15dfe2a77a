//! The commands: each takes validated flags and a session, and prints its result.

use std::io::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressStyle};
use tensortune_kernels::Workload;
use tensortune_proto::pb;
use tokio_stream::StreamExt;

use crate::cli::{BestCmd, JobArgs, LocalDevice, RecordsCmd, WorkloadCmd};
use crate::report::{self, JobView, RecordView};
use crate::session::Session;

/// The session a command needs: the remote tracker, or an embedded one (with a local worker when
/// the command measures).
pub async fn open(tracker: Option<&str>, db: &Path, local: Option<&LocalDevice>) -> anyhow::Result<Session> {
    match tracker {
        Some(url) => Session::remote(url).await,
        None => Session::embedded(db, local).await,
    }
}

/// Quarantines a worker and says how many of its records became untrusted.
pub async fn quarantine(tracker: Option<&str>, db: &Path, worker: u64, reason: &str) -> anyhow::Result<()> {
    let mut session = open(tracker, db, None).await?;
    let request = pb::QuarantineWorkerRequest { worker_id: worker, reason: reason.to_owned() };
    let answer = session.client.quarantine_worker(request).await.map_err(status_error);
    session.close().await?;
    let records = answer?.into_inner().records;
    println!("worker {worker} quarantined: {records} of its records are no longer trusted; it may not lease or report");
    Ok(())
}

/// Runs `tensortune selftest` on a blocking thread (NVRTC and the CUDA calls must not hold the
/// runtime's workers) and fails when any kernel failed.
pub async fn selftest(args: &crate::cli::SelftestArgs) -> anyhow::Result<()> {
    let args = crate::selftest::Args::try_from(args)?;
    tokio::task::spawn_blocking(move || crate::selftest::run(&args)).await.context("the self-test thread")?
}

/// The tuner of a job that names none.
pub const DEFAULT_TUNER: &str = "model";

/// The submit request for `workloads` with the job flags.
pub fn submit_request(
    workloads: &[Workload],
    job: &JobArgs,
    device_class: Option<String>,
    label: &str,
) -> pb::SubmitJobRequest {
    pb::SubmitJobRequest {
        workloads: workloads.iter().map(pb::Workload::from).collect(),
        template: job.template.clone().unwrap_or_default(),
        tuner: job.tuner.clone().unwrap_or_else(|| DEFAULT_TUNER.to_owned()),
        trials: job.trials,
        device_class: device_class.unwrap_or_default(),
        batch_size: job.batch,
        seed: job.seed,
        samples: job.samples,
        label: label.to_owned(),
        early_stop_trials: job.early_stop,
        early_stop_margin: job.early_stop_margin,
        finalists: job.finalists,
        finalist_rounds: job.finalist_rounds,
        flush_l2: job.flush_l2,
        total_trials: job.total_trials,
        transfer: Some(!job.no_transfer),
        weights: Vec::new(),
        regime: job.regime.name().to_owned(),
        objective: job.objective.name().to_owned(),
        max_slowdown: job.max_slowdown,
        no_energy: job.skips_energy(),
    }
}

/// Submits a job and follows it to its end with a progress bar (on stderr); returns the final job.
pub async fn submit_and_watch(session: &mut Session, request: pb::SubmitJobRequest) -> anyhow::Result<pb::Job> {
    submit_and_follow(session, request, &mut Milestones::default()).await
}

/// [`submit_and_watch`], noting when it submitted and when the job reached each stage.
async fn submit_and_follow(
    session: &mut Session,
    request: pb::SubmitJobRequest,
    seen: &mut Milestones,
) -> anyhow::Result<pb::Job> {
    let submitted = session.client.submit_job(request).await.map_err(status_error)?.into_inner();
    seen.submitted = Some(Instant::now());
    eprintln!("job {} submitted for {}", submitted.job_id, submitted.device_class);
    follow(session, submitted.job_id, Progress::Auto, seen).await
}

/// When a followed job reached each stage, as its watch stream showed it (an update arrives
/// after each write that changed the job, so these lag the tracker by a few milliseconds).
#[derive(Clone, Copy, Debug, Default)]
pub struct Milestones {
    /// The tracker answered the submission (its first batch is proposed by then).
    pub submitted: Option<Instant>,
    /// The first trial finished.
    pub first_record: Option<Instant>,
    /// Every workload's trials finished (finalists, if any, follow).
    pub trials_done: Option<Instant>,
    /// The job ended.
    pub ended: Option<Instant>,
}

impl Milestones {
    /// Notes the stages `job` shows that were not seen before.
    fn note(&mut self, job: &pb::Job) {
        let now = Instant::now();
        let done: u64 = job.workloads.iter().map(|w| u64::from(w.trials_done)).sum();
        if done > 0 {
            self.first_record.get_or_insert(now);
        }
        let tuning = job.workloads.iter().any(|w| w.state == "running");
        if !job.workloads.is_empty() && !tuning {
            self.trials_done.get_or_insert(now);
        }
        if ended(job) {
            self.ended.get_or_insert(now);
        }
    }

    /// One line: seconds from `start` to `open` (the tracker and worker ready), to submission, to
    /// the first record, to the end of the trials, to the end of the job, and to `closed`
    /// (everything stopped); a stage not seen reads `-`.
    pub fn line(&self, start: Instant, open: Instant, closed: Instant) -> String {
        let mut stages = vec![("ready", Some(open))];
        stages.extend([
            ("submitted", self.submitted),
            ("first record", self.first_record),
            ("trials done", self.trials_done),
            ("job ended", self.ended),
            ("closed", Some(closed)),
        ]);
        let parts: Vec<String> = stages
            .iter()
            .map(|(name, at)| match at {
                Some(at) => format!("{name} {:.2} s", at.duration_since(start).as_secs_f64()),
                None => format!("{name} -"),
            })
            .collect();
        format!("timeline  {}", parts.join(", "))
    }
}

/// How long `watch` keeps trying to reach a remote tracker that went away (killed, restarted,
/// a network blip) before it gives up; the job itself lives in the tracker's database meanwhile.
const RECONNECT_FOR: Duration = Duration::from_secs(120);
/// The longest pause between two reconnection attempts.
const RECONNECT_MAX_DELAY: Duration = Duration::from_secs(5);

/// Whether a failed call to the tracker may succeed once the tracker is back: the transport
/// failed (unreachable, connection reset, an HTTP/2 stream cut by a dying server), as opposed to
/// an answer.
fn transient(status: &tonic::Status) -> bool {
    matches!(status.code(), tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled)
}

/// Whether the job has ended (its watch stream then ends too).
fn ended(job: &pb::Job) -> bool {
    matches!(job.state(), pb::JobState::Done | pb::JobState::Cancelled | pb::JobState::Failed)
}

/// Opens the job's watch stream again after the tracker went away, with backoff, for up to
/// [`RECONNECT_FOR`] since `lost` (when it was lost); then gives up saying the job goes on.
async fn rewatch(
    session: &mut Session,
    job_id: u64,
    url: &str,
    bar: &ProgressBar,
    lost: Instant,
    why: &str,
) -> anyhow::Result<tonic::Streaming<pb::Job>> {
    let mut delay = Duration::from_millis(250);
    loop {
        if lost.elapsed() > RECONNECT_FOR {
            bar.abandon();
            bail!(
                "lost the tracker at {url} ({why}) and it did not come back within {} s; the job goes on there: \
                 follow it with `tensortune --tracker {url} watch {job_id}`",
                RECONNECT_FOR.as_secs()
            );
        }
        bar.set_message(format!("the tracker went away ({why}); reconnecting"));
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(RECONNECT_MAX_DELAY);
        session.fail_over().await;
        match session.client.watch_job(pb::JobRef { job_id }).await {
            Ok(stream) => {
                tracing::info!(job = job_id, "reconnected to the tracker at {url}");
                return Ok(stream.into_inner());
            }
            Err(status) if transient(&status) => continue,
            Err(status) => {
                bar.abandon();
                return Err(status_error(status));
            }
        }
    }
}

/// How a followed job's progress is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// A progress bar on stderr when it is a terminal; otherwise a plain line on stderr when the
    /// job's state changes and at most every [`PLAIN_EVERY`] while trials finish (logs, CI).
    Auto,
    /// Nothing (library callers).
    Quiet,
}

/// The shortest interval between two plain progress lines.
const PLAIN_EVERY: Duration = Duration::from_secs(5);

/// Follows a job until it ends. With a remote tracker, a tracker that goes away (killed or
/// restarted) is waited for and followed again, for up to [`RECONNECT_FOR`].
pub async fn watch(session: &mut Session, job_id: u64) -> anyhow::Result<pb::Job> {
    watch_with(session, job_id, Progress::Auto).await
}

/// [`watch`], showing progress as `progress` says.
pub async fn watch_with(session: &mut Session, job_id: u64, progress: Progress) -> anyhow::Result<pb::Job> {
    follow(session, job_id, progress, &mut Milestones::default()).await
}

/// [`watch_with`], noting in `seen` when the job reached each stage.
async fn follow(
    session: &mut Session,
    job_id: u64,
    progress: Progress,
    seen: &mut Milestones,
) -> anyhow::Result<pb::Job> {
    let mut stream = session.client.watch_job(pb::JobRef { job_id }).await.map_err(status_error)?.into_inner();
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let bar = if progress == Progress::Auto && terminal { ProgressBar::new(0) } else { ProgressBar::hidden() };
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} trials {msg}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    let plain = progress == Progress::Auto && !terminal;
    let started = Instant::now();
    // The last plain line: when, the job's state and trials done.
    let mut printed: Option<(Instant, i32, u64)> = None;
    let mut last: Option<pb::Job> = None;
    // Since when the tracker has been unreachable (None while it answers).
    let mut lost: Option<Instant> = None;
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tokio::select! {
            item = stream.next() => {
                let why = match item {
                    Some(Ok(job)) => {
                        lost = None;
                        seen.note(&job);
                        let total: u64 = job.workloads.iter().map(|w| w.trials_target as u64).sum();
                        let done: u64 = job.workloads.iter().map(|w| w.trials_done as u64).sum();
                        bar.set_length(total);
                        bar.set_position(done);
                        bar.set_message(report::progress_message(&job));
                        let due = match printed {
                            None => true,
                            Some((at, state, was)) => state != job.state || (was != done && at.elapsed() >= PLAIN_EVERY),
                        };
                        if plain && due {
                            let state = job.state().as_str_name().trim_start_matches("JOB_STATE_").to_ascii_lowercase();
                            let secs = started.elapsed().as_secs();
                            let best = report::progress_message(&job);
                            let sep = if best.is_empty() { "" } else { "; " };
                            eprintln!("[{secs:>4} s] job {job_id} {state}: {done}/{total} trials{sep}{best}");
                            printed = Some((Instant::now(), job.state, done));
                        }
                        last = Some(job);
                        continue;
                    }
                    Some(Err(status)) if session.remote_url.is_some() && transient(&status) => status.to_string(),
                    Some(Err(status)) => {
                        bar.abandon();
                        return Err(status_error(status));
                    }
                    // The stream ends when the job ends, or when the tracker shuts down.
                    None if session.remote_url.is_some() && !last.as_ref().is_some_and(ended) => {
                        "it closed the stream before the job ended".to_string()
                    }
                    None => break,
                };
                let url = session.remote_url.clone().unwrap_or_default();
                let since = *lost.get_or_insert_with(Instant::now);
                stream = rewatch(session, job_id, &url, &bar, since, &why).await?;
            },
            _ = tick.tick() => {
                if let Some(e) = session.worker_stopped().await {
                    bar.abandon();
                    return Err(e.context(format!("job {job_id} cannot finish here")));
                }
            }
        }
    }
    bar.finish_and_clear();
    match last {
        Some(job) => Ok(job),
        None => bail!("the tracker closed the stream of job {job_id} without sending it"),
    }
}

/// `tensortune tune ...`
pub async fn tune(tracker: Option<&str>, db: &Path, cmd: &WorkloadCmd) -> anyhow::Result<()> {
    let workload = cmd.workload()?;
    let (job, local, json) = cmd.parts();
    let template_given = job.template.is_some();
    let start = Instant::now();
    let mut session = open(tracker, db, Some(local)).await?;
    let opened = Instant::now();
    let class = job.device_class.clone().or_else(|| session.local_class.clone());
    let mut seen = Milestones::default();
    let result = submit_and_follow(&mut session, submit_request(&[workload], job, class, "tune"), &mut seen).await;
    let closed = session.close().await;
    // Where a tune's wall goes, on stderr beside the progress (the report on stdout stays as is).
    eprintln!("{}", seen.line(start, opened, Instant::now()));
    let job = result?;
    closed?;
    let view = JobView::from(&job);
    print!("{}", report::fmt_job(&view));
    if let Some(hint) = report::template_hint(template_given, &view) {
        println!("{hint}");
    }
    if tracker.is_none() {
        println!("records are in {}", db.display());
    }
    if let Some(path) = json {
        write_json(path, &view)?;
    }
    if view.state != "done" {
        bail!("job {} ended {}: {}", view.id, view.state, view.error);
    }
    Ok(())
}

/// `tensortune best ...`
pub async fn best(
    tracker: Option<&str>,
    db: &Path,
    cmd: &BestCmd,
    device_class: Option<&str>,
    json: bool,
) -> anyhow::Result<()> {
    let (workload, query) = cmd.parts()?;
    let device_class = query.device_class.as_deref().or(device_class);
    let json = json || query.json;
    let mut session = open(tracker, db, None).await?;
    let answer = session
        .client
        .query_best(pb::QueryBestRequest {
            workload: Some(pb::Workload::from(&workload)),
            device_class: device_class.unwrap_or_default().to_owned(),
            template: query.template.clone().unwrap_or_default(),
            template_version: 0,
            nearest: true,
            regime: query.regime.name().to_owned(),
        })
        .await
        .map_err(status_error);
    session.close().await?;
    let key = workload.key();
    let records: Vec<BestView> = answer?
        .into_inner()
        .best
        .iter()
        .map(|r| BestView { nearest: r.workload_key != key, record: RecordView::from(r) })
        .collect();
    if json {
        println!("{}", serde_json::to_string_pretty(&records)?);
        return Ok(());
    }
    if records.is_empty() {
        println!("nothing measured yet for {key} or any shape of its types and layout");
        return Ok(());
    }
    println!("{key}");
    for b in &records {
        let r = &b.record;
        println!("{} ({} v{})", r.device_class, r.template, r.template_version);
        if b.nearest {
            println!(
                "  NEAREST tuned shape {} (this class has no record of the asked shape; its config is a starting point: tune the shape)",
                r.workload
            );
        }
        print!("{}", report::fmt_best(r));
    }
    Ok(())
}

/// One answer of `best`: the record, and whether it is of the nearest tuned shape rather than the
/// asked one.
#[derive(Debug, serde::Serialize)]
pub struct BestView {
    /// The record (its `workload` is the tuned shape).
    #[serde(flatten)]
    pub record: RecordView,
    /// Whether its shape differs from the asked one.
    pub nearest: bool,
}

/// `tensortune jobs`
pub async fn jobs(tracker: Option<&str>, db: &Path, states: &[String], limit: u32, json: bool) -> anyhow::Result<()> {
    let states = states
        .iter()
        .map(|s| {
            pb::JobState::from_str_name(&format!("JOB_STATE_{}", s.to_ascii_uppercase()))
                .filter(|s| *s != pb::JobState::Unspecified)
                .map(|s| s as i32)
                .ok_or_else(|| {
                    anyhow::anyhow!("invalid --state {s:?}; expected queued, running, done, cancelled or failed")
                })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut session = open(tracker, db, None).await?;
    let answer = session.client.list_jobs(pb::ListJobsRequest { states, limit }).await.map_err(status_error);
    session.close().await?;
    let jobs = answer?.into_inner().jobs;
    if json {
        let views: Vec<JobView> = jobs.iter().map(JobView::from).collect();
        println!("{}", serde_json::to_string_pretty(&views)?);
        return Ok(());
    }
    if jobs.is_empty() {
        println!("no jobs");
    }
    println!(
        "{:>5}  {:<9}  {:<28}  {:<20}  {:>11}  {:>10}  {:<12}  workload",
        "id", "state", "device class", "templates", "trials", "best", "best of"
    );
    for j in &jobs {
        let v = JobView::from(j);
        for w in &v.workloads {
            println!(
                "{:>5}  {:<9}  {:<28}  {:<20}  {:>11}  {:>10}  {:<12}  {}",
                v.id,
                v.state,
                v.device_class,
                v.template,
                format!("{}/{}", w.trials_done, w.trials_target),
                w.best.as_ref().map(|b| report::fmt_us(b.median_us)).unwrap_or_else(|| "-".into()),
                w.best.as_ref().map(|b| b.template.as_str()).unwrap_or("-"),
                w.workload
            );
        }
    }
    Ok(())
}

/// `tensortune job ID`, `watch ID`, `cancel ID`.
pub async fn job(tracker: Option<&str>, db: &Path, id: u64, action: &str, json: bool) -> anyhow::Result<()> {
    let mut session = open(tracker, db, None).await?;
    let result = match action {
        "watch" => watch(&mut session, id).await,
        "cancel" => {
            session.client.cancel_job(pb::JobRef { job_id: id }).await.map(|r| r.into_inner()).map_err(status_error)
        }
        _ => session.client.get_job(pb::JobRef { job_id: id }).await.map(|r| r.into_inner()).map_err(status_error),
    };
    session.close().await?;
    let view = JobView::from(&result?);
    if json {
        println!("{}", serde_json::to_string_pretty(&view)?);
    } else {
        print!("{}", report::fmt_job(&view));
    }
    Ok(())
}

/// `tensortune workers`
pub async fn workers(tracker: Option<&str>, db: &Path, json: bool) -> anyhow::Result<()> {
    let mut session = open(tracker, db, None).await?;
    let answer = session.client.list_workers(pb::ListWorkersRequest {}).await.map_err(status_error);
    session.close().await?;
    let workers = answer?.into_inner().workers;
    if json {
        let views: Vec<report::WorkerView> = workers.iter().map(report::WorkerView::from).collect();
        println!("{}", serde_json::to_string_pretty(&views)?);
        return Ok(());
    }
    if workers.is_empty() {
        println!("no workers have registered");
        return Ok(());
    }
    println!(
        "{:>4}  {:<8}  {:<32}  {:<28}  {:>6}  {:>8}  {:>12}  {:>7}",
        "id", "state", "name", "device class", "leased", "reported", "reference", "drift"
    );
    for w in workers {
        let class = w.device.as_ref().map(|d| d.class_key.as_str()).unwrap_or("");
        let reference = if w.reference_us > 0.0 { format!("{:.2} us", w.reference_us) } else { "-".into() };
        let drift = if w.reference_us > 0.0 { format!("{:+.1}%", 100.0 * w.drift) } else { "-".into() };
        let flag = if w.flagged { "  FLAGGED: its timings disagree with its peers'" } else { "" };
        println!(
            "{:>4}  {:<8}  {:<32}  {:<28}  {:>6}  {:>8}  {:>12}  {:>7}{flag}",
            w.id, w.state, w.name, class, w.leased, w.reported, reference, drift
        );
    }
    Ok(())
}

/// `tensortune records export` and `tensortune records import`
pub async fn records(tracker: Option<&str>, db: &Path, cmd: &RecordsCmd) -> anyhow::Result<()> {
    let (workload, device_class, job, ok_only, output) = match cmd {
        RecordsCmd::Export { workload, device_class, job, ok_only, output } => {
            (workload, device_class, job, ok_only, output)
        }
        RecordsCmd::Import { file, pack } => return import_records(tracker, db, file, pack.as_deref()).await,
    };
    let mut session = open(tracker, db, None).await?;
    let result = async {
        let request = pb::ExportRecordsRequest {
            workload_key: workload.clone().unwrap_or_default(),
            device_class: device_class.clone().unwrap_or_default(),
            job_id: job.unwrap_or(0),
            ok_only: *ok_only,
        };
        let mut stream = session.client.export_records(request).await.map_err(status_error)?.into_inner();
        let mut out: Box<dyn std::io::Write> = match output {
            Some(path) => Box::new(std::io::BufWriter::new(
                std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?,
            )),
            None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
        };
        let mut n = 0u64;
        while let Some(record) = stream.next().await {
            let record = record.map_err(status_error)?;
            serde_json::to_writer(&mut out, &RecordView::from(&record))?;
            out.write_all(b"\n")?;
            n += 1;
        }
        out.flush()?;
        anyhow::Ok(n)
    }
    .await;
    session.close().await?;
    let n = result?;
    if let Some(path) = output {
        eprintln!("{n} records written to {}", path.display());
    }
    Ok(())
}

/// The most record text one `ImportRecords` call carries (the tracker's limit).
const IMPORT_CHUNK: usize = 3 << 20;

/// `tensortune records import FILE`: the pack's lines in calls of at most [`IMPORT_CHUNK`] bytes,
/// each cut at a line's end.
async fn import_records(tracker: Option<&str>, db: &Path, file: &Path, pack: Option<&str>) -> anyhow::Result<()> {
    use std::io::Read as _;
    let raw = std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
    let mut text = Vec::new();
    if raw.starts_with(&[0x1f, 0x8b]) {
        flate2::read::GzDecoder::new(raw.as_slice())
            .read_to_end(&mut text)
            .with_context(|| format!("{} is not a readable .gz file", file.display()))?;
    } else {
        text = raw;
    }
    let name = match pack {
        Some(p) => p.to_owned(),
        None => {
            let base = file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            base.split('.').next().unwrap_or_default().to_owned()
        }
    };
    let mut session = open(tracker, db, None).await?;
    let result = async {
        let (mut added, mut skipped, mut unknown) = (0u64, 0u64, 0u64);
        let mut rest = text.as_slice();
        while !rest.is_empty() {
            let mut cut = rest.len().min(IMPORT_CHUNK);
            if cut < rest.len() {
                cut =
                    rest[..cut].iter().rposition(|b| *b == b'\n').map(|i| i + 1).ok_or_else(|| {
                        anyhow::anyhow!("{}: a line longer than {IMPORT_CHUNK} bytes", file.display())
                    })?;
            }
            let request = pb::ImportRecordsRequest { pack: name.clone(), lines: rest[..cut].to_vec() };
            let answer = session.client.import_records(request).await.map_err(status_error)?.into_inner();
            (added, skipped, unknown) =
                (added + answer.added, skipped + answer.skipped, unknown + answer.unknown_template);
            rest = &rest[cut..];
        }
        anyhow::Ok((added, skipped, unknown))
    }
    .await;
    session.close().await?;
    let (added, skipped, unknown) = result?;
    println!(
        "pack {name}: {added} records added, {skipped} already stored, {unknown} of templates this tracker does not know"
    );
    Ok(())
}

/// Writes `value` as pretty JSON to `path`.
pub fn write_json<T: serde::Serialize>(path: &Path, value: &T) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    std::fs::write(path, text + "\n").with_context(|| format!("cannot write {}", path.display()))
}

/// A tracker's answer as an error: its message names the field; the code says what kind.
pub fn status_error(status: tonic::Status) -> anyhow::Error {
    match status.code() {
        tonic::Code::Unavailable => anyhow::anyhow!("the tracker is unavailable: {}", status.message()),
        tonic::Code::NotFound | tonic::Code::InvalidArgument | tonic::Code::FailedPrecondition => {
            anyhow::anyhow!("{}", status.message())
        }
        code => anyhow::anyhow!("the tracker answered {code:?}: {}", status.message()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(state: pb::JobState, workloads: &[(&str, u32)]) -> pb::Job {
        pb::Job {
            state: state as i32,
            workloads: workloads
                .iter()
                .map(|(s, done)| pb::WorkloadProgress {
                    state: (*s).to_owned(),
                    trials_done: *done,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn milestones_note_each_stage_once_in_order() {
        let start = Instant::now();
        let mut seen = Milestones::default();
        seen.note(&job(pb::JobState::Running, &[("running", 0), ("running", 0)]));
        assert!(seen.first_record.is_none() && seen.trials_done.is_none() && seen.ended.is_none());
        seen.note(&job(pb::JobState::Running, &[("running", 1), ("running", 0)]));
        let first = seen.first_record.expect("a trial finished");
        // One workload still tunes: the trials are not done.
        seen.note(&job(pb::JobState::Running, &[("finalizing", 100), ("running", 40)]));
        assert!(seen.trials_done.is_none());
        seen.note(&job(pb::JobState::Running, &[("finalizing", 100), ("done", 100)]));
        let trials = seen.trials_done.expect("no workload tunes");
        seen.note(&job(pb::JobState::Done, &[("done", 100), ("done", 100)]));
        assert_eq!(seen.first_record, Some(first), "a later update moved the first record");
        assert!(first <= trials && Some(trials) <= seen.ended);
        let line = Milestones::default().line(start, start, start);
        assert_eq!(
            line,
            "timeline  ready 0.00 s, submitted -, first record -, trials done -, job ended -, closed 0.00 s"
        );
    }
}
