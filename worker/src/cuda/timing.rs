//! GPU-side timing: a CUDA graph holding a batch of launches, replayed between CUDA events.
//!
//! A host loop of launches measures the host, not the kernel (on an H200 an empty kernel reads
//! 4.7 us per launch from a host loop and 0.5 us inside a graph), so every sample is the replay of
//! one graph whose batch grows until a sample lasts at least `min_sample_ms`. Our kernels and the
//! vendor's are timed by this one function.

use std::sync::Arc;

use cudarc::driver::sys::{CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaContext, CudaGraph, CudaStream};

use super::device::{Context, CudaFailure};

/// Launches in the graph that estimates one launch's time.
const PROBE_BATCH: u32 = 8;
/// The most launches one graph may hold.
const MAX_BATCH: u32 = 20_000;

/// Samples of one timed workload.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Timing {
    /// Per-launch time of each sample, microseconds.
    pub(crate) samples_us: Vec<f64>,
    /// Median of the samples.
    pub(crate) median_us: f64,
    /// (max - min) / median.
    pub(crate) spread: f64,
    /// Launches per sample.
    pub(crate) batch: u32,
}

/// Captures `batch` calls of `enqueue` into a graph. The stream leaves capture mode whatever
/// happens, so a failing launch cannot leave it stuck.
fn capture<F>(stream: &Arc<CudaStream>, batch: u32, enqueue: &mut F) -> Result<CudaGraph, CudaFailure>
where
    F: FnMut(&Arc<CudaStream>) -> Result<(), CudaFailure>,
{
    stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .when(|| "when starting a graph capture".into())?;
    let mut outcome = Ok(());
    for _ in 0..batch {
        outcome = enqueue(stream);
        if outcome.is_err() {
            break;
        }
    }
    let graph = stream.end_capture(CUgraphInstantiate_flags(0)).when(|| "when instantiating the graph".into());
    outcome?;
    let graph = graph?.ok_or_else(|| CudaFailure {
        code: cudarc::driver::sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
        context: "when capturing: the graph came back empty".into(),
    })?;
    graph.upload().when(|| "when uploading the graph".into())?;
    Ok(graph)
}

/// Replays `graph` once between two events and returns the milliseconds elapsed.
fn replay_ms(ctx: &Arc<CudaContext>, stream: &Arc<CudaStream>, graph: &CudaGraph) -> Result<f64, CudaFailure> {
    let start = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).when(|| "when creating an event".into())?;
    let end = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).when(|| "when creating an event".into())?;
    start.record(stream).when(|| "when recording an event".into())?;
    graph.launch().when(|| "when replaying the graph".into())?;
    end.record(stream).when(|| "when recording an event".into())?;
    end.synchronize().when(|| "when running the graph".into())?;
    Ok(start.elapsed_ms(&end).when(|| "when reading an event".into())? as f64)
}

/// Times `enqueue` (which must enqueue exactly one launch, or one vendor call, on the stream it is
/// given): warm-up, a probe graph to estimate one launch, then `samples` replays of a graph of
/// `batch` launches where `batch * launch >= min_sample_ms`.
pub(crate) fn time<F>(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    samples: u32,
    min_sample_ms: f64,
    mut enqueue: F,
) -> Result<Timing, CudaFailure>
where
    F: FnMut(&Arc<CudaStream>) -> Result<(), CudaFailure>,
{
    // Warm-up outside any graph: module load, instruction cache, vendor heuristics.
    enqueue(stream)?;
    stream.synchronize().when(|| "when running the warm-up launch".into())?;

    let probe = capture(stream, PROBE_BATCH, &mut enqueue)?;
    replay_ms(ctx, stream, &probe)?;
    let per_launch_ms = (replay_ms(ctx, stream, &probe)? / PROBE_BATCH as f64).max(1e-6);
    drop(probe);
    let batch = ((min_sample_ms / per_launch_ms).ceil() as u32).clamp(1, MAX_BATCH);

    let graph = capture(stream, batch, &mut enqueue)?;
    replay_ms(ctx, stream, &graph)?;
    let mut events = Vec::with_capacity(samples as usize + 1);
    for _ in 0..=samples {
        events.push(ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).when(|| "when creating an event".into())?);
    }
    // Back-to-back replays, one event between consecutive samples: the GPU never idles.
    events[0].record(stream).when(|| "when recording an event".into())?;
    for i in 0..samples as usize {
        graph.launch().when(|| "when replaying the graph".into())?;
        events[i + 1].record(stream).when(|| "when recording an event".into())?;
    }
    events[samples as usize].synchronize().when(|| "when running the timed replays".into())?;
    let mut samples_us = Vec::with_capacity(samples as usize);
    for pair in events.windows(2) {
        let ms = pair[0].elapsed_ms(&pair[1]).when(|| "when reading an event".into())? as f64;
        samples_us.push(ms * 1e3 / batch as f64);
    }
    Ok(summarise(samples_us, batch))
}

/// Median and spread of a set of samples.
pub(crate) fn summarise(samples_us: Vec<f64>, batch: u32) -> Timing {
    let mut sorted = samples_us.clone();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    let median_us = if n == 0 {
        0.0
    } else if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    };
    let spread = if n > 0 && median_us > 0.0 { (sorted[n - 1] - sorted[0]) / median_us } else { 0.0 };
    Timing { samples_us, median_us, spread, batch }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_spread() {
        let t = summarise(vec![3.0, 1.0, 2.0], 7);
        assert_eq!((t.median_us, t.batch), (2.0, 7));
        assert!((t.spread - 1.0).abs() < 1e-12);
        assert_eq!(summarise(vec![4.0, 1.0, 2.0, 3.0], 1).median_us, 2.5);
        assert_eq!(summarise(vec![], 1).median_us, 0.0);
    }
}
