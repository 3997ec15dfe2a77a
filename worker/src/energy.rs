//! Energy, power and the steady state, as pure functions over what a GPU's management library
//! (NVML) is polled for while a kernel runs: the board's energy counter, the SM clock and the
//! temperature. The `cuda` backend polls; everything here is testable on synthetic traces.
//!
//! - Energy per launch: NVML's counter counts millijoules and publishes every 100 ms on an H200
//!   (and an H100), each step the energy of those 100 ms; at the power cap the draw swings 15-25%
//!   from one step to the next as the cap's controller hunts, with a period of about a second. So
//!   it is read over a window of at least [`MIN_WINDOW_MS`] of back-to-back launches, polled
//!   throughout, that starts and ends at a publication: the mean power is the counter's rise
//!   between the first and the last poll that saw it change, over the time between them (mJ per
//!   ms is watts), and a launch's energy is that power times its time over the same span
//!   ([`span_launch_us`]). A window too short, or a counter that did not change at least
//!   [`MIN_COUNTER_STEPS`] times, reads unknown.
//! - The steady state ([`settled_at`]): the GPU is steady under a kernel once the means of clock
//!   and power over three consecutive windows of a second agree: no transient (boost, then the
//!   power cap pulling the clock down as the board heats) is still under way. Points within a
//!   window may swing (the cap's hunting is the steady state at the cap); their means may not.

use serde::{Deserialize, Serialize};

/// The shortest window an energy reading is taken over, milliseconds: ten of the counter's
/// publications. Chosen from one reading (H200, 2026-11-28, an 8192^3 f16 loop at the 700 W cap,
/// the counter polled in a tight loop: `docs/data/gpu-2026-11-28-energy/nvml-counter-probe.json`): windows
/// aligned to its changes read power within 80% of each other at 100 ms, 20% at 500 ms and 0.5%
/// at 1 s (four consecutive windows).
pub const MIN_WINDOW_MS: f64 = 1000.0;
/// Changes of the counter a window must see: two, [`MIN_WINDOW_MS`] or more apart.
pub const MIN_COUNTER_STEPS: usize = 2;
/// The longest an energy phase runs waiting for its counter changes, milliseconds: a counter
/// that publishes less often than every 700 ms reads unknown.
pub const MAX_WINDOW_MS: f64 = 2500.0;

/// What one poll of the GPU read, at `t_ms` on the host's clock.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Poll {
    /// Host time since the window began, milliseconds.
    pub t_ms: f64,
    /// The board's energy counter, millijoules (since the driver loaded); `None` when unknown.
    pub energy_mj: Option<u64>,
    /// SM clock, MHz (0 when unknown).
    pub clock_mhz: u32,
    /// GPU temperature, degrees Celsius (0 when unknown).
    pub temperature_c: u32,
}

/// Energy and the GPU's state over a measurement's window; each figure `None` when unknown.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Power {
    /// Millijoules per launch.
    #[serde(default)]
    pub energy_mj: Option<f64>,
    /// Mean board power, watts.
    #[serde(default)]
    pub power_w: Option<f64>,
    /// Mean SM clock, MHz.
    #[serde(default)]
    pub mean_clock_mhz: Option<f64>,
    /// Temperature at the end of the window, degrees Celsius.
    #[serde(default)]
    pub temperature_c: Option<f64>,
}

/// The mean power over `polls` (watts): the counter's rise between the first and the last poll
/// that saw it change, over the time between them. The counter publishes the energy so far every
/// few to every hundred milliseconds (an H100's, about every 100 ms); a poll that sees a new value
/// marks a publication to within the polling interval, so the rise between two of them is the
/// energy of exactly that span, not of a staircase's edges. `None` when fewer than two changes
/// were seen, when they are less than `min_ms` apart, or when the counter is unknown or ran
/// backwards (a driver reload).
pub fn mean_power_w(polls: &[Poll], min_ms: f64) -> Option<f64> {
    window(polls, min_ms).map(|w| w.rise_mj / (w.to_ms - w.from_ms))
}

/// The span an energy reading covers: from the first to the last poll that saw the counter
/// change, and the counter's rise between them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Window {
    /// Host time of the first change seen, milliseconds.
    pub from_ms: f64,
    /// Host time of the last change seen.
    pub to_ms: f64,
    /// The counter's rise between them, millijoules.
    pub rise_mj: f64,
}

/// The reading's [`Window`] (see [`mean_power_w`]); `None` when there is none.
pub fn window(polls: &[Poll], min_ms: f64) -> Option<Window> {
    let mut changes: Vec<(f64, u64)> = Vec::new();
    let mut last: Option<u64> = None;
    for p in polls {
        let Some(e) = p.energy_mj else { continue };
        if last.is_some_and(|l| l != e) {
            changes.push((p.t_ms, e));
        }
        last = Some(e);
    }
    let (first, end) = (changes.first()?, changes.last()?);
    let span = end.0 - first.0;
    if changes.len() < MIN_COUNTER_STEPS || span < min_ms || end.1 <= first.1 {
        return None;
    }
    Some(Window { from_ms: first.0, to_ms: end.0, rise_mj: (end.1 - first.1) as f64 })
}

/// Where a phase of back-to-back replays stood when the host saw one of its chunks finish.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Mark {
    /// Host time the chunk was seen finished, milliseconds (as the polls count).
    pub host_ms: f64,
    /// GPU time from the phase's start to the chunk's end (CUDA events), milliseconds.
    pub gpu_ms: f64,
    /// Launches run by the chunk's end since the phase started.
    pub launches: u64,
}

/// The GPU time per launch, microseconds, over the marks closest to `from_ms` and `to_ms` (host
/// time): the launches that ran while the counter rose, at the clock of that span, not of the
/// whole phase (at the cap, clock and power swing together within a second). `None` when fewer
/// than two distinct marks bracket any launches.
pub fn span_launch_us(marks: &[Mark], from_ms: f64, to_ms: f64) -> Option<f64> {
    let nearest = |t: f64| marks.iter().min_by(|a, b| (a.host_ms - t).abs().total_cmp(&(b.host_ms - t).abs()));
    let (a, b) = (nearest(from_ms)?, nearest(to_ms)?);
    (b.launches > a.launches && b.gpu_ms > a.gpu_ms)
        .then(|| (b.gpu_ms - a.gpu_ms) * 1e3 / (b.launches - a.launches) as f64)
}

/// Whether `polls` already hold a reading ([`mean_power_w`] would answer): the energy phase runs
/// until then, or its cap.
pub fn enough(polls: &[Poll], min_ms: f64) -> bool {
    mean_power_w(polls, min_ms).is_some()
}

/// The window's reading for a launch of `launch_us`: energy per launch from the mean power, the
/// mean of the clocks polled (those known), the last temperature known.
pub fn reading(polls: &[Poll], launch_us: f64, min_ms: f64) -> Power {
    let power_w = mean_power_w(polls, min_ms);
    let clocks: Vec<f64> = polls.iter().filter(|p| p.clock_mhz > 0).map(|p| f64::from(p.clock_mhz)).collect();
    let mean_clock_mhz = (!clocks.is_empty()).then(|| clocks.iter().sum::<f64>() / clocks.len() as f64);
    let temperature_c = polls.iter().rev().find(|p| p.temperature_c > 0).map(|p| f64::from(p.temperature_c));
    Power {
        // W x us = uJ; a thousandth of that in mJ.
        energy_mj: power_w.filter(|_| launch_us > 0.0).map(|w| w * launch_us * 1e-3),
        power_w,
        mean_clock_mhz,
        temperature_c,
    }
}

/// One point of a trace the steady test reads: mean clock and power over a short interval.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct StatePoint {
    /// End of the interval, milliseconds since the kernel started running.
    pub t_ms: f64,
    /// Mean SM clock over the interval, MHz.
    pub clock_mhz: f64,
    /// Mean board power over the interval, watts.
    pub power_w: f64,
}

/// The shortest interval a point of a [`state_trace`] spans, milliseconds: the counter's
/// millijoule steps over 100 ms are 10 W, a few percent of a loaded GPU's draw.
pub const STATE_INTERVAL_MS: f64 = 100.0;

/// The clock and power trace of a run from its polls: a point for each span of at least
/// [`STATE_INTERVAL_MS`] between two polls that saw the energy counter change, with the power
/// over that span and the mean of the clocks polled in it. Empty without a counter.
pub fn state_trace(polls: &[Poll]) -> Vec<StatePoint> {
    let mut out = Vec::new();
    let mut last: Option<u64> = None;
    let mut mark: Option<(usize, f64, u64)> = None;
    for (i, p) in polls.iter().enumerate() {
        let Some(e) = p.energy_mj else { continue };
        let changed = last.is_some_and(|l| l != e);
        last = Some(e);
        if !changed {
            continue;
        }
        match mark {
            None => mark = Some((i, p.t_ms, e)),
            Some((from, t, e0)) if p.t_ms - t >= STATE_INTERVAL_MS && e > e0 => {
                let clocks: Vec<f64> =
                    polls[from..=i].iter().filter(|q| q.clock_mhz > 0).map(|q| f64::from(q.clock_mhz)).collect();
                let clock_mhz = if clocks.is_empty() { 0.0 } else { clocks.iter().sum::<f64>() / clocks.len() as f64 };
                out.push(StatePoint { t_ms: p.t_ms, clock_mhz, power_w: (e - e0) as f64 / (p.t_ms - t) });
                mark = Some((i, p.t_ms, e));
            }
            Some(_) => {}
        }
    }
    out
}

/// When a GPU counts as steady under load.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SteadyRule {
    /// Length of each of the three windows compared, milliseconds.
    pub window_ms: f64,
    /// Largest relative difference of the windows' mean clocks ((max - min) / mean).
    pub clock_tol: f64,
    /// The same for their mean power.
    pub power_tol: f64,
    /// Fewest points in each window.
    pub min_points: usize,
}

impl Default for SteadyRule {
    /// Three windows of a second whose means agree: clocks within 1%, power within 2%. The
    /// cap's controller hunts with a period near a second (H200, 2026-11-28: 100 ms steps of
    /// 557-749 W at the 700 W cap, one-second means within 0.5%), so a window spans one hunt and
    /// its mean is steady where its points are not; three windows see a drift of more than about
    /// half a percent a second (heat soaking into the board).
    fn default() -> SteadyRule {
        SteadyRule { window_ms: 1000.0, clock_tol: 0.01, power_tol: 0.02, min_points: 4 }
    }
}

/// Windows compared by [`settled_at`].
const STEADY_WINDOWS: usize = 3;

/// The first time in `trace` (ordered by time) at which the [`STEADY_WINDOWS`] windows ending
/// there have means of clock and power that agree, by `rule`; `None` when the trace never settles.
pub fn settled_at(trace: &[StatePoint], rule: &SteadyRule) -> Option<f64> {
    let start = trace.first()?.t_ms;
    let span = STEADY_WINDOWS as f64 * rule.window_ms;
    for p in trace {
        let t = p.t_ms;
        if t - start < span {
            continue;
        }
        let mut clocks = Vec::with_capacity(STEADY_WINDOWS);
        let mut powers = Vec::with_capacity(STEADY_WINDOWS);
        for w in 0..STEADY_WINDOWS {
            let (hi, lo) = (t - w as f64 * rule.window_ms, t - (w + 1) as f64 * rule.window_ms);
            let points: Vec<&StatePoint> = trace.iter().filter(|q| q.t_ms > lo && q.t_ms <= hi).collect();
            if points.len() < rule.min_points {
                break;
            }
            clocks.push(mean(points.iter().map(|q| q.clock_mhz)));
            powers.push(mean(points.iter().map(|q| q.power_w)));
        }
        if clocks.len() == STEADY_WINDOWS
            && flat(clocks.iter().copied(), rule.clock_tol)
            && flat(powers.iter().copied(), rule.power_tol)
        {
            return Some(t);
        }
    }
    None
}

/// The trace in windows of `window_ms`: each window's end and its mean clock and power (for a
/// report of how a long run evolved).
pub fn window_means(trace: &[StatePoint], window_ms: f64) -> Vec<StatePoint> {
    let Some(start) = trace.first().map(|p| p.t_ms) else { return Vec::new() };
    let mut out = Vec::new();
    let mut from = 0;
    for (i, p) in trace.iter().enumerate() {
        let last = i + 1 == trace.len();
        let next_window = trace
            .get(i + 1)
            .is_some_and(|q| ((q.t_ms - start) / window_ms).floor() > ((p.t_ms - start) / window_ms).floor());
        if last || next_window {
            let w = &trace[from..=i];
            out.push(StatePoint {
                t_ms: p.t_ms,
                clock_mhz: mean(w.iter().map(|q| q.clock_mhz)),
                power_w: mean(w.iter().map(|q| q.power_w)),
            });
            from = i + 1;
        }
    }
    out
}

fn mean(values: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = values.fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    if n == 0 { 0.0 } else { sum / n as f64 }
}

/// Whether `values` vary by at most `tol` of their mean (max - min).
fn flat(values: impl Iterator<Item = f64> + Clone, tol: f64) -> bool {
    let m = mean(values.clone());
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)));
    m > 0.0 && (hi - lo) <= tol * m
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A counter of `watts` that advances in steps of `step_ms`, polled every `poll_ms`.
    fn polls(watts: f64, span_ms: f64, poll_ms: f64, step_ms: f64) -> Vec<Poll> {
        let mut out = Vec::new();
        let mut t = 0.0;
        while t <= span_ms + 1e-9 {
            let stepped = (t / step_ms).floor() * step_ms;
            out.push(Poll {
                t_ms: t,
                energy_mj: Some(1_000_000 + (watts * stepped) as u64),
                clock_mhz: 1755,
                temperature_c: 60,
            });
            t += poll_ms;
        }
        out
    }

    #[test]
    fn power_is_the_counter_rise_between_its_changes() {
        // 600 W, a counter that advances every 10 ms, polled every 2 ms over 200 ms.
        let w = mean_power_w(&polls(600.0, 200.0, 2.0, 10.0), 100.0).unwrap();
        assert!((w - 600.0).abs() < 0.01 * 600.0, "{w}");
        // An H200's counter: every 100 ms, polled every 4 ms (an NVML energy read takes 3-5 ms);
        // 1250 ms see a window of ten publications.
        let p = polls(450.0, 1250.0, 4.0, 100.0);
        assert!(enough(&p, MIN_WINDOW_MS));
        let span = window(&p, MIN_WINDOW_MS).unwrap();
        assert!(span.to_ms - span.from_ms >= MIN_WINDOW_MS && span.from_ms <= 104.0, "{span:?}");
        let w = mean_power_w(&p, MIN_WINDOW_MS).unwrap();
        assert!((w - 450.0).abs() < 0.01 * 450.0, "{w}");
        // Too short a window, or a counter that never moved: unknown, never a made-up number.
        assert_eq!(mean_power_w(&polls(600.0, 50.0, 2.0, 10.0), 100.0), None);
        assert_eq!(mean_power_w(&polls(600.0, 150.0, 3.0, 100.0), 100.0), None, "one change");
        assert!(!enough(&polls(600.0, 900.0, 4.0, 100.0), MIN_WINDOW_MS), "nine publications");
        assert!(!enough(&polls(600.0, 200.0, 2.0, 1000.0), 100.0));
        let mut none = polls(600.0, 200.0, 2.0, 10.0);
        none.iter_mut().for_each(|p| p.energy_mj = None);
        assert_eq!(mean_power_w(&none, 100.0), None);
    }

    #[test]
    fn a_launch_twice_as_long_reads_twice_the_energy() {
        let p = polls(500.0, 300.0, 2.0, 5.0);
        let (one, two) = (reading(&p, 100.0, 100.0), reading(&p, 200.0, 100.0));
        let ratio = two.energy_mj.unwrap() / one.energy_mj.unwrap();
        assert!((ratio - 2.0).abs() < 1e-9, "{ratio}");
        // 500 W for 100 us is 50 mJ.
        assert!((one.energy_mj.unwrap() - 50.0).abs() < 2.5, "{one:?}");
        assert_eq!((one.mean_clock_mhz, one.temperature_c), (Some(1755.0), Some(60.0)));
        let unknown = reading(&[], 100.0, MIN_WINDOW_MS);
        assert_eq!(unknown, Power::default());
    }

    #[test]
    fn a_launch_is_timed_over_the_span_the_counter_rose() {
        // Chunks of 1000 launches every 20 ms of GPU time, seen by the host 3 ms late; from 500 ms
        // on the clock drops and a chunk takes 25 ms.
        let mut marks = Vec::new();
        let (mut gpu, mut launches) = (0.0, 0u64);
        while gpu < 1500.0 {
            gpu += if gpu < 500.0 { 20.0 } else { 25.0 };
            launches += 1000;
            marks.push(Mark { host_ms: gpu + 3.0, gpu_ms: gpu, launches });
        }
        // Over the slow half alone: 25 us a launch, not the phase's mean.
        let slow = span_launch_us(&marks, 600.0, 1400.0).unwrap();
        assert!((slow - 25.0).abs() < 1e-9, "{slow}");
        let all = span_launch_us(&marks, 0.0, 1500.0).unwrap();
        assert!(all > 20.0 && all < 25.0, "{all}");
        assert_eq!(span_launch_us(&marks[..1], 0.0, 1500.0), None, "one mark brackets nothing");
        assert_eq!(span_launch_us(&[], 0.0, 1.0), None);
    }

    /// A trace every 100 ms: boost at 1980 MHz and 700 W, then the cap pulls both down over
    /// `settle_ms` to 1755 MHz and 650 W, hunting around that: power +-12% and clock +-3% over a
    /// period of a second (as the H200's counter read at its cap).
    fn trace(settle_ms: f64, total_ms: f64) -> Vec<StatePoint> {
        (1..=(total_ms / 100.0) as usize)
            .map(|i| {
                let t = i as f64 * 100.0;
                let f = (t / settle_ms).min(1.0);
                let hunt = (std::f64::consts::TAU * t / 1000.0).sin() * f;
                StatePoint {
                    t_ms: t,
                    clock_mhz: (1980.0 - 225.0 * f) * (1.0 + 0.03 * hunt),
                    power_w: (700.0 - 50.0 * f) * (1.0 + 0.12 * hunt),
                }
            })
            .collect()
    }

    #[test]
    fn the_gpu_is_steady_once_the_means_of_clock_and_power_stop_moving() {
        let rule = SteadyRule::default();
        let at = settled_at(&trace(5000.0, 12_000.0), &rule).expect("it settles, hunting and all");
        // Not before the transient ended, and within the three windows that must see it over.
        assert!((5000.0..=8300.0).contains(&at), "{at}");
        // A transient that outlasts the trace never settles.
        assert_eq!(settled_at(&trace(5000.0, 4000.0), &rule), None);
        // A clock that steps down by 9% every two seconds (throttling in stages) never does.
        let stepping: Vec<StatePoint> = (1..=100)
            .map(|i| StatePoint {
                t_ms: i as f64 * 100.0,
                clock_mhz: 1980.0 * (1.0 - 0.09 * f64::from(i / 20)),
                power_w: 690.0,
            })
            .collect();
        assert_eq!(settled_at(&stepping, &rule), None);
        // A GPU flat from the start settles three windows after its first point (at 100 ms).
        assert_eq!(
            settled_at(
                &trace(1.0, 5000.0)
                    .iter()
                    .map(|p| StatePoint { clock_mhz: 1755.0, power_w: 650.0, ..*p })
                    .collect::<Vec<_>>(),
                &rule
            ),
            Some(3100.0)
        );
        // Too few points per window (a slow poll): not steady.
        let sparse: Vec<StatePoint> = trace(1.0, 5000.0).into_iter().step_by(5).collect();
        assert_eq!(settled_at(&sparse, &rule), None);
    }

    #[test]
    fn polls_make_a_trace_of_power_and_clock_every_hundred_milliseconds() {
        // 600 W, a counter every 10 ms, polled every 2 ms for a second: a point every 100 ms.
        let trace = state_trace(&polls(600.0, 1000.0, 2.0, 10.0));
        assert!((8..=10).contains(&trace.len()), "{}", trace.len());
        for p in &trace {
            assert!((p.power_w - 600.0).abs() < 0.02 * 600.0 && p.clock_mhz == 1755.0, "{p:?}");
        }
        assert!(trace.windows(2).all(|w| w[1].t_ms - w[0].t_ms >= STATE_INTERVAL_MS));
        let mut none = polls(600.0, 1000.0, 2.0, 10.0);
        none.iter_mut().for_each(|p| p.energy_mj = None);
        assert!(state_trace(&none).is_empty());
        // A second's means of a hunting trace: the hunt averages out.
        let means = window_means(&trace_hunting(), 1000.0);
        assert_eq!(means.len(), 10);
        assert!(means.iter().all(|m| (m.power_w - 650.0).abs() < 0.01 * 650.0), "{means:?}");
        assert!(window_means(&[], 1000.0).is_empty());
    }

    /// Ten seconds at the cap, the power hunting +-12% with a period of a second.
    fn trace_hunting() -> Vec<StatePoint> {
        (1..=100)
            .map(|i| {
                let t = i as f64 * 100.0;
                let hunt = (std::f64::consts::TAU * t / 1000.0).sin();
                StatePoint { t_ms: t, clock_mhz: 1755.0, power_w: 650.0 * (1.0 + 0.12 * hunt) }
            })
            .collect()
    }

    #[test]
    fn a_slow_drift_is_steady_a_fast_one_is_not() {
        // A clock falling 0.3% a second stays within the rule's 1% over three windows; 3% never.
        let drift = |per_s: f64| -> Vec<StatePoint> {
            (1..=100)
                .map(|i| {
                    let t = i as f64 * 100.0;
                    StatePoint { t_ms: t, clock_mhz: 1980.0 * (1.0 - per_s * t / 1000.0), power_w: 650.0 }
                })
                .collect()
        };
        assert!(settled_at(&drift(0.003), &SteadyRule::default()).is_some());
        assert_eq!(settled_at(&drift(0.03), &SteadyRule::default()), None);
        assert!(settled_at(&trace_hunting(), &SteadyRule::default()).is_some(), "hunting at the cap is steady");
    }
}
