//! The `Dispatch` service that worker daemons call.

use std::sync::Arc;
use std::time::Duration;

use tensortune_proto::pb;
use tensortune_proto::pb::dispatch_server::Dispatch;
use tonic::{Request, Response, Status};

use super::convert::{self, id, in_range};
use crate::auth::Caller;
use crate::changes::ReportItem;
use crate::error::Error;
use crate::tracker::{Tracker, millis};

/// Most tasks one `LeaseTasks` call may ask for.
const MAX_LEASE: u32 = 1024;
/// Most reports one `ReportResults` call may carry (as many as one lease may hand out).
const MAX_REPORTS: usize = 1024;
/// Longest a `LeaseTasks` call may wait for work, ms.
const MAX_WAIT_MS: u32 = 30_000;

/// Serves `Dispatch` from a tracker.
pub(crate) struct DispatchService {
    tracker: Arc<Tracker>,
}

impl DispatchService {
    /// The service over `tracker`.
    pub(crate) fn new(tracker: Arc<Tracker>) -> Self {
        DispatchService { tracker }
    }
}

#[tonic::async_trait]
impl Dispatch for DispatchService {
    async fn register(&self, request: Request<pb::RegisterRequest>) -> Result<Response<pb::RegisterResponse>, Status> {
        let caller = Caller::of(&request);
        let registration = convert::registration(request.into_inner())?;
        let worker = self.tracker.register(&registration, &caller).await.map_err(|e| self.tracker.noting_outage(e))?;
        let config = &self.tracker.config;
        Ok(Response::new(pb::RegisterResponse {
            worker_id: worker as u64,
            lease_ms: u32::try_from(millis(config.lease)).unwrap_or(u32::MAX),
            heartbeat_ms: u32::try_from(millis(config.heartbeat)).unwrap_or(u32::MAX),
        }))
    }

    async fn heartbeat(
        &self,
        request: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::HeartbeatResponse>, Status> {
        let caller = Caller::of(&request);
        let req = request.into_inner();
        let worker = id("worker_id", req.worker_id)?;
        let tasks = req
            .task_ids
            .iter()
            .enumerate()
            .map(|(i, t)| id(&format!("task_ids[{i}]"), *t))
            .collect::<Result<Vec<_>, _>>()?;
        let reference = convert::reference_us(req.reference_us)?;
        let drop = self
            .tracker
            .heartbeat(worker, &tasks, reference, &caller)
            .await
            .map_err(|e| self.tracker.noting_outage(e))?;
        Ok(Response::new(pb::HeartbeatResponse { drop_task_ids: drop.into_iter().map(|t| t as u64).collect() }))
    }

    async fn lease_tasks(
        &self,
        request: Request<pb::LeaseTasksRequest>,
    ) -> Result<Response<pb::LeaseTasksResponse>, Status> {
        let caller = Caller::of(&request);
        let req = request.into_inner();
        let worker = id("worker_id", req.worker_id)?;
        let max = in_range("max_tasks", req.max_tasks, 1, MAX_LEASE)?;
        let wait = Duration::from_millis(u64::from(in_range("wait_ms", req.wait_ms, 0, MAX_WAIT_MS)?));
        let tasks = self.tracker.lease(worker, max, wait, &caller).await.map_err(|e| self.tracker.noting_outage(e))?;
        Ok(Response::new(pb::LeaseTasksResponse { tasks: tasks.into_iter().map(convert::task).collect() }))
    }

    async fn report_result(
        &self,
        request: Request<pb::ReportResultRequest>,
    ) -> Result<Response<pb::ReportResultResponse>, Status> {
        let caller = Caller::of(&request);
        let req = request.into_inner();
        let worker = id("worker_id", req.worker_id)?;
        let task = id("task_id", req.task_id)?;
        let serial = in_range("lease_serial", req.lease_serial, 1, u32::MAX)?;
        let reported = convert::reported(req.measurement, req.finalist_measurements)?;
        let report = self
            .tracker
            .report(worker, task, serial, reported, &caller)
            .await
            .map_err(|e| self.tracker.noting_outage(e))?;
        Ok(Response::new(pb::ReportResultResponse {
            stored: report.stored,
            record_id: report.record_id.unwrap_or_default() as u64,
        }))
    }

    async fn report_results(
        &self,
        request: Request<pb::ReportResultsRequest>,
    ) -> Result<Response<pb::ReportResultsResponse>, Status> {
        let caller = Caller::of(&request);
        let req = request.into_inner();
        let worker = id("worker_id", req.worker_id)?;
        if req.reports.is_empty() || req.reports.len() > MAX_REPORTS {
            return Err(Status::invalid_argument(format!(
                "invalid reports: holds {}; allowed 1 ..= {MAX_REPORTS} reports per call",
                req.reports.len()
            )));
        }
        let mut items = Vec::with_capacity(req.reports.len());
        for (i, r) in req.reports.into_iter().enumerate() {
            if r.worker_id != 0 && r.worker_id != req.worker_id {
                return Err(Status::invalid_argument(format!(
                    "invalid reports[{i}].worker_id: {} differs from the batch's worker_id {}; give 0 or the same",
                    r.worker_id, req.worker_id
                )));
            }
            let task = id(&format!("reports[{i}].task_id"), r.task_id)?;
            // A malformed report is refused in its own outcome; the rest of the batch goes on.
            let reported = in_range("lease_serial", r.lease_serial, 1, u32::MAX)
                .and_then(|serial| {
                    convert::reported(r.measurement, r.finalist_measurements).map(|reported| (serial, reported))
                })
                .map_err(|e| match e {
                    Error::Invalid { field, message } => {
                        Error::Invalid { field: format!("reports[{i}].{field}"), message }
                    }
                    e => e,
                });
            items.push(match reported {
                Ok((serial, reported)) => ReportItem { task, lease_serial: serial, reported: Ok(reported) },
                Err(e) => ReportItem { task, lease_serial: 0, reported: Err(e) },
            });
        }
        let tasks: Vec<u64> = items.iter().map(|i| i.task as u64).collect();
        let outcomes =
            self.tracker.report_batch(worker, items, &caller).await.map_err(|e| self.tracker.noting_outage(e))?;
        let outcomes = tasks
            .into_iter()
            .zip(outcomes)
            .map(|(task_id, outcome)| match outcome {
                Ok(r) => pb::ReportOutcome {
                    task_id,
                    stored: r.stored,
                    record_id: r.record_id.unwrap_or_default() as u64,
                    ..Default::default()
                },
                Err(e) => {
                    let status = Status::from(e);
                    pb::ReportOutcome {
                        task_id,
                        code: status.code() as i32,
                        message: status.message().to_owned(),
                        ..Default::default()
                    }
                }
            })
            .collect();
        Ok(Response::new(pb::ReportResultsResponse { outcomes }))
    }

    async fn leave(&self, request: Request<pb::LeaveRequest>) -> Result<Response<pb::LeaveResponse>, Status> {
        let caller = Caller::of(&request);
        let worker = id("worker_id", request.into_inner().worker_id)?;
        let released = self.tracker.leave(worker, &caller).await.map_err(|e| self.tracker.noting_outage(e))?;
        Ok(Response::new(pb::LeaveResponse { released: u32::try_from(released).unwrap_or(u32::MAX) }))
    }
}
