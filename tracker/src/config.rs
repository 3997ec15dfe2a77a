//! How a tracker runs.

use std::path::PathBuf;
use std::time::Duration;

/// The longest lease: a lost worker's tasks wait this long, and deadlines must stay far from the
/// clock's limits.
const MAX_LEASE: Duration = Duration::from_secs(24 * 60 * 60);

/// Settings of a tracker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrackerConfig {
    /// The SQLite database file; created, and its migrations applied, when missing.
    pub db: PathBuf,
    /// How long a worker holds a task without a heartbeat before it goes back to the queue.
    pub lease: Duration,
    /// How often workers are asked to heartbeat; well inside `lease`, so one late heartbeat does
    /// not cost a lease.
    pub heartbeat: Duration,
    /// Leases of one task that may expire before it is recorded as `device_lost`, so that a kernel
    /// that kills every worker running it cannot stall its job.
    pub max_attempts: u32,
}

impl Default for TrackerConfig {
    fn default() -> Self {
        TrackerConfig {
            db: PathBuf::from("tensortune.db"),
            lease: Duration::from_secs(30),
            heartbeat: Duration::from_secs(5),
            max_attempts: 3,
        }
    }
}

impl TrackerConfig {
    /// Checks that the settings make sense together.
    pub(crate) fn validate(&self) -> anyhow::Result<()> {
        if self.lease < Duration::from_millis(10) || self.lease > MAX_LEASE {
            anyhow::bail!("lease {:?} is out of range; use 10 ms ..= 1 day (30 s is the default)", self.lease);
        }
        if self.heartbeat.is_zero() || self.heartbeat >= self.lease {
            anyhow::bail!(
                "heartbeat {:?} must be positive and shorter than the lease {:?}; a third of the lease or less is safe",
                self.heartbeat,
                self.lease
            );
        }
        if self.max_attempts == 0 {
            anyhow::bail!("max_attempts 0 would record every task as lost; use 1 or more (3 is the default)");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_nonsense_is_refused() {
        let ok = TrackerConfig::default();
        ok.validate().unwrap();
        assert_eq!((ok.lease.as_secs(), ok.heartbeat.as_secs(), ok.max_attempts), (30, 5, 3));
        let bad = [
            TrackerConfig { heartbeat: ok.lease, ..ok.clone() },
            TrackerConfig { heartbeat: Duration::ZERO, ..ok.clone() },
            TrackerConfig { lease: Duration::from_millis(1), ..ok.clone() },
            TrackerConfig { lease: Duration::from_secs(u64::MAX), ..ok.clone() },
            TrackerConfig { max_attempts: 0, ..ok.clone() },
        ];
        for config in bad {
            assert!(config.validate().is_err(), "{config:?}");
        }
    }
}
