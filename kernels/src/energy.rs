//! The clock state a measurement is taken in ([`Regime`]) and what a job minimises
//! ([`Objective`]): one definition for the client's flags, the wire, the tracker's store and the
//! worker, spelled the same everywhere.
//!
//! At the power cap time follows energy: the same kernel reads faster in a short burst on a cool
//! GPU at full clock than inside a long run at the power-capped clock (cuBLAS 4096^3 on an H200:
//! 184 us against 218 us). A record says which regime it was timed in, and only records of one
//! regime compete with each other.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The clock state a kernel is timed in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Regime {
    /// From a cool GPU at full clock, as a latency-bound server calls a kernel now and then (the
    /// measurement of every record before regimes existed).
    #[default]
    Burst,
    /// After the GPU reached its steady, power-capped state running the kernel itself, as a
    /// training job runs it.
    Sustained,
}

impl Regime {
    /// Every regime.
    pub const ALL: [Regime; 2] = [Regime::Burst, Regime::Sustained];

    /// `burst` or `sustained`, as stored and sent.
    pub fn name(self) -> &'static str {
        match self {
            Regime::Burst => "burst",
            Regime::Sustained => "sustained",
        }
    }

    /// The regime of a wire or stored name; empty means burst (senders that predate regimes).
    pub fn parse(name: &str) -> Result<Regime, String> {
        match name.trim() {
            "" | "burst" => Ok(Regime::Burst),
            "sustained" => Ok(Regime::Sustained),
            other => Err(format!("{other:?} is not a regime; use burst or sustained")),
        }
    }
}

impl FromStr for Regime {
    type Err = String;

    fn from_str(s: &str) -> Result<Regime, String> {
        Regime::parse(s)
    }
}

impl fmt::Display for Regime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a job minimises per record.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Objective {
    /// The median time per launch (every job before objectives existed).
    #[default]
    Time,
    /// Joules per launch.
    Energy,
    /// Energy x delay: joules per launch times seconds per launch.
    Edp,
}

impl Objective {
    /// `time`, `energy` or `edp`, as stored and sent.
    pub fn name(self) -> &'static str {
        match self {
            Objective::Time => "time",
            Objective::Energy => "energy",
            Objective::Edp => "edp",
        }
    }

    /// The objective of a wire or stored name; empty means time.
    pub fn parse(name: &str) -> Result<Objective, String> {
        match name.trim() {
            "" | "time" => Ok(Objective::Time),
            "energy" => Ok(Objective::Energy),
            "edp" => Ok(Objective::Edp),
            other => Err(format!("{other:?} is not an objective; use time, energy or edp")),
        }
    }

    /// The score a record of median `time_us` and `energy_mj` per launch gets (smaller is better):
    /// microseconds, millijoules, or millijoule-microseconds. `None` when the objective needs an
    /// energy the record does not have (unknown energy never scores as zero).
    pub fn score(self, time_us: f64, energy_mj: Option<f64>) -> Option<f64> {
        if !(time_us.is_finite() && time_us > 0.0) {
            return None;
        }
        let energy = || energy_mj.filter(|e| e.is_finite() && *e > 0.0);
        match self {
            Objective::Time => Some(time_us),
            Objective::Energy => energy(),
            Objective::Edp => energy().map(|e| e * time_us),
        }
    }

    /// The unit of [`Objective::score`], for reports.
    pub fn unit(self) -> &'static str {
        match self {
            Objective::Time => "us",
            Objective::Energy => "mJ",
            Objective::Edp => "mJ*us",
        }
    }
}

impl FromStr for Objective {
    type Err = String;

    fn from_str(s: &str) -> Result<Objective, String> {
        Objective::parse(s)
    }
}

impl fmt::Display for Objective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The largest `--max-slowdown`, as a fraction: a pick twice as slow as the fastest is no longer
/// "nearly the same time".
pub const MAX_SLOWDOWN: f64 = 1.0;

/// Checks a max-slowdown fraction: finite, 0 ..= [`MAX_SLOWDOWN`] (0: off).
pub fn check_slowdown(fraction: f64) -> Result<f64, String> {
    if fraction.is_finite() && (0.0..=MAX_SLOWDOWN).contains(&fraction) {
        Ok(fraction)
    } else {
        Err(format!("{fraction} is out of range; the max slowdown must be 0 ..= {MAX_SLOWDOWN} (0 ..= 100%)"))
    }
}

/// Parses `3%` or `0.03` into a fraction in 0 ..= [`MAX_SLOWDOWN`].
pub fn parse_slowdown(text: &str) -> Result<f64, String> {
    let t = text.trim();
    let (number, scale) = match t.strip_suffix('%') {
        Some(n) => (n.trim(), 0.01),
        None => (t, 1.0),
    };
    let v: f64 = number.parse().map_err(|_| format!("{text:?} is not a slowdown; write it as 3% or 0.03"))?;
    check_slowdown(v * scale).map_err(|e| format!("{text:?}: {e}"))
}

/// Of `candidates` (time us, energy mJ per launch, any id), the one the objective picks with a
/// max slowdown: the least energy among those within `slowdown` of the fastest time; candidates
/// without an energy are left out unless none has one (then the fastest). `None` when empty.
pub fn least_energy_within<T: Copy>(candidates: &[(f64, Option<f64>, T)], slowdown: f64) -> Option<T> {
    let fastest = candidates.iter().map(|c| c.0).filter(|t| t.is_finite() && *t > 0.0).reduce(f64::min)?;
    let bound = fastest * (1.0 + slowdown);
    let within = candidates.iter().filter(|c| c.0 <= bound);
    let by_energy = within
        .clone()
        .filter_map(|c| c.1.filter(|e| *e > 0.0).map(|e| (e, c.0, c.2)))
        .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
    match by_energy {
        Some((_, _, id)) => Some(id),
        None => within.min_by(|a, b| a.0.total_cmp(&b.0)).map(|c| c.2),
    }
}

/// The time-energy Pareto front of `points` (time, energy): the indices of the points no other
/// point beats on both (no faster point uses less or equal energy), fastest first.
pub fn pareto_front(points: &[(f64, f64)]) -> Vec<usize> {
    let mut order: Vec<usize> =
        (0..points.len()).filter(|&i| points[i].0.is_finite() && points[i].1.is_finite()).collect();
    order.sort_by(|&a, &b| points[a].0.total_cmp(&points[b].0).then(points[a].1.total_cmp(&points[b].1)));
    let mut front = Vec::new();
    let mut least = f64::INFINITY;
    for i in order {
        if points[i].1 < least {
            least = points[i].1;
            front.push(i);
        }
    }
    front
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_bad_names_say_what_is_allowed() {
        for r in Regime::ALL {
            assert_eq!(Regime::parse(r.name()), Ok(r));
        }
        assert_eq!(Regime::parse(""), Ok(Regime::Burst), "senders that predate regimes");
        let e = Regime::parse("steady").unwrap_err();
        assert!(e.contains("\"steady\"") && e.contains("burst or sustained"), "{e}");
        for o in [Objective::Time, Objective::Energy, Objective::Edp] {
            assert_eq!(o.name().parse::<Objective>(), Ok(o));
        }
        let e = "power".parse::<Objective>().unwrap_err();
        assert!(e.contains("time, energy or edp"), "{e}");
    }

    #[test]
    fn scores_need_the_energy_they_use() {
        assert_eq!(Objective::Time.score(10.0, None), Some(10.0));
        assert_eq!(Objective::Energy.score(10.0, None), None);
        assert_eq!(Objective::Energy.score(10.0, Some(0.0)), None, "unknown energy is not free");
        assert_eq!(Objective::Energy.score(10.0, Some(2.5)), Some(2.5));
        assert_eq!(Objective::Edp.score(10.0, Some(2.5)), Some(25.0));
        assert_eq!(Objective::Time.score(0.0, Some(1.0)), None);
    }

    #[test]
    fn slowdowns_parse_as_percent_or_fraction_within_range() {
        assert!((parse_slowdown("3%").unwrap() - 0.03).abs() < 1e-12);
        assert!((parse_slowdown("0.03").unwrap() - 0.03).abs() < 1e-12);
        assert_eq!(parse_slowdown("0").unwrap(), 0.0);
        for bad in ["-1%", "150%", "1.5", "x", "NaN"] {
            let e = parse_slowdown(bad).unwrap_err();
            assert!(e.contains(bad), "{bad}: {e}");
        }
        assert!(parse_slowdown("150%").unwrap_err().contains("0 ..= 100%"));
    }

    #[test]
    fn the_least_energy_within_the_slowdown_wins() {
        // (time, energy, id): 2 is 2% slower and uses a third less; 3 is 10% slower and less still.
        let c = [(100.0, Some(15.0), 1), (102.0, Some(10.0), 2), (110.0, Some(8.0), 3), (101.0, None, 4)];
        assert_eq!(least_energy_within(&c, 0.03), Some(2));
        assert_eq!(least_energy_within(&c, 0.0), Some(1));
        assert_eq!(least_energy_within(&c, 0.2), Some(3));
        // No energies at all: the fastest.
        assert_eq!(least_energy_within(&[(5.0, None, 'a'), (4.0, None, 'b')], 0.5), Some('b'));
        assert_eq!(least_energy_within::<u8>(&[], 0.1), None);
    }

    #[test]
    fn the_front_keeps_what_nothing_beats_on_both() {
        let p = [(10.0, 5.0), (11.0, 4.0), (12.0, 4.5), (9.0, 7.0), (13.0, 3.0), (10.0, 6.0)];
        assert_eq!(pareto_front(&p), vec![3, 0, 1, 4]);
        assert!(pareto_front(&[]).is_empty());
    }
}
