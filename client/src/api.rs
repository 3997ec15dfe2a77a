//! The client as a library: what the `tensortune` command does, for programs that drive a tracker
//! themselves (a training script that tunes its layers' shapes before it starts, a CI job that
//! refreshes a kernel bundle).
//!
//! ```no_run
//! use tensortune::api::{Client, JobSpec};
//! use tensortune_kernels::{DType, Layout, Matmul, Types, Workload};
//!
//! # async fn run() -> anyhow::Result<()> {
//! // The token comes from $TENSORTUNE_TOKEN_FILE or $TENSORTUNE_TOKEN when the tracker wants one.
//! let mut client = Client::connect("http://tracker.example:50051").await?;
//! let shape = Matmul::new(4096, 4096, 4096, Layout::Nn, Types::default_for(DType::F16)?)?;
//! let job = client.submit(JobSpec::new(vec![Workload::Matmul(shape)]).trials(300)).await?;
//! let done = client.wait(job).await?;
//! println!("job {} ended {:?}", done.id, done.state());
//! for record in client.best(&Workload::Matmul(shape), None).await? {
//!     println!("{}: {:.1} us with {} {}", record.device_class, record.measurement.unwrap().median_us,
//!              record.template, record.config);
//! }
//! # Ok(())
//! # }
//! ```
//!
//! Every call answers the tracker's refusal as an error naming the field (for a bad submission) or
//! what to do (a missing token); [`Client::wait`] rides out a tracker restart like the CLI does.
//! [`Client::tuning`] gives the generated gRPC client for anything else the proto offers.

use tensortune_kernels::Workload;
use tensortune_proto::access::{Access, Authed};
use tensortune_proto::pb;
use tensortune_proto::pb::tuning_client::TuningClient;

use crate::commands::{self, DEFAULT_TUNER, Progress, status_error};
use crate::session::Session;

/// A tuning job to submit: its workloads and how to search them. Unset fields take the tracker's
/// defaults (documented on `SubmitJobRequest` in proto/tensortune.proto).
#[derive(Clone, Debug)]
pub struct JobSpec {
    request: pb::SubmitJobRequest,
}

impl JobSpec {
    /// A job over `workloads` with the CLI's defaults: the model tuner, every template that takes
    /// each workload, 100 trials per workload.
    pub fn new(workloads: Vec<Workload>) -> JobSpec {
        JobSpec {
            request: pb::SubmitJobRequest {
                workloads: workloads.iter().map(pb::Workload::from).collect(),
                tuner: DEFAULT_TUNER.to_owned(),
                trials: 100,
                label: "api".to_owned(),
                ..Default::default()
            },
        }
    }

    /// Configs measured per workload.
    pub fn trials(mut self, trials: u32) -> JobSpec {
        self.request.trials = trials;
        self
    }

    /// The search: "model", "random" or "grid".
    pub fn tuner(mut self, tuner: &str) -> JobSpec {
        tuner.clone_into(&mut self.request.tuner);
        self
    }

    /// One template's space only (default: the union of every template that takes the workload).
    pub fn template(mut self, template: &str) -> JobSpec {
        template.clone_into(&mut self.request.template);
        self
    }

    /// The device class to tune for (default: the only class among the registered workers).
    pub fn device_class(mut self, class: &str) -> JobSpec {
        class.clone_into(&mut self.request.device_class);
        self
    }

    /// The tuner's seed (default: the tracker picks one and records it).
    pub fn seed(mut self, seed: u64) -> JobSpec {
        self.request.seed = seed;
        self
    }

    /// Finalists re-measured before a winner is named (0: none; default 3).
    pub fn finalists(mut self, finalists: u32) -> JobSpec {
        self.request.finalists = Some(finalists);
        self
    }

    /// A label shown in listings.
    pub fn label(mut self, label: &str) -> JobSpec {
        label.clone_into(&mut self.request.label);
        self
    }

    /// The request as it goes on the wire, for fields this builder does not name.
    pub fn request_mut(&mut self) -> &mut pb::SubmitJobRequest {
        &mut self.request
    }
}

/// A connection to a tracker.
pub struct Client {
    session: Session,
}

impl Client {
    /// Connects to the tracker at `url` (`http://` or `https://`), with a token from
    /// `$TENSORTUNE_TOKEN_FILE` or `$TENSORTUNE_TOKEN` when one is set.
    pub async fn connect(url: &str) -> anyhow::Result<Client> {
        let access = Access::load(None, None, None, None)?;
        Client::connect_with(url, &access).await
    }

    /// Connects with explicit token and TLS settings.
    pub async fn connect_with(url: &str, access: &Access) -> anyhow::Result<Client> {
        Ok(Client { session: Session::remote_with(url, access).await? })
    }

    /// Submits a job; returns its id.
    pub async fn submit(&mut self, job: JobSpec) -> anyhow::Result<u64> {
        let answer = self.session.client.submit_job(job.request).await.map_err(status_error)?;
        Ok(answer.into_inner().job_id)
    }

    /// The job as it stands.
    pub async fn job(&mut self, job_id: u64) -> anyhow::Result<pb::Job> {
        let answer = self.session.client.get_job(pb::JobRef { job_id }).await.map_err(status_error)?;
        Ok(answer.into_inner())
    }

    /// Follows the job until it ends (done, cancelled or failed) and returns it as it ended. A
    /// tracker that restarts meanwhile is waited for (up to two minutes) and followed again.
    pub async fn wait(&mut self, job_id: u64) -> anyhow::Result<pb::Job> {
        commands::watch_with(&mut self.session, job_id, Progress::Quiet).await
    }

    /// Cancels a job (a client token cancels only its own jobs).
    pub async fn cancel(&mut self, job_id: u64) -> anyhow::Result<pb::Job> {
        let answer = self.session.client.cancel_job(pb::JobRef { job_id }).await.map_err(status_error)?;
        Ok(answer.into_inner())
    }

    /// The best trusted record of `workload` per device class (only `device_class` when given),
    /// fastest first; empty when nothing was measured for it.
    pub async fn best(&mut self, workload: &Workload, device_class: Option<&str>) -> anyhow::Result<Vec<pb::Record>> {
        let request = pb::QueryBestRequest {
            workload: Some(pb::Workload::from(workload)),
            device_class: device_class.unwrap_or_default().to_owned(),
            ..Default::default()
        };
        let answer = self.session.client.query_best(request).await.map_err(status_error)?;
        Ok(answer.into_inner().best)
    }

    /// The generated gRPC client, for the rest of the Tuning service.
    pub fn tuning(&mut self) -> &mut TuningClient<Authed> {
        &mut self.session.client
    }
}
