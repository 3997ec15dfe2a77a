//! How a tracker runs.

use std::path::PathBuf;
use std::time::Duration;

/// The longest lease: a lost worker's tasks wait this long, and deadlines must stay far from the
/// clock's limits.
const MAX_LEASE: Duration = Duration::from_secs(24 * 60 * 60);

/// Settings of a tracker.
#[derive(Clone, Debug, PartialEq)]
pub struct TrackerConfig {
    /// The database: a SQLite file (a path or `sqlite://PATH`; created, and its migrations applied,
    /// when missing) or a PostgreSQL database (`postgres://` or `postgresql://` URL, migrated at
    /// start), which several trackers may share.
    pub db: PathBuf,
    /// How long a worker holds a task without a heartbeat before it goes back to the queue.
    pub lease: Duration,
    /// How often workers are asked to heartbeat; well inside `lease`, so one late heartbeat does
    /// not cost a lease.
    pub heartbeat: Duration,
    /// Leases of one task that may expire before it is recorded as `device_lost`, so that a kernel
    /// that kills every worker running it cannot stall its job.
    pub max_attempts: u32,
    /// TLS for the listener; `None` serves plain HTTP/2.
    pub tls: Option<ServerTls>,
    /// Serve on a non-loopback address without tokens or without TLS. Off by default: a tracker
    /// reachable from the network takes work only from callers it knows, over an encrypted link.
    pub insecure: bool,
    /// Jobs one token (or, on a tracker without tokens, everyone together) may submit per second
    /// on average; bursts of [`SUBMIT_BURST`] pass at once.
    pub submit_rate: f64,
    /// Use the record packs this build ships as the model tuner's transfer prior (parsed once,
    /// in the background from the tracker's start, and read from memory), so that a new
    /// database starts warm.
    pub prior_pack: bool,
    /// On shutdown, how long calls already in flight may take to finish once the listener stopped
    /// accepting; calls still running then are dropped, their transactions rolled back (nothing
    /// they did was acknowledged), so that a supervisor's stop timeout is never reached.
    pub shutdown_grace: Duration,
    /// Prune superseded records of jobs that ended more than this many days ago (see
    /// `tensortune-tracker prune`), at start and every hour; `None` keeps every record.
    pub retain_days: Option<u32>,
}

/// The longest shutdown grace: beyond it a supervisor would long have killed the process.
const MAX_SHUTDOWN_GRACE: Duration = Duration::from_secs(600);

/// Submissions a token may make at once before [`TrackerConfig::submit_rate`] applies.
pub const SUBMIT_BURST: u32 = 50;

/// The listener's certificate and key, and the CA that signs client certificates when workers
/// must present one (mutual TLS), all PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct ServerTls {
    /// The tracker's certificate chain.
    pub cert_pem: Vec<u8>,
    /// The certificate's private key.
    pub key_pem: Vec<u8>,
    /// With a CA, `Dispatch` callers (workers) must present a client certificate it signed;
    /// `Tuning` callers may.
    pub client_ca_pem: Option<Vec<u8>>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("ServerTls")
            .field("cert_pem", &format_args!("{} bytes", self.cert_pem.len()))
            .field("client_ca", &self.client_ca_pem.is_some())
            .finish_non_exhaustive()
    }
}

impl Default for TrackerConfig {
    fn default() -> Self {
        TrackerConfig {
            db: PathBuf::from("tensortune.db"),
            lease: Duration::from_secs(30),
            heartbeat: Duration::from_secs(5),
            max_attempts: 3,
            tls: None,
            insecure: false,
            submit_rate: 5.0,
            prior_pack: true,
            shutdown_grace: Duration::from_secs(10),
            retain_days: None,
        }
    }
}

impl TrackerConfig {
    /// Checks that the settings make sense together.
    pub(crate) fn validate(&self) -> anyhow::Result<()> {
        crate::store::Location::parse(&self.db)?;
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
        if !(self.submit_rate.is_finite() && self.submit_rate > 0.0 && self.submit_rate <= 1e6) {
            anyhow::bail!(
                "submit rate {} is out of range; use more than 0 and at most 1e6 jobs per second",
                self.submit_rate
            );
        }
        if let Some(days) = self.retain_days {
            check_retain_days(days)?;
        }
        if self.shutdown_grace > MAX_SHUTDOWN_GRACE {
            anyhow::bail!(
                "shutdown grace {:?} is out of range; use 0 ..= {} s (10 s is the default)",
                self.shutdown_grace,
                MAX_SHUTDOWN_GRACE.as_secs()
            );
        }
        Ok(())
    }
}

/// The longest retention `--retain-days` takes (about 100 years).
const MAX_RETAIN_DAYS: u32 = 36_500;

/// Fails unless `days` is a retention `--retain-days` takes.
pub(crate) fn check_retain_days(days: u32) -> anyhow::Result<()> {
    if days > MAX_RETAIN_DAYS {
        anyhow::bail!("--retain-days {days} is out of range; use 0 ..= {MAX_RETAIN_DAYS}");
    }
    Ok(())
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
            TrackerConfig { submit_rate: 0.0, ..ok.clone() },
            TrackerConfig { submit_rate: f64::NAN, ..ok.clone() },
            TrackerConfig { shutdown_grace: Duration::from_secs(601), ..ok.clone() },
        ];
        for config in bad {
            assert!(config.validate().is_err(), "{config:?}");
        }
    }
}
