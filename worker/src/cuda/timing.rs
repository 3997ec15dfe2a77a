//! GPU-side timing: CUDA graphs replayed between CUDA events, in one of two modes.
//!
//! A host loop of launches measures the host, not the kernel (on an H200 an empty kernel reads
//! 4.7 us per launch from a host loop and 0.5 us inside a graph), so launches are always replayed
//! from a graph. Our kernels and the vendor's are timed by this one function, in the same mode.
//!
//! - [`Mode::Batched`] (the default): every sample replays a graph whose batch of launches grows
//!   until a sample lasts at least `min_sample_ms` (a graph of up to 5 ms, replayed back to back
//!   as often as a longer sample needs), or, with a `launches` cap, until it holds that many
//!   launches if that comes first (but at least [`SHORTEST_SAMPLE_MS`]); samples run back to back,
//!   so the inputs stay in L2 from one launch to the next (the steady state of a kernel called in
//!   a loop).
//! - [`Mode::ColdL2`] (a job's `flush_l2`): every sample is one launch, the replay of a graph of
//!   batch 1 between two events. Before each sample, outside the events, a memset overwrites a
//!   scratch buffer of twice the L2 size ([`flush_bytes`]), which evicts the kernel's inputs and
//!   output: each sample starts from a cold L2, as a kernel does after unrelated work. Such a
//!   sample includes the graph launch's own GPU-side cost (about half a microsecond) and the
//!   write-back of the dirty scratch lines the kernel evicts, the price every cold-cache benchmark
//!   pays; the vendor baseline pays it too. The scratch buffer is allocated once per child.
//!
//! Around [`Mode::Batched`]'s samples, with a [`Probe`] (NVML) and as [`Extra`] asks:
//! - a settle phase before them (the sustained regime): the same graph replayed back to back,
//!   NVML polled, until the clock and power are steady (`energy::settled_at`) or the cap; or, to
//!   hold a kernel for a fixed time (`selftest --hold`), until that time;
//! - an energy phase after them: the graph replayed until NVML's energy counter changed twice at
//!   least `energy_ms` apart (`energy::window`), or [`energy::MAX_WINDOW_MS`]; the energy per
//!   launch is that power times the time per launch over the same span (`energy::span_launch_us`,
//!   from an event after every chunk of replays). Cold-L2 samples read no energy: their memsets
//!   between launches would be counted as the kernel's. After a settle phase the reported time
//!   is that per-launch time over the window, which spans whole hunts of the power cap's clock;
//!   the samples (milliseconds) see one phase of a hunt. In the burst regime the GPU then idles
//!   for [`BURST_COOL_MS`], so that the next measurement starts cool, as a burst means; and it
//!   idles as long before the first timing after a workload's float64 reference (a naive GEMM
//!   over the whole problem), which has no energy phase to be followed by.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::sys::{CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaContext, CudaEvent, CudaGraph, CudaStream};

use super::device::{Context, CudaFailure, DevBuf};
use crate::energy::{self, Mark, Poll, Power, StatePoint, SteadyRule};

/// Launches in the graph that estimates one launch's time.
const PROBE_BATCH: u32 = 8;
/// The most launches one graph may hold.
const MAX_BATCH: u32 = 20_000;
/// The most GPU time one graph holds, milliseconds: longer samples replay it several times.
const GRAPH_MS: f64 = 5.0;
/// The shortest sample a `launches` cap leaves: a trial's (`plan`'s `MIN_SAMPLE_MS`), so that
/// a sample is always far longer than the replay's own overhead.
const SHORTEST_SAMPLE_MS: f64 = 1.0;
/// Scratch used to flush an L2 whose size the driver does not report: larger than any L2 so far
/// (H100 50 MiB, B200 126 MiB).
const UNKNOWN_L2_FLUSH_BYTES: u64 = 256 << 20;

/// How samples are taken.
#[derive(Clone, Copy)]
pub(crate) enum Mode<'a> {
    /// Back-to-back replays of a graph of as many launches as make a sample last
    /// `min_sample_ms` (warm L2).
    Batched {
        /// Minimum GPU time of one sample, milliseconds.
        min_sample_ms: f64,
        /// When nonzero, a sample ends sooner once it holds this many launches (and lasts at
        /// least [`SHORTEST_SAMPLE_MS`]).
        launches: u32,
    },
    /// One launch per sample, after overwriting `scratch` (cold L2).
    ColdL2 {
        /// At least [`flush_bytes`] of the device's L2.
        scratch: &'a DevBuf,
    },
}

/// Bytes to overwrite so that nothing a kernel touched before survives in an L2 of `l2_bytes`:
/// twice its size (the L2 is not a perfect LRU; one pass may leave lines behind).
pub(crate) fn flush_bytes(l2_bytes: u64) -> usize {
    match l2_bytes {
        0 => UNKNOWN_L2_FLUSH_BYTES as usize,
        n => (2 * n) as usize,
    }
}

/// How often a phase polls NVML, milliseconds.
const POLL_MS: u64 = 2;
/// The idle after a burst measurement's energy window, milliseconds, so that the next burst
/// measurement starts cool: the window runs at the power cap for a second or more, and without a
/// pause the next config's samples ran at the capped clock (2 of 6 burst records 4.4% and 8.2%
/// slower than cool-start samples, at 1371 and 1542 MHz; H200, 2026-11-28). Chosen from that
/// run's clock trace (nvidia-smi every 200 ms): after a load at the cap ended, the SM clock was
/// back at its 1980 MHz maximum within 0.6 s.
const BURST_COOL_MS: u64 = 1000;
/// GPU time of one chunk of replays a phase queues ahead, milliseconds: the host never lets the
/// GPU idle, and looks at what it polled once a chunk.
const CHUNK_MS: f64 = 20.0;

/// What a phase polls while a kernel runs (NVML).
pub(crate) trait Probe {
    /// One reading now, stamped `t_ms`.
    fn poll(&self, t_ms: f64) -> Poll;
    /// Whether the clock is held down now by the power cap or a thermal limit, or still climbing
    /// back to its maximum after one (false when the probe cannot say).
    fn capped(&self) -> bool {
        false
    }
}

/// What happens around the timed samples besides timing (see the module's notes).
#[derive(Clone, Copy, Default)]
pub(crate) struct Extra<'a> {
    /// NVML, when loaded.
    pub(crate) probe: Option<&'a dyn Probe>,
    /// The energy window, milliseconds (0: no energy phase).
    pub(crate) energy_ms: f64,
    /// The sustained regime: settle by this rule before timing, waiting at most this long (ms).
    pub(crate) settle: Option<(SteadyRule, f64)>,
    /// Run the kernel this long before timing, whatever the rule says (ms; 0: not held).
    pub(crate) hold_ms: f64,
    /// The GPU ran something long since the last timing (a workload's float64 reference): a
    /// burst measurement that reads energy idles [`BURST_COOL_MS`] before its warm-up, so that
    /// its samples start cool too.
    pub(crate) cool_first: bool,
    /// Burst (a finalist's round): while the probe says the clock is held down (or still climbing
    /// back) as the timing starts, idle before the warm-up, at most [`BURST_COOL_MS`] (see
    /// `idle_while_capped`).
    pub(crate) start_uncapped: bool,
    /// The burst regime: the timing's time is its fastest sample ([`at_full_clock`]).
    pub(crate) burst: bool,
}

thread_local! {
    /// The power of the latest timing on this thread, for callers that see only its time (the
    /// vendor paths).
    static LAST_POWER: std::cell::Cell<Power> = const { std::cell::Cell::new(Power {
        energy_mj: None,
        power_w: None,
        mean_clock_mhz: None,
        temperature_c: None,
    }) };
}

/// The energy reading of the latest timing on this thread (unknown after one without).
pub(crate) fn last_power() -> Power {
    LAST_POWER.with(|p| p.get())
}

/// Samples of one timed workload.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Timing {
    /// Per-launch time of each sample, microseconds.
    pub(crate) samples_us: Vec<f64>,
    /// The timing's time: the median sample ([`summarise`]); the time over the energy window of a
    /// settled timing; the fastest sample of a burst one ([`Extra::burst`]).
    pub(crate) time_us: f64,
    /// (max - min) / the time.
    pub(crate) spread: f64,
    /// Launches per sample.
    pub(crate) batch: u32,
    /// Energy and state over the energy phase (unknown without one).
    pub(crate) power: Power,
    /// How long the settle phase ran, milliseconds (0 without one).
    pub(crate) settle_ms: f64,
    /// Whether the settle phase found the steady state (true without one).
    pub(crate) steady: bool,
    /// The settle phase's clock and power, a point per second (empty without one).
    pub(crate) trace: Vec<StatePoint>,
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
/// given): a warm-up launch, then `samples` samples taken as `mode` says.
pub(crate) fn time<F>(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    samples: u32,
    mode: Mode<'_>,
    extra: Extra<'_>,
    mut enqueue: F,
) -> Result<Timing, CudaFailure>
where
    F: FnMut(&Arc<CudaStream>) -> Result<(), CudaFailure>,
{
    if cools_first(&extra) {
        std::thread::sleep(Duration::from_millis(BURST_COOL_MS));
    } else {
        idle_while_capped(&extra, UNCAP_POLL_MS);
    }
    // Warm-up outside any graph: module load, instruction cache, vendor heuristics.
    enqueue(stream)?;
    stream.synchronize().when(|| "when running the warm-up launch".into())?;
    let timing = match mode {
        Mode::Batched { min_sample_ms, launches } => {
            batched(ctx, stream, samples, min_sample_ms, launches, extra, &mut enqueue)
        }
        Mode::ColdL2 { scratch } => cold(ctx, stream, samples, scratch, &mut enqueue),
    };
    LAST_POWER.with(|p| p.set(timing.as_ref().map(|t| t.power).unwrap_or_default()));
    let burst = extra.burst && extra.settle.is_none() && extra.hold_ms <= 0.0;
    timing.map(|t| if burst { at_full_clock(t) } else { t })
}

/// A burst timing's time: its fastest sample, not the median (the spread stays relative to it).
/// Burst means the kernel at the GPU's full clock, and a sample can only be slowed from there (by
/// the power cap, a thermal limit, another process), never sped past it, so the fastest sample is
/// the full-clock time. A median is that time only while every sample ran before the cap: a 1.4 ms
/// GEMM reaches an H200's 700 W cap within its own ten samples (one f16 8192^3 finalist round read
/// 1428-1436 us for eight samples, then 1522-1669), and the medians of that kernel's timings, each
/// started at 1980 MHz, read 1428-1641 us (2026-11-29). For a kernel that never meets the cap the
/// two differ by the samples' noise. A settled timing (sustained, or a hold) keeps its median or
/// its window's time: there the capped clock is the regime.
fn at_full_clock(mut t: Timing) -> Timing {
    if let Some(fastest) = t.samples_us.iter().copied().filter(|s| *s > 0.0).reduce(f64::min) {
        let slowest = t.samples_us.iter().copied().fold(fastest, f64::max);
        t.time_us = fastest;
        t.spread = (slowest - fastest) / fastest;
    }
    t
}

/// Whether a timing idles before its warm-up: a burst measurement (no settling, no hold) that
/// reads energy, right after the GPU ran something long. The float64 reference (a naive GEMM over
/// the whole problem) runs just before the first config's check; without the idle, that config's
/// samples (and the vendor's, timed in the same request) start on a GPU it has just loaded. Cool-
/// start samples of f16 4096x14336x4096 in fresh processes read 1078 and 1086 us with the idle,
/// 1091 and 1090 us without (H200, 2026-11-28): 0.3-1.1%. (Prompted by such samples reading 3.9%
/// slower than a job's record of the same config, which this does not account for.)
fn cools_first(extra: &Extra<'_>) -> bool {
    extra.cool_first && extra.settle.is_none() && extra.hold_ms <= 0.0 && extra.energy_ms > 0.0
}

/// How often a burst timing that asks to start uncapped polls the probe while it idles,
/// milliseconds.
const UNCAP_POLL_MS: u64 = 10;

/// A burst timing that asks to start uncapped (a finalist's, see `MeasureRequest::start_uncapped`)
/// idles while the probe says the power cap or a thermal limit holds the clock down (or the clock
/// has not climbed back yet), polling every `poll_ms`, for at most [`BURST_COOL_MS`] (the time the
/// SM clock took to return to its maximum after a load at the cap): a GPU at its full clock costs
/// one NVML poll, one that is not waits only until it is. Returns the milliseconds idled.
fn idle_while_capped(extra: &Extra<'_>, poll_ms: u64) -> u64 {
    let asked = extra.start_uncapped && extra.settle.is_none() && extra.hold_ms <= 0.0 && !cools_first(extra);
    let Some(probe) = extra.probe.filter(|_| asked) else { return 0 };
    let mut idled = 0;
    while idled < BURST_COOL_MS && probe.capped() {
        std::thread::sleep(Duration::from_millis(poll_ms));
        idled += poll_ms;
    }
    if idled > 0 {
        tracing::debug!(idled_ms = idled, "the clock was capped as a burst timing started; idled first");
    }
    idled
}

/// What a phase of back-to-back replays polled, and where it stood after each chunk.
struct Phase {
    polls: Vec<Poll>,
    marks: Vec<Mark>,
}

/// A captured graph of `batch` launches that one replay of runs for about `graph_ms`.
#[derive(Clone, Copy)]
struct Replayed<'a> {
    graph: &'a CudaGraph,
    batch: u32,
    graph_ms: f64,
}

/// Replays `replayed`'s graph back to back, one chunk of [`CHUNK_MS`] queued ahead of the one
/// running, polling `probe` every [`POLL_MS`], until `done` says so of the polls (looked at once
/// a chunk) or `cap_ms` passed.
fn run_polled(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    replayed: Replayed<'_>,
    probe: &dyn Probe,
    cap_ms: f64,
    done: impl Fn(&[Poll]) -> bool,
) -> Result<Phase, CudaFailure> {
    let Replayed { graph, batch, graph_ms } = replayed;
    let reps = ((CHUNK_MS / graph_ms.max(1e-6)).ceil() as u32).max(1);
    let start = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).when(|| "when creating an event".into())?;
    start.record(stream).when(|| "when recording an event".into())?;
    let t0 = Instant::now();
    let ms = |t0: Instant| t0.elapsed().as_secs_f64() * 1e3;
    // Each chunk's end event and the launches run by then.
    let mut queued: VecDeque<(CudaEvent, u64)> = VecDeque::new();
    let mut launches = 0u64;
    let mut chunk = |queued: &mut VecDeque<(CudaEvent, u64)>| -> Result<(), CudaFailure> {
        for _ in 0..reps {
            graph.launch().when(|| "when replaying the graph".into())?;
        }
        let end = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).when(|| "when creating an event".into())?;
        end.record(stream).when(|| "when recording an event".into())?;
        launches += u64::from(reps) * u64::from(batch);
        queued.push_back((end, launches));
        Ok(())
    };
    chunk(&mut queued)?;
    chunk(&mut queued)?;
    let mut polls = vec![probe.poll(0.0)];
    let mut marks = Vec::new();
    loop {
        let (oldest, ran) = queued.pop_front().expect("two chunks are queued");
        while !oldest.try_is_complete().when(|| "when running a phase's replays".into())? {
            std::thread::sleep(Duration::from_millis(POLL_MS));
            polls.push(probe.poll(ms(t0)));
        }
        let host_ms = ms(t0);
        let gpu_ms = f64::from(start.elapsed_ms(&oldest).when(|| "when reading an event".into())?);
        marks.push(Mark { host_ms, gpu_ms, launches: ran });
        polls.push(probe.poll(ms(t0)));
        if done(&polls) || ms(t0) >= cap_ms {
            break;
        }
        chunk(&mut queued)?;
    }
    if let Some((end, _)) = queued.pop_back() {
        end.synchronize().when(|| "when running a phase's replays".into())?;
    }
    Ok(Phase { polls, marks })
}

/// A probe graph estimates one launch, then `samples` samples, each `reps` back-to-back replays of
/// a graph of `batch` launches, so that `reps * batch * launch >= min_sample_ms`. The graph holds at
/// most [`GRAPH_MS`] of launches: a finalist's 50 ms samples of a 2 us kernel replay a graph of
/// 2500 launches 10 times instead of capturing 20000 launches on the host for every timing (the
/// conv suite's batch-1 layers spent 56-68 s in their finalist stage that way, 23-27 s with the
/// replays; H100, 2026-11-26). With a `launches` cap, the probe's time also shortens the samples
/// (see [`sample_ms`]). The reported `batch` is launches per sample.
fn batched<F>(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    samples: u32,
    min_sample_ms: f64,
    launches: u32,
    extra: Extra<'_>,
    enqueue: &mut F,
) -> Result<Timing, CudaFailure>
where
    F: FnMut(&Arc<CudaStream>) -> Result<(), CudaFailure>,
{
    let probe = capture(stream, PROBE_BATCH, enqueue)?;
    replay_ms(ctx, stream, &probe)?;
    let per_launch_ms = replay_ms(ctx, stream, &probe)? / PROBE_BATCH as f64;
    drop(probe);
    let (batch, reps) = sample_shape(per_launch_ms, sample_ms(per_launch_ms, min_sample_ms, launches));

    let graph = capture(stream, batch, enqueue)?;
    let graph_ms = replay_ms(ctx, stream, &graph)?;
    let replayed = Replayed { graph: &graph, batch, graph_ms };
    // The sustained regime: the kernel runs until the GPU is steady under it (without NVML there
    // is nothing to tell steady by: timed at once, and said to be unsteady). A hold runs it for
    // its time whatever the rule says.
    let hold = extra.hold_ms > 0.0;
    let (settle_ms, steady, trace) = match (extra.settle, extra.probe) {
        (Some((rule, cap_ms)), Some(probe)) => {
            let started = Instant::now();
            let cap_ms = if hold { extra.hold_ms } else { cap_ms };
            let phase = run_polled(ctx, stream, replayed, probe, cap_ms, |polls| {
                !hold && energy::settled_at(&energy::state_trace(polls), &rule).is_some()
            })?;
            let trace = energy::state_trace(&phase.polls);
            let steady = energy::settled_at(&trace, &rule).is_some();
            (started.elapsed().as_secs_f64() * 1e3, steady, energy::window_means(&trace, rule.window_ms))
        }
        (Some(_), None) => (0.0, false, Vec::new()),
        (None, _) => (0.0, true, Vec::new()),
    };
    let events = new_events(ctx, samples as usize + 1)?;
    // Back-to-back replays, one event between consecutive samples: the GPU never idles.
    events[0].record(stream).when(|| "when recording an event".into())?;
    for i in 0..samples as usize {
        for _ in 0..reps {
            graph.launch().when(|| "when replaying the graph".into())?;
        }
        events[i + 1].record(stream).when(|| "when recording an event".into())?;
    }
    events[samples as usize].synchronize().when(|| "when running the timed replays".into())?;
    let launches = batch * reps;
    let mut samples_us = Vec::with_capacity(samples as usize);
    for pair in events.windows(2) {
        let ms = pair[0].elapsed_ms(&pair[1]).when(|| "when reading an event".into())? as f64;
        samples_us.push(ms * 1e3 / launches as f64);
    }
    let mut timing = summarise(samples_us, launches);
    (timing.settle_ms, timing.steady, timing.trace) = (settle_ms, steady, trace);
    if let Some(probe) = extra.probe
        && extra.energy_ms > 0.0
    {
        let window = extra.energy_ms;
        let cap_ms = energy::MAX_WINDOW_MS.max(2.0 * window);
        let phase = run_polled(ctx, stream, replayed, probe, cap_ms, |polls| energy::enough(polls, window))?;
        // The launches that ran while the counter rose (no window: no energy, whatever the time).
        let launch_us = energy::window(&phase.polls, window)
            .and_then(|w| energy::span_launch_us(&phase.marks, w.from_ms, w.to_ms))
            .unwrap_or(0.0);
        timing.power = energy::reading(&phase.polls, launch_us, window);
        // Settled (the sustained regime, or a hold): the time is the one over the window. At the
        // power cap the clock hunts with a period near a second (the counter probe's trace), and
        // the samples, milliseconds in all, catch one phase of it: a capped bf16 4096^3 record's
        // samples read 220.8 us, its 1 s window 225.0, a 30 s hold 226.8 (H200, 2026-11-28).
        if extra.settle.is_some() && launch_us > 0.0 {
            timing.time_us = launch_us;
        }
        if extra.settle.is_none() {
            std::thread::sleep(Duration::from_millis(BURST_COOL_MS));
        }
    }
    Ok(timing)
}

/// How long a sample of a launch of `per_launch_ms` lasts: `min_sample_ms`, or with a `launches`
/// cap, the time of that many launches if shorter, but at least [`SHORTEST_SAMPLE_MS`] (and never
/// longer than `min_sample_ms`).
fn sample_ms(per_launch_ms: f64, min_sample_ms: f64, launches: u32) -> f64 {
    match launches {
        0 => min_sample_ms,
        n => (f64::from(n) * per_launch_ms).max(SHORTEST_SAMPLE_MS).min(min_sample_ms),
    }
}

/// Launches per graph and graph replays per sample for a launch of `per_launch_ms` and samples of
/// at least `min_sample_ms`: the graph holds up to [`GRAPH_MS`] (and [`MAX_BATCH`] launches), the
/// replays make up the rest. A launch counts as at least 1 ns (a probe may read 0).
fn sample_shape(per_launch_ms: f64, min_sample_ms: f64) -> (u32, u32) {
    let per_launch_ms = per_launch_ms.max(1e-6);
    let batch = ((min_sample_ms.min(GRAPH_MS) / per_launch_ms).ceil() as u32).clamp(1, MAX_BATCH);
    let reps = ((min_sample_ms / (f64::from(batch) * per_launch_ms)).ceil() as u32).max(1);
    (batch, reps)
}

/// `samples` replays of a graph of one launch, each between its own pair of events and each
/// after a memset of `scratch` that the events leave out.
fn cold<F>(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    samples: u32,
    scratch: &DevBuf,
    enqueue: &mut F,
) -> Result<Timing, CudaFailure>
where
    F: FnMut(&Arc<CudaStream>) -> Result<(), CudaFailure>,
{
    let graph = capture(stream, 1, enqueue)?;
    // One untimed replay: the graph's first launch pays for its upload to the device.
    scratch.fill_async(stream, 0).when(|| "when flushing the L2".into())?;
    replay_ms(ctx, stream, &graph)?;
    let starts = new_events(ctx, samples as usize)?;
    let ends = new_events(ctx, samples as usize)?;
    // Everything is enqueued before the first sample ends: the host never delays the GPU.
    for (i, (start, end)) in starts.iter().zip(&ends).enumerate() {
        scratch.fill_async(stream, i as u8).when(|| "when flushing the L2".into())?;
        start.record(stream).when(|| "when recording an event".into())?;
        graph.launch().when(|| "when replaying the graph".into())?;
        end.record(stream).when(|| "when recording an event".into())?;
    }
    if let Some(last) = ends.last() {
        last.synchronize().when(|| "when running the timed replays".into())?;
    }
    let mut samples_us = Vec::with_capacity(samples as usize);
    for (start, end) in starts.iter().zip(&ends) {
        samples_us.push(start.elapsed_ms(end).when(|| "when reading an event".into())? as f64 * 1e3);
    }
    Ok(summarise(samples_us, 1))
}

fn new_events(ctx: &Arc<CudaContext>, n: usize) -> Result<Vec<CudaEvent>, CudaFailure> {
    (0..n)
        .map(|_| ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).when(|| "when creating an event".into()))
        .collect()
}

/// Median and spread of a set of samples.
pub(crate) fn summarise(samples_us: Vec<f64>, batch: u32) -> Timing {
    let mut sorted = samples_us.clone();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    let time_us = if n == 0 {
        0.0
    } else if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    };
    let spread = if n > 0 && time_us > 0.0 { (sorted[n - 1] - sorted[0]) / time_us } else { 0.0 };
    Timing {
        samples_us,
        time_us,
        spread,
        batch,
        power: Power::default(),
        settle_ms: 0.0,
        steady: true,
        trace: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_spread() {
        let t = summarise(vec![3.0, 1.0, 2.0], 7);
        assert_eq!((t.time_us, t.batch), (2.0, 7));
        assert!((t.spread - 1.0).abs() < 1e-12);
        assert_eq!(summarise(vec![4.0, 1.0, 2.0, 3.0], 1).time_us, 2.5);
        assert_eq!(summarise(vec![], 1).time_us, 0.0);
    }

    #[test]
    fn a_burst_timing_is_its_fastest_sample() {
        // Eight samples at the full clock, then the cap: the median lands between the two.
        let capped = summarise(vec![1428.0, 1431.0, 1436.0, 1431.0, 1430.0, 1431.0, 1522.0, 1604.0, 1669.0, 1638.0], 1);
        assert_eq!(capped.time_us, 1433.5);
        let burst = at_full_clock(capped);
        assert_eq!(burst.time_us, 1428.0);
        assert!((burst.spread - (1669.0 - 1428.0) / 1428.0).abs() < 1e-12);
        // No positive sample: the timing is left as it was.
        assert_eq!(at_full_clock(summarise(vec![], 1)).time_us, 0.0);
    }

    #[test]
    fn long_samples_replay_a_graph_of_at_most_five_milliseconds() {
        // A trial's 1 ms samples: one graph a sample, as before.
        assert_eq!(sample_shape(0.002, 1.0), (500, 1));
        assert_eq!(sample_shape(0.7, 1.0), (2, 1));
        assert_eq!(sample_shape(3.0, 1.0), (1, 1));
        // A finalist's 50 ms samples: a 5 ms graph replayed until the sample is long enough.
        assert_eq!(sample_shape(0.002, 50.0), (2500, 10));
        assert_eq!(sample_shape(0.7, 50.0), (8, 9));
        assert_eq!(sample_shape(20.0, 50.0), (1, 3));
        // Every shape reaches the sample's length; the graph never exceeds its launch cap.
        for per_launch in [1e-9, 1e-4, 0.0037, 0.5, 1.7, 80.0] {
            for min_ms in [0.5, 1.0, 13.0, 50.0, 125.0] {
                let (batch, reps) = sample_shape(per_launch, min_ms);
                assert!((1..=MAX_BATCH).contains(&batch) && reps >= 1, "{per_launch} {min_ms}: {batch} x {reps}");
                let per = per_launch.max(1e-6);
                assert!(f64::from(batch) * f64::from(reps) * per >= min_ms * (1.0 - 1e-9), "{per_launch} {min_ms}");
                assert!(f64::from(batch) * per < GRAPH_MS + per, "{per_launch} {min_ms}: graph of {batch}");
            }
        }
    }

    #[test]
    fn a_launches_cap_shortens_long_samples_of_short_kernels_only() {
        // No cap: the length asked for.
        assert_eq!(sample_ms(0.003, 50.0, 0), 50.0);
        // A 3 us kernel's finalist samples: 500 launches, 1.5 ms instead of 50.
        assert!((sample_ms(0.003, 50.0, 500) - 1.5).abs() < 1e-12);
        // Never shorter than a trial's sample, never longer than asked.
        assert_eq!(sample_ms(0.0005, 50.0, 500), SHORTEST_SAMPLE_MS);
        assert_eq!(sample_ms(0.2, 50.0, 500), 50.0, "a 200 us kernel keeps its whole sample");
        assert_eq!(sample_ms(0.0005, 0.5, 500), 0.5);
        let (batch, reps) = sample_shape(0.003, sample_ms(0.003, 50.0, 500));
        assert!((500..=501).contains(&batch) && reps == 1, "{batch} x {reps}");
    }

    #[test]
    fn a_burst_timing_idles_after_a_reference_or_when_it_starts_capped() {
        let burst = Extra { energy_ms: 1000.0, cool_first: true, ..Extra::default() };
        assert!(cools_first(&burst));
        assert!(!cools_first(&Extra { cool_first: false, ..burst }), "nothing ran since the last timing");
        assert!(!cools_first(&Extra { energy_ms: 0.0, ..burst }), "a job for time alone does not wait");
        let rule = crate::energy::SteadyRule::default();
        assert!(!cools_first(&Extra { settle: Some((rule, 20_000.0)), ..burst }), "sustained settles instead");
        assert!(!cools_first(&Extra { hold_ms: 30_000.0, ..burst }), "a hold runs the kernel first");

        // Capped for as many polls as its count, then not.
        struct Capped(std::cell::Cell<u32>);
        impl Probe for Capped {
            fn poll(&self, t_ms: f64) -> Poll {
                Poll { t_ms, energy_mj: None, clock_mhz: 0, temperature_c: 0 }
            }
            fn capped(&self) -> bool {
                let left = self.0.get();
                self.0.set(left.saturating_sub(1));
                left > 0
            }
        }
        let hot = || Capped(std::cell::Cell::new(3));
        let probe = hot();
        let finalist = Extra { probe: Some(&probe), start_uncapped: true, ..Extra::default() };
        assert_eq!(idle_while_capped(&finalist, 1), 3, "idles until the cap lets go, a poll at a time");
        assert_eq!(idle_while_capped(&finalist, 1), 0, "not capped: no idle");
        let probe = hot();
        let finalist = Extra { probe: Some(&probe), ..finalist };
        assert_eq!(idle_while_capped(&Extra { start_uncapped: false, ..finalist }, 1), 0, "a trial does not ask");
        assert_eq!(idle_while_capped(&Extra { probe: None, ..finalist }, 1), 0, "no NVML: nothing to tell it by");
        let sustained = Extra { settle: Some((rule, 20_000.0)), ..finalist };
        assert_eq!(idle_while_capped(&sustained, 1), 0, "sustained wants the cap");
        let cooled = Extra { energy_ms: 1000.0, cool_first: true, ..finalist };
        assert_eq!(idle_while_capped(&cooled, 1), 0, "idles once, not twice");
        assert_eq!(probe.0.get(), 3, "none of those asked the probe");
    }

    #[test]
    fn the_flush_overwrites_twice_the_l2() {
        assert_eq!(flush_bytes(50 << 20), 100 << 20);
        assert_eq!(flush_bytes(0), UNKNOWN_L2_FLUSH_BYTES as usize);
    }
}
