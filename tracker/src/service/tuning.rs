//! The `Tuning` service that people and scripts call.

use std::sync::Arc;
use std::time::Instant;

use tensortune_kernels::Workload;
use tensortune_kernels::energy::Regime;
use tensortune_kernels::registry::{self, by_name};
use tensortune_proto::pb;
use tensortune_proto::pb::tuning_server::Tuning;
use tokio::sync::broadcast::error::{RecvError, TryRecvError};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::task::TaskTracker;
use tonic::{Request, Response, Status};

use super::convert::{self, id};
use crate::auth::Caller;
use crate::config::SUBMIT_BURST;
use crate::error::Error;
use crate::jobs::JobView;
use crate::limits::RateLimit;
use crate::model::{JobId, RecordFilter};
use crate::tracker::Tracker;

/// Snapshots a watcher may have in flight: a slow client holds the producer back here, and the
/// producer then coalesces the changes it missed into one snapshot.
const WATCH_BUFFER: usize = 4;
/// Records an export reads per query and may have in flight.
const EXPORT_PAGE: u32 = 256;
/// Longest quarantine reason, bytes.
const MAX_REASON: usize = 512;
/// The longest pack name of `ImportRecords`.
const MAX_PACK_NAME: usize = 200;
/// The most record text one `ImportRecords` call carries (under gRPC's 4 MiB message limit).
const MAX_IMPORT_BYTES: usize = 3 << 20;
/// Jobs a listing returns when the request sets no limit.
const DEFAULT_LIST_LIMIT: u32 = 100;
/// Watch and export streams open at once. Each holds a producer task and, while it reads, a
/// database connection; past this bound new streams are refused rather than piling up.
const MAX_STREAMS: usize = 1024;

/// Serves `Tuning` from a tracker.
pub(crate) struct TuningService {
    tracker: Arc<Tracker>,
    /// Owns the stream producers, so that shutdown waits for them to stop.
    tasks: TaskTracker,
    /// One permit per open stream, held by its producer.
    streams: Arc<Semaphore>,
    /// Job submissions per token.
    submissions: RateLimit,
}

impl TuningService {
    /// The service over `tracker`; stream producers are spawned on `tasks`.
    pub(crate) fn new(tracker: Arc<Tracker>, tasks: TaskTracker) -> Self {
        let submissions = RateLimit::new("job submissions", tracker.config.submit_rate, SUBMIT_BURST);
        TuningService { tracker, tasks, streams: Arc::new(Semaphore::new(MAX_STREAMS)), submissions }
    }

    /// A permit for one more open stream.
    fn stream_permit(&self) -> Result<OwnedSemaphorePermit, Error> {
        Arc::clone(&self.streams).try_acquire_owned().map_err(|_| {
            Error::Exhausted(format!("{MAX_STREAMS} watch and export streams are open; close some and retry"))
        })
    }
}

#[tonic::async_trait]
impl Tuning for TuningService {
    async fn submit_job(
        &self,
        request: Request<pb::SubmitJobRequest>,
    ) -> Result<Response<pb::SubmitJobResponse>, Status> {
        let caller = Caller::of(&request);
        // Bad input is named before anything else, the rate included.
        let job = convert::job_request(request.into_inner())?;
        crate::jobs::check_job(&job)?;
        self.submissions.admit(caller.token, Instant::now())?;
        let (id, device_class) = self.tracker.submit(job, &caller).await?;
        Ok(Response::new(pb::SubmitJobResponse { job_id: id as u64, device_class }))
    }

    async fn get_job(&self, request: Request<pb::JobRef>) -> Result<Response<pb::Job>, Status> {
        let id = id("job_id", request.into_inner().job_id)?;
        Ok(Response::new(convert::job(self.tracker.job(id).await?)))
    }

    type WatchJobStream = ReceiverStream<Result<pb::Job, Status>>;

    async fn watch_job(&self, request: Request<pb::JobRef>) -> Result<Response<Self::WatchJobStream>, Status> {
        let id = id("job_id", request.into_inner().job_id)?;
        let permit = self.stream_permit()?;
        // Subscribed before the first snapshot is read, so no change falls between the two.
        let events = self.tracker.events.watch_jobs();
        let first = self.tracker.job(id).await?;
        let (tx, rx) = mpsc::channel(WATCH_BUFFER);
        let tracker = Arc::clone(&self.tracker);
        self.tasks.spawn(async move {
            watch(tracker, id, first, events, tx).await;
            drop(permit);
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn cancel_job(&self, request: Request<pb::JobRef>) -> Result<Response<pb::Job>, Status> {
        let caller = Caller::of(&request);
        let id = id("job_id", request.into_inner().job_id)?;
        Ok(Response::new(convert::job(self.tracker.cancel(id, &caller).await?)))
    }

    async fn list_jobs(&self, request: Request<pb::ListJobsRequest>) -> Result<Response<pb::ListJobsResponse>, Status> {
        let req = request.into_inner();
        let states = convert::job_states(&req.states)?;
        let limit = if req.limit == 0 { DEFAULT_LIST_LIMIT } else { req.limit };
        let jobs = self.tracker.jobs(&states, limit).await?;
        Ok(Response::new(pb::ListJobsResponse { jobs: jobs.into_iter().map(convert::job).collect() }))
    }

    async fn query_best(
        &self,
        request: Request<pb::QueryBestRequest>,
    ) -> Result<Response<pb::QueryBestResponse>, Status> {
        let req = request.into_inner();
        let workload = req.workload.as_ref().ok_or_else(|| Error::invalid("workload", "must be set"))?;
        let workload = Workload::try_from(workload).map_err(|e| Error::from(e.within("workload")))?;
        // No template: the best of every template that implements the operation, each at the
        // version this tracker was built with.
        let templates: Vec<(&str, u32)> = if req.template.is_empty() {
            registry::all().into_iter().filter(|t| t.op() == workload.op()).map(|t| (t.name(), t.version())).collect()
        } else {
            let t = by_name(&req.template).map_err(|e| convert::template_error(&e))?;
            vec![(t.name(), if req.template_version == 0 { t.version() } else { req.template_version })]
        };
        let class = Some(req.device_class.as_str()).filter(|c| !c.is_empty());
        let regime = Regime::parse(&req.regime).map_err(|e| Error::invalid("regime", e))?;
        let best = self.tracker.best(&workload, &templates, class, regime, req.nearest).await?;
        let mut devices = Vec::with_capacity(best.len());
        for r in &best {
            let target = match self.tracker.class_target(&r.device_class).await? {
                None if r.device_class == "sim" => Some(tensortune_kernels::Target::sim()),
                known => known,
            };
            let target = target.ok_or_else(|| {
                Error::Internal(format!(
                    "device class {:?} of record {} is missing from the store",
                    r.device_class, r.id
                ))
            })?;
            devices.push(tensortune_proto::convert::device_from_target(&target));
        }
        Ok(Response::new(pb::QueryBestResponse { best: best.into_iter().map(convert::record).collect(), devices }))
    }

    async fn list_workers(
        &self,
        _request: Request<pb::ListWorkersRequest>,
    ) -> Result<Response<pb::ListWorkersResponse>, Status> {
        let workers = self.tracker.workers().await?;
        Ok(Response::new(pb::ListWorkersResponse {
            workers: workers.into_iter().map(|(w, drift)| convert::worker(w, drift)).collect(),
        }))
    }

    type ExportRecordsStream = ReceiverStream<Result<pb::Record, Status>>;

    async fn export_records(
        &self,
        request: Request<pb::ExportRecordsRequest>,
    ) -> Result<Response<Self::ExportRecordsStream>, Status> {
        let req = request.into_inner();
        let filter = RecordFilter {
            workload_key: Some(req.workload_key).filter(|k| !k.is_empty()),
            device_class: Some(req.device_class).filter(|c| !c.is_empty()),
            job_id: if req.job_id == 0 { None } else { Some(id("job_id", req.job_id)?) },
            ok_only: req.ok_only,
        };
        // A job that does not exist is an error, not an empty export.
        if let Some(job) = filter.job_id {
            self.tracker.require_job(job).await?;
        }
        let permit = self.stream_permit()?;
        let (tx, rx) = mpsc::channel(EXPORT_PAGE as usize);
        let tracker = Arc::clone(&self.tracker);
        self.tasks.spawn(async move {
            export(tracker, filter, tx).await;
            drop(permit);
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn quarantine_worker(
        &self,
        request: Request<pb::QuarantineWorkerRequest>,
    ) -> Result<Response<pb::QuarantineWorkerResponse>, Status> {
        let caller = Caller::of(&request);
        let req = request.into_inner();
        let worker = id("worker_id", req.worker_id)?;
        let reason = req.reason.trim();
        if reason.is_empty() || reason.len() > MAX_REASON {
            return Err(Error::invalid("reason", format!("must say why in 1..={MAX_REASON} bytes")).into());
        }
        let records = self.tracker.quarantine(worker, reason, &caller).await?;
        Ok(Response::new(pb::QuarantineWorkerResponse { records }))
    }

    async fn import_records(
        &self,
        request: Request<pb::ImportRecordsRequest>,
    ) -> Result<Response<pb::ImportRecordsResponse>, Status> {
        let caller = Caller::of(&request);
        let req = request.into_inner();
        let pack = req.pack.trim();
        if pack.is_empty() || pack.len() > MAX_PACK_NAME {
            return Err(Error::invalid("pack", format!("must name the pack in 1..={MAX_PACK_NAME} bytes")).into());
        }
        if req.lines.len() > MAX_IMPORT_BYTES {
            return Err(Error::invalid(
                "lines",
                format!("{} bytes in one call; send at most {MAX_IMPORT_BYTES} per call", req.lines.len()),
            )
            .into());
        }
        let imported = self.tracker.import_pack(pack, &req.lines, &caller).await?;
        Ok(Response::new(pb::ImportRecordsResponse {
            added: imported.added,
            skipped: imported.skipped,
            unknown_template: imported.unknown_template,
        }))
    }
}

/// Sends the job now and after every change until it ends, the client goes away or the tracker
/// shuts down.
async fn watch(
    tracker: Arc<Tracker>,
    id: JobId,
    first: JobView,
    mut events: broadcast::Receiver<JobId>,
    tx: mpsc::Sender<Result<pb::Job, Status>>,
) {
    let mut view = first;
    let mut last: Option<pb::Job> = None;
    loop {
        let ended = view.job.state.is_terminal();
        let job = convert::job(view);
        // A change notice can come for a write that left the snapshot as it was.
        if last.as_ref() != Some(&job) {
            if tx.send(Ok(job.clone())).await.is_err() {
                return;
            }
            last = Some(job);
        }
        if ended {
            return;
        }
        loop {
            tokio::select! {
                () = tx.closed() => return,
                () = tracker.shutdown.cancelled() => return,
                event = events.recv() => match event {
                    Ok(changed) if changed == id => break,
                    Ok(_) => {}
                    // Missed notices may have been about this job: look.
                    Err(RecvError::Lagged(_)) => break,
                    Err(RecvError::Closed) => return,
                },
            }
        }
        // Changes that piled up meanwhile are all covered by the snapshot about to be read.
        while !matches!(events.try_recv(), Err(TryRecvError::Empty | TryRecvError::Closed)) {}
        view = match tracker.job(id).await {
            Ok(view) => view,
            Err(e) => {
                let _ = tx.send(Err(e.into())).await;
                return;
            }
        };
    }
}

/// Streams every record matching `filter`, oldest first, a page at a time.
async fn export(tracker: Arc<Tracker>, filter: RecordFilter, tx: mpsc::Sender<Result<pb::Record, Status>>) {
    let mut after = 0;
    loop {
        let page = match tracker.records(&filter, after, EXPORT_PAGE).await {
            Ok(page) if page.is_empty() => return,
            Ok(page) => page,
            Err(e) => {
                let _ = tx.send(Err(e.into())).await;
                return;
            }
        };
        for record in page {
            after = record.id;
            tokio::select! {
                () = tracker.shutdown.cancelled() => return,
                sent = tx.send(Ok(convert::record(record))) => if sent.is_err() { return },
            }
        }
    }
}
