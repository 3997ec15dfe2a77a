//! Tuners: which configs of a workload's valid space to measure next.
//!
//! A tuner is rebuilt from the job's seed and the valid configs whenever the tracker needs it (at
//! submit, and after a restart), and it is told which configs already have a task: everything it
//! proposes follows from the database, so a restarted tracker continues exactly where it stopped.
//! Model-guided tuners (issue #5) implement the same trait; they would additionally read the
//! workload's records to rank what is left.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use rand::SeedableRng;
use rand::rngs::Xoshiro256PlusPlus;
use rand::seq::SliceRandom;

/// The search strategies a job can name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, sqlx::Type)]
#[sqlx(rename_all = "lowercase")]
pub(crate) enum TunerKind {
    /// A seeded random permutation of the valid configs.
    Random,
    /// The valid configs in index order.
    Grid,
}

impl TunerKind {
    /// Every kind, for error messages.
    pub(crate) const ALL: [TunerKind; 2] = [TunerKind::Random, TunerKind::Grid];

    /// Lowercase name, as requested and stored.
    pub(crate) fn name(self) -> &'static str {
        match self {
            TunerKind::Random => "random",
            TunerKind::Grid => "grid",
        }
    }

    /// A tuner over `valid` (config indices in index order) for workload `workload_idx` of a job
    /// seeded with `seed`.
    pub(crate) fn build(self, valid: Arc<[u64]>, seed: u64, workload_idx: u32) -> Box<dyn Tuner> {
        match self {
            TunerKind::Random => Box::new(Random::new(&valid, seed, workload_idx)),
            TunerKind::Grid => Box::new(Grid { valid }),
        }
    }
}

impl fmt::Display for TunerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for TunerKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        TunerKind::ALL.into_iter().find(|k| k.name() == s).ok_or_else(|| {
            let names: Vec<_> = TunerKind::ALL.iter().map(|k| k.name()).collect();
            format!("unknown tuner {s:?}; known: {}", names.join(", "))
        })
    }
}

/// A search strategy over one workload's valid configs.
pub(crate) trait Tuner: Send + Sync {
    /// Up to `n` config indices to measure next, none of which `taken` holds. Fewer than `n` only
    /// when the space has no more.
    fn propose(&self, taken: &dyn Fn(u64) -> bool, n: usize) -> Vec<u64>;
}

/// Measures configs in index order.
struct Grid {
    valid: Arc<[u64]>,
}

impl Tuner for Grid {
    fn propose(&self, taken: &dyn Fn(u64) -> bool, n: usize) -> Vec<u64> {
        self.valid.iter().copied().filter(|c| !taken(*c)).take(n).collect()
    }
}

/// Measures configs in a seeded random order.
struct Random {
    /// The permutation, fixed by the seed. A named generator rather than `StdRng`, whose algorithm
    /// may change between rand releases; and since proposals skip what is taken, even a changed
    /// order would never repeat or lose a config.
    order: Vec<u64>,
}

impl Random {
    fn new(valid: &[u64], seed: u64, workload_idx: u32) -> Random {
        // Each workload of a job gets its own order; mixing the index in keeps them apart.
        let stream = seed ^ u64::from(workload_idx).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(stream);
        let mut order = valid.to_vec();
        order.shuffle(&mut rng);
        Random { order }
    }
}

impl Tuner for Random {
    fn propose(&self, taken: &dyn Fn(u64) -> bool, n: usize) -> Vec<u64> {
        self.order.iter().copied().filter(|c| !taken(*c)).take(n).collect()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    fn taken_in(set: &HashSet<u64>) -> impl Fn(u64) -> bool + '_ {
        move |c| set.contains(&c)
    }

    fn valid() -> Arc<[u64]> {
        (0..200u64).map(|i| i * 3).collect()
    }

    #[test]
    fn grid_walks_in_index_order_skipping_taken() {
        let tuner = TunerKind::Grid.build(valid(), 1, 0);
        let taken: HashSet<u64> = [0, 6].into();
        assert_eq!(tuner.propose(&taken_in(&taken), 3), vec![3, 9, 12]);
    }

    #[test]
    fn random_is_a_seeded_permutation() {
        let a = TunerKind::Random.build(valid(), 42, 0);
        let b = TunerKind::Random.build(valid(), 42, 0);
        let none = HashSet::new();
        let all = a.propose(&taken_in(&none), 1000);
        assert_eq!(all, b.propose(&taken_in(&none), 1000));
        let mut sorted = all.clone();
        sorted.sort();
        assert_eq!(sorted, valid().to_vec());
        assert_ne!(all, valid().to_vec(), "a shuffle of 200 items left them in order");
        assert_ne!(all, TunerKind::Random.build(valid(), 42, 1).propose(&taken_in(&none), 1000));
        assert_ne!(all, TunerKind::Random.build(valid(), 43, 0).propose(&taken_in(&none), 1000));
    }

    #[test]
    fn proposals_continue_from_what_is_taken() {
        let tuner = TunerKind::Random.build(valid(), 7, 2);
        let mut taken = HashSet::new();
        let mut seen = Vec::new();
        while taken.len() < 200 {
            let next = tuner.propose(&taken_in(&taken), 17);
            assert!(!next.is_empty());
            taken.extend(next.iter().copied());
            seen.extend(next);
        }
        // Proposing in batches gives the same order as proposing everything at once.
        assert_eq!(seen, tuner.propose(&taken_in(&HashSet::new()), 1000));
        assert!(tuner.propose(&taken_in(&taken), 5).is_empty());
        assert_eq!("grid".parse::<TunerKind>(), Ok(TunerKind::Grid));
        assert!("bayes".parse::<TunerKind>().unwrap_err().contains("known: random, grid"));
    }
}
