//! The measuring child's side: open the device, then answer requests on stdin/stdout, one at a
//! time, until `Shutdown` or end of input. Everything here is synchronous: the child has one
//! thread, and the GPU work it drives is blocking anyway.

use std::io::{BufReader, BufWriter};

use anyhow::Context as _;

use crate::config::DeviceSpec;
use crate::frame::{self, FrameError};
use crate::protocol::{Executor, Request, Response};
use crate::sim::SimExecutor;

/// Runs the measuring child for `device` on this process's stdin/stdout.
///
/// Call it before anything else writes to stdout (frames travel there); it logs to stderr, which
/// the daemon forwards into its own log. When the device cannot be opened it answers the first
/// request with `Response::Fatal` and returns the error, so the process exits non-zero.
pub fn child_main(device: DeviceSpec) -> anyhow::Result<()> {
    init_logging();
    let mut input = BufReader::new(std::io::stdin().lock());
    let mut output = BufWriter::new(std::io::stdout().lock());

    let opened: anyhow::Result<Box<dyn Executor>> = match &device {
        DeviceSpec::Sim => SimExecutor::from_env().map(|e| Box::new(e) as Box<dyn Executor>),
        DeviceSpec::Cuda(n) => crate::cuda::CudaExecutor::new(*n).map(|e| Box::new(e) as Box<dyn Executor>),
        DeviceSpec::CudaSet(_) | DeviceSpec::CudaAll => {
            Err(anyhow::anyhow!("a measuring child drives one device; start one per GPU (e.g. cuda:0)"))
        }
    };
    let mut executor = match opened {
        Ok(e) => e,
        Err(e) => {
            // The daemon names the device (`opening cuda:N: ...`).
            let text = format!("{e:#}");
            // Read the daemon's Hello before answering: if we answered and exited first, its write
            // could fail with a broken pipe and it would never see why.
            let _ = frame::read_sync::<Request>(&mut input);
            let _ = frame::write_sync(&mut output, &Response::Fatal(text.clone()));
            anyhow::bail!(text);
        }
    };
    tracing::debug!(gpu = %device, "measuring child ready");

    loop {
        let request = match frame::read_sync::<Request>(&mut input) {
            Ok(r) => r,
            Err(FrameError::Closed) => return Ok(()),
            Err(e) => return Err(e).context("reading a request from the daemon"),
        };
        let response = match request {
            Request::Hello => Response::Hello(executor.facts()),
            Request::Measure(m) => {
                let outcome = executor.measure(&m);
                Response::Measured { outcome, support_loaded: executor.support_loaded(), poisoned: executor.poisoned() }
            }
            Request::Shutdown => {
                // The driver frees a process's device memory, modules, vendor handles and context
                // when it exits: freeing each of them first (100-odd modules and the vendor
                // libraries' handles after a tune) only delays the exit the daemon waits for.
                std::mem::forget(executor);
                return Ok(());
            }
        };
        frame::write_sync(&mut output, &response).context("answering the daemon")?;
    }
}

/// Plain lines on stderr (the daemon adds its own time stamps and fields). A binary that already
/// installed a subscriber keeps it.
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .without_time()
        .try_init();
}
