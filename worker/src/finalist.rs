//! Finalist tasks: a workload's fastest configs measured again, interleaved, in one session of one
//! worker, so that a winner is not chosen on the noise of one measurement.
//!
//! The measure stage runs up to `rounds` rounds; each round measures every config once, in task order,
//! with the task's samples (round 1: A B C, round 2: A B C, ...). Interleaving spreads slow drift
//! (clocks, temperature, a neighbour's load) over all configs instead of charging it to whichever
//! config ran while it happened. Each measurement is followed at once by a timing of the vendor
//! library's pick, so that every finalist is compared with the vendor on the GPU as it was. In the
//! burst regime (the default) each measurement is a trial's and starts from the full clock
//! (`start_uncapped`: it idles first while the power cap holds the clock down), as a burst record
//! means. In the sustained regime the first finalist is measured once before the rounds,
//! unrecorded, so that round 1 does not start on a GPU cooled by the pause before the task (on an
//! H200 at its power cap, the first finalist of round 1 ran 652 us and the same kernel 720-780 us
//! in rounds 2 and 3, 2026-11-26), and every timing holds the GPU longer. A config
//! whose round is not ok (it crashed, hung, or computed a wrong result) is not measured again: a
//! kernel that killed its child would only do it again, and a hang costs a whole deadline each
//! time. The child restarts as usual and the other configs go on. [`combine`] turns a config's
//! rounds into its record.
//!
//! The task's `rounds` is a maximum. After [`MIN_ROUNDS`] rounds, and after every round after
//! them, [`verdict`] asks whether more rounds can still change the outcome: the rounds stop as
//! soon as every other finalist is either clearly slower than the fastest (its lead is beyond
//! the measured noise) or within that noise of it (a tie, which more rounds would not resolve into
//! a difference worth a round). The noise is measured, not assumed: the spread of each finalist's
//! per-round medians, as the standard error of their mean, never below [`NOISE_FLOOR`].

use crate::protocol::{MeasureOutcome, Status};

/// Rounds every finalist task runs (unless it asks for fewer): the first measure of the noise
/// between rounds needs two of them; one round shows only the noise within a measurement, which
/// misses what changes between measurements (clocks, temperature, a neighbour's load).
pub(crate) const MIN_ROUNDS: u32 = 2;
/// The least relative standard error a finalist's time is credited with, however alike its rounds
/// read: two rounds that happen to agree to 0.01% do not make a 0.1% lead real. 0.25% is about
/// the run-to-run spread of a graph-replayed median on an H100/H200 at steady clocks (the drift
/// reference reads within +-0.3% over a session, docs/BENCHMARKS.md).
pub(crate) const NOISE_FLOOR: f64 = 0.0025;
/// How many noises a lead must exceed to count as real (a one-sided z of 3: about one wrong call
/// in a thousand if the rounds' noise were normal and well estimated; with two rounds it is
/// estimated from one difference, so the margin is kept wide).
pub(crate) const SEPARATION: f64 = 3.0;

/// How a finalist's rounds (and the vendor timings after them) make one time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Center {
    /// The median of the per-round medians (the sustained regime: every round at the cap).
    Median,
    /// The fastest round's time (the burst regime, where a round's time is its fastest sample):
    /// a round that the power cap slowed is not a burst measurement. Each round starts from the
    /// full clock (`start_uncapped`), yet a large GEMM's rounds still read either full-clock or
    /// capped, round by round (an H200, 2026-11-29,
    /// f16 4096x14336x4096: rounds of 648-652 us and of 696-758 us, cool-start shots 646-650 us),
    /// so a median of three rounds lands on whichever kind two of them were.
    Fastest,
}

impl Center {
    /// The regime's center of a set of round times (0 when empty).
    pub(crate) fn of(self, values: &[f64]) -> f64 {
        match self {
            Center::Median => median(values),
            Center::Fastest => values.iter().copied().reduce(f64::min).unwrap_or(0.0),
        }
    }
}

/// What the rounds so far say.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Verdict {
    /// Some finalist is neither clearly slower than the fastest nor within noise of it: another
    /// round may decide.
    Undecided,
    /// Every other finalist is clearly slower than `winner` (its position in the task).
    Separated {
        /// The position of the fastest finalist.
        winner: usize,
    },
    /// Every other finalist is clearly slower than the fastest or within the noise of it (at
    /// least one within): more rounds would not tell a difference worth a round.
    WithinNoise,
    /// Fewer than two finalists are still measured: there is nothing left to compare.
    NothingToCompare,
}

impl Verdict {
    /// Whether the rounds may stop.
    pub(crate) fn settled(&self) -> bool {
        !matches!(self, Verdict::Undecided)
    }
}

/// A finalist's rounds so far, as [`verdict`] weighs them: the [`Center`] of its per-round medians
/// and the relative standard error of their mean (at least [`NOISE_FLOOR`]).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Estimate {
    center_us: f64,
    error: f64,
}

impl Estimate {
    /// `None` for a finalist with no rounds, or one whose last round was not ok (it is measured no
    /// more, and can no longer win).
    fn of(rounds: &[MeasureOutcome], center: Center) -> Option<Estimate> {
        if rounds.is_empty() || rounds.iter().any(|o| o.status != Status::Ok || o.median_us <= 0.0) {
            return None;
        }
        let medians: Vec<f64> = rounds.iter().map(|o| o.median_us).collect();
        let center_us = center.of(&medians);
        let n = medians.len() as f64;
        let error = if medians.len() < 2 {
            NOISE_FLOOR
        } else {
            let mean = medians.iter().sum::<f64>() / n;
            let var = medians.iter().map(|m| (m - mean).powi(2)).sum::<f64>() / (n - 1.0);
            (var.sqrt() / n.sqrt() / center_us).max(NOISE_FLOOR)
        };
        Some(Estimate { center_us, error })
    }
}

/// Whether the rounds measured so far (`measured[i]`: finalist `i`'s outcomes, one a round, empty
/// for a finalist that was never measured) can stop: see the module's notes. With `round` the
/// rounds run so far, nothing is settled before [`MIN_ROUNDS`] (or `rounds`, the task's maximum,
/// when it is smaller), not even a lone finalist's rounds: its record is still the workload's
/// time; the caller stops at `rounds` whatever this says.
pub(crate) fn verdict(measured: &[Vec<MeasureOutcome>], round: u32, rounds: u32, center: Center) -> Verdict {
    if round < MIN_ROUNDS.min(rounds) {
        return Verdict::Undecided;
    }
    let live: Vec<(usize, Estimate)> =
        measured.iter().enumerate().filter_map(|(i, r)| Some((i, Estimate::of(r, center)?))).collect();
    if live.len() < 2 {
        return Verdict::NothingToCompare;
    }
    // The fastest; ties go to the earlier position, the faster tuning record.
    let (winner, best) = live
        .iter()
        .copied()
        .min_by(|a, b| a.1.center_us.total_cmp(&b.1.center_us).then(a.0.cmp(&b.0)))
        .expect("two or more finalists are live");
    let mut tied = false;
    for (i, other) in live.iter().copied().filter(|(i, _)| *i != winner) {
        let lead = (other.center_us - best.center_us) / best.center_us;
        let noise = best.error.hypot(other.error);
        if lead <= noise {
            tied = true;
        } else if lead <= SEPARATION * noise {
            tracing::trace!(finalist = i, lead, noise, "finalist neither tied with the fastest nor clearly slower");
            return Verdict::Undecided;
        }
    }
    if tied { Verdict::WithinNoise } else { Verdict::Separated { winner } }
}

/// One config's record from its rounds, in round order, out of `rounds` planned.
///
/// When every round is ok: `median_us` is the [`Center`] of the per-round medians, `samples_us` holds
/// every sample of every round (in round order), `spread` is (max - min) / `median_us` over those
/// samples, `batch` is the fewest launches per sample of any round, the error figures are the
/// worst of any round, the SM clock is the lowest nonzero reading (a throttled round shows), and
/// `measure_ms` is the total. Otherwise the record is the first non-ok round's outcome (status and
/// error, the error prefixed with the round), with the total `measure_ms`; it carries no timing,
/// like any record that is not ok.
pub(crate) fn combine(measured: Vec<MeasureOutcome>, rounds: u32, center: Center) -> MeasureOutcome {
    let measure_ms = measured.iter().map(|o| o.measure_ms).sum();
    if let Some((round, failed)) = measured.iter().enumerate().find(|(_, o)| o.status != Status::Ok) {
        let mut outcome = failed.clone();
        outcome.error = format!("round {} of {rounds}: {}", round + 1, failed.error);
        outcome.measure_ms = measure_ms;
        return outcome;
    }
    let Some(first) = measured.first() else {
        return MeasureOutcome::failed(Status::LaunchError, "the finalist was never measured");
    };
    let medians: Vec<f64> = measured.iter().map(|o| o.median_us).collect();
    let median_us = center.of(&medians);
    let samples_us: Vec<f64> = measured.iter().flat_map(|o| o.samples_us.iter().copied()).collect();
    let (lo, hi) = samples_us.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &s| (lo.min(s), hi.max(s)));
    let spread = if median_us > 0.0 && lo <= hi { (hi - lo) / median_us } else { 0.0 };
    let worst = |err: fn(&MeasureOutcome) -> Option<f64>| measured.iter().filter_map(err).reduce(f64::max);
    let last = measured.last().unwrap_or(first);
    MeasureOutcome {
        status: Status::Ok,
        error: String::new(),
        samples_us,
        median_us,
        spread,
        batch: measured.iter().map(|o| o.batch).min().unwrap_or(0),
        baseline_us: last.baseline_us,
        baseline_kind: last.baseline_kind.clone(),
        max_abs_err: worst(|o| o.max_abs_err),
        max_rel_err: worst(|o| o.max_rel_err),
        registers: first.registers,
        smem_bytes: first.smem_bytes,
        measure_ms,
        sm_clock_mhz: measured.iter().map(|o| o.sm_clock_mhz).filter(|&mhz| mhz > 0).min().unwrap_or(0),
        power: crate::energy::Power {
            energy_mj: median_of_known(measured.iter().map(|o| o.power.energy_mj)),
            power_w: median_of_known(measured.iter().map(|o| o.power.power_w)),
            mean_clock_mhz: median_of_known(measured.iter().map(|o| o.power.mean_clock_mhz)),
            temperature_c: measured.iter().filter_map(|o| o.power.temperature_c).reduce(f64::max),
        },
        regime: first.regime,
        settle_ms: measured.iter().map(|o| o.settle_ms).fold(0.0, f64::max),
        steady: measured.iter().all(|o| o.steady),
        baseline_energy_mj: median_of_known(measured.iter().map(|o| o.baseline_energy_mj)),
        trace: Vec::new(),
    }
}

/// The median of the known values, `None` when every round's reading was unknown.
fn median_of_known(values: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    let known: Vec<f64> = values.flatten().collect();
    (!known.is_empty()).then(|| median(&known))
}

/// A finalist's vendor time from the timings of the vendor's pick that followed its rounds
/// (`(us, kind)`, one per round that timed one): their [`Center`], with the kind of the round
/// nearest to it; `None` when no round timed one. Timing the vendor right after each finalist puts both
/// under the same clocks; a baseline timed once at the start of a session may have run faster.
pub(crate) fn vendor_of_rounds(rounds: &[(f64, String)], center: Center) -> Option<(f64, String)> {
    let times: Vec<f64> = rounds.iter().map(|(us, _)| *us).collect();
    let mid = center.of(&times);
    let nearest = rounds.iter().min_by(|a, b| (a.0 - mid).abs().total_cmp(&(b.0 - mid).abs()))?;
    Some((mid, nearest.1.clone()))
}

/// A finalist's vendor time in a task whose finalists' vendor timings are `all` (`own` among them):
/// in the burst regime ([`Center::Fastest`]) the fastest of all of them, as the vendor's pick is one
/// call whose burst time is its time at the full clock, and each finalist's own timings of it follow
/// that finalist's load, which leaves the power limiter less room than the clock reading shows (an
/// H200, 2026-11-29: the pick read 660-729 us beside three f16 4096x14336x4096 finalists, 644 us in
/// the exported bundle's check, which times it alone from the full clock); in the sustained regime
/// ([`Center::Median`]) the finalist's own (see [`vendor_of_rounds`]), in the state its rounds kept the GPU in.
pub(crate) fn vendor_of(own: &[(f64, String)], all: &[Vec<(f64, String)>], center: Center) -> Option<(f64, String)> {
    match center {
        Center::Fastest => vendor_of_rounds(&all.iter().flatten().cloned().collect::<Vec<_>>(), center),
        Center::Median => vendor_of_rounds(own, center),
    }
}

/// The median of `values` (the mean of the middle two for an even count; 0 when empty).
fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(samples_us: &[f64], batch: u32, clock: u32) -> MeasureOutcome {
        let mut o = MeasureOutcome::failed(Status::Ok, "");
        o.samples_us = samples_us.to_vec();
        o.median_us = median(samples_us);
        o.batch = batch;
        o.sm_clock_mhz = clock;
        o.max_abs_err = Some(1e-3 * samples_us[0]);
        o.registers = 96;
        o.smem_bytes = 4096;
        o.measure_ms = 10.0;
        o.baseline_us = Some(2.0);
        o.baseline_kind = "cublasGemmEx".into();
        o
    }

    #[test]
    fn ok_rounds_give_the_median_of_their_medians_and_all_their_samples() {
        let rounds = vec![
            round(&[1.0, 2.0, 3.0], 60, 1980),
            round(&[10.0, 11.0, 12.0], 50, 0),
            round(&[4.0, 5.0, 6.0], 70, 1900),
        ];
        let c = combine(rounds, 3, Center::Median);
        assert_eq!((c.status, c.median_us), (Status::Ok, 5.0), "median of 2, 11 and 5");
        assert_eq!(c.samples_us, vec![1.0, 2.0, 3.0, 10.0, 11.0, 12.0, 4.0, 5.0, 6.0]);
        assert!((c.spread - (12.0 - 1.0) / 5.0).abs() < 1e-12);
        assert_eq!((c.batch, c.sm_clock_mhz, c.registers, c.smem_bytes), (50, 1900, 96, 4096));
        assert_eq!((c.max_abs_err, c.max_rel_err), (Some(1e-2), None));
        assert_eq!((c.baseline_us, c.baseline_kind.as_str(), c.measure_ms), (Some(2.0), "cublasGemmEx", 30.0));
        assert_eq!(
            combine(vec![round(&[1.0, 2.0], 50, 0), round(&[3.0, 4.0], 50, 0)], 2, Center::Median).median_us,
            2.5
        );
    }

    #[test]
    fn rounds_give_the_median_energy_of_those_that_read_one() {
        let mut rounds = vec![round(&[1.0], 50, 0), round(&[1.0], 50, 0), round(&[1.0], 50, 0)];
        for (r, (e, t)) in rounds.iter_mut().zip([(Some(3.0), 60.0), (None, 70.0), (Some(5.0), 65.0)]) {
            r.power.energy_mj = e;
            r.power.temperature_c = Some(t);
            r.settle_ms = t * 10.0;
        }
        rounds[2].steady = false;
        let c = combine(rounds, 3, Center::Median);
        assert_eq!((c.power.energy_mj, c.power.temperature_c, c.power.power_w), (Some(4.0), Some(70.0), None));
        assert_eq!((c.settle_ms, c.steady), (700.0, false), "the longest settle; one unsteady round shows");
    }

    #[test]
    fn a_round_that_is_not_ok_makes_the_finalist_not_ok() {
        let mut hung = MeasureOutcome::failed(Status::Timeout, "the measurement ran past the deadline");
        hung.measure_ms = 5000.0;
        let c = combine(vec![round(&[1.0, 2.0, 3.0], 60, 1980), hung], 3, Center::Median);
        assert_eq!(c.status, Status::Timeout);
        assert_eq!(c.error, "round 2 of 3: the measurement ran past the deadline");
        assert!(c.samples_us.is_empty() && c.median_us == 0.0);
        assert_eq!(c.measure_ms, 5010.0);
        assert_eq!(combine(Vec::new(), 3, Center::Median).status, Status::LaunchError);
    }

    /// A finalist's rounds with these medians (one sample each).
    fn rounds_of(medians: &[f64]) -> Vec<MeasureOutcome> {
        medians.iter().map(|&m| round(&[m], 50, 0)).collect()
    }

    #[test]
    fn finalists_far_apart_stop_after_the_minimum_rounds() {
        let measured = vec![rounds_of(&[10.0]), rounds_of(&[12.0]), rounds_of(&[11.0])];
        assert_eq!(
            verdict(&measured, 1, 3, Center::Median),
            Verdict::Undecided,
            "one round measures no noise between rounds"
        );
        let measured = vec![rounds_of(&[10.0, 10.02]), rounds_of(&[12.0, 12.1]), rounds_of(&[11.0, 10.9])];
        assert_eq!(verdict(&measured, 2, 3, Center::Median), Verdict::Separated { winner: 0 });
        // The winner may be any position.
        let measured = vec![rounds_of(&[12.0, 12.1]), rounds_of(&[10.0, 10.02])];
        assert_eq!(verdict(&measured, 2, 5, Center::Median), Verdict::Separated { winner: 1 });
        // A task that asks for one round settles after it, on the floor's noise.
        let measured = vec![rounds_of(&[10.0]), rounds_of(&[12.0])];
        assert_eq!(verdict(&measured, 1, 1, Center::Median), Verdict::Separated { winner: 0 });
    }

    #[test]
    fn finalists_within_noise_stop_too() {
        // Identical rounds (as on `sim`): the floor is the noise, and 0.1% is within it.
        let measured = vec![rounds_of(&[10.0, 10.0]), rounds_of(&[10.01, 10.01]), rounds_of(&[13.0, 13.0])];
        assert_eq!(verdict(&measured, 2, 3, Center::Median), Verdict::WithinNoise, "one tie and one clearly slower");
        // Noisy rounds: 1% apart, but the faster one's rounds differ by 6%.
        let measured = vec![rounds_of(&[10.0, 10.6]), rounds_of(&[10.5, 10.3])];
        assert_eq!(verdict(&measured, 2, 3, Center::Median), Verdict::WithinNoise);
    }

    #[test]
    fn a_lead_between_noise_and_separation_wants_another_round() {
        // 1% apart with the floor's noise (0.35% for the pair): more than one noise, less than three.
        let measured = vec![rounds_of(&[10.0, 10.0]), rounds_of(&[10.1, 10.1])];
        assert_eq!(verdict(&measured, 2, 3, Center::Median), Verdict::Undecided);
        // A third round that agrees does not shrink the floor: still undecided (the caller stops
        // at the task's maximum).
        let measured = vec![rounds_of(&[10.0, 10.0, 10.0]), rounds_of(&[10.1, 10.1, 10.1])];
        assert_eq!(verdict(&measured, 3, 3, Center::Median), Verdict::Undecided);
        // Noise measured from the rounds: 4% apart with rounds that differ by 2% is undecided
        // after two rounds, and separated once more rounds shrink the error of their mean.
        let measured = vec![rounds_of(&[10.0, 10.2]), rounds_of(&[10.4, 10.6])];
        assert_eq!(verdict(&measured, 2, 5, Center::Median), Verdict::Undecided);
        let measured = vec![rounds_of(&[10.0, 10.2, 10.1, 10.1]), rounds_of(&[10.4, 10.6, 10.5, 10.5])];
        assert_eq!(verdict(&measured, 4, 5, Center::Median), Verdict::Separated { winner: 0 });
    }

    #[test]
    fn finalists_that_failed_are_out_of_the_comparison() {
        let mut hung = MeasureOutcome::failed(Status::Timeout, "hung");
        hung.measure_ms = 1.0;
        let measured =
            vec![rounds_of(&[10.0, 10.0]), vec![round(&[9.0], 50, 0), hung.clone()], rounds_of(&[10.1, 10.1])];
        assert_eq!(
            verdict(&measured, 2, 3, Center::Median),
            Verdict::Undecided,
            "the failed one does not win; the other two are close"
        );
        let measured = vec![rounds_of(&[10.0]), vec![hung.clone()], Vec::new()];
        assert_eq!(
            verdict(&measured, 1, 3, Center::Median),
            Verdict::Undecided,
            "a lone finalist still gets the minimum rounds"
        );
        let measured = vec![rounds_of(&[10.0, 10.0]), vec![hung], Vec::new()];
        assert_eq!(
            verdict(&measured, 2, 3, Center::Median),
            Verdict::NothingToCompare,
            "one finalist left: no more rounds"
        );
        assert!(Verdict::NothingToCompare.settled() && !Verdict::Undecided.settled());
    }

    #[test]
    fn the_vendor_time_of_the_rounds_is_their_median() {
        assert_eq!(vendor_of_rounds(&[], Center::Median), None);
        let rounds = [
            (190.0, "cublasGemmEx".to_string()),
            (200.0, "cublasLt heuristic #2 of 8".to_string()),
            (186.0, "cublasGemmEx".to_string()),
        ];
        assert_eq!(vendor_of_rounds(&rounds, Center::Median), Some((190.0, "cublasGemmEx".to_string())));
        let (us, _) = vendor_of_rounds(&rounds[..2], Center::Median).unwrap();
        assert_eq!(us, 195.0);
    }

    #[test]
    fn a_burst_finalist_is_its_fastest_round_and_so_is_its_vendor() {
        // Rounds at the full clock and at the cap, as an H200 read them (us): the median is a
        // capped round's, the burst time the full-clock one's.
        let rounds = vec![
            round(&[652.0, 649.0, 650.0], 2, 1920),
            round(&[701.0, 696.0, 700.0], 2, 1590),
            round(&[758.0, 747.0, 741.0], 2, 1515),
        ];
        assert_eq!(combine(rounds.clone(), 3, Center::Median).median_us, 700.0);
        let fastest = combine(rounds.clone(), 3, Center::Fastest);
        assert_eq!((fastest.median_us, fastest.samples_us.len()), (650.0, 9), "every sample is kept");
        let vendor = [
            (626.0, "cublasLt #4 of 8".to_string()),
            (660.0, "cublasLt #4 of 8".to_string()),
            (690.0, "cublasGemmEx".to_string()),
        ];
        assert_eq!(vendor_of_rounds(&vendor, Center::Fastest), Some((626.0, "cublasLt #4 of 8".to_string())));
        // Beside three finalists: burst takes the fastest of all, sustained each one's own.
        let pick = |us: f64| (us, "cublasGemmEx".to_string());
        let all = vec![vec![pick(684.6), pick(690.0)], vec![pick(659.6), pick(700.0)], vec![pick(728.8)]];
        assert_eq!(vendor_of(&all[0], &all, Center::Fastest), Some(pick(659.6)));
        assert_eq!(vendor_of(&all[2], &all, Center::Fastest), Some(pick(659.6)));
        assert_eq!(vendor_of(&all[0], &all, Center::Median), Some((687.3, "cublasGemmEx".to_string())));
        assert_eq!(vendor_of(&[], &[], Center::Fastest), None);
        // The verdict weighs the same centers, with the rounds' spread as their noise: by its
        // median this finalist ties a steady 690 us one; by its fastest round it leads by 6%, which
        // its capped rounds' spread (a 4% standard error) leaves undecided, so the rounds go on
        // while the task allows.
        let other = vec![
            round(&[690.0, 690.0, 690.0], 2, 1980),
            round(&[689.0, 690.0, 691.0], 2, 1980),
            round(&[690.0, 691.0, 689.0], 2, 1980),
        ];
        let measured = vec![other, rounds];
        assert_eq!(verdict(&measured, 3, 5, Center::Median), Verdict::WithinNoise);
        assert_eq!(verdict(&measured, 3, 5, Center::Fastest), Verdict::Undecided);
        assert_eq!(Center::Fastest.of(&[]), 0.0);
    }
}
