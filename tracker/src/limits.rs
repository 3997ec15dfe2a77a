//! Per-token rate limits: a token bucket per caller, so one script in a loop cannot flood the
//! tracker with jobs while everyone else waits.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use crate::error::{Error, Result};

/// Buckets kept at most; past this the fullest (idle) ones are forgotten, which only ever lets a
/// caller through sooner.
const MAX_BUCKETS: usize = 10_000;

/// Token buckets keyed by the caller's token (`None`: everyone on a tracker without tokens).
pub(crate) struct RateLimit {
    /// Average admissions per second.
    rate: f64,
    /// Admissions that may come at once.
    burst: f64,
    /// What the limit is on, for messages ("job submissions").
    what: &'static str,
    buckets: Mutex<HashMap<Option<i64>, Bucket>>,
}

#[derive(Clone, Copy, Debug)]
struct Bucket {
    level: f64,
    at: Instant,
}

impl RateLimit {
    /// `rate` per second on average, `burst` at once.
    pub(crate) fn new(what: &'static str, rate: f64, burst: u32) -> RateLimit {
        RateLimit { rate, burst: f64::from(burst.max(1)), what, buckets: Mutex::new(HashMap::new()) }
    }

    /// Admits one call of `key` at `now`, or says how long to wait.
    pub(crate) fn admit(&self, key: Option<i64>, now: Instant) -> Result<()> {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if buckets.len() >= MAX_BUCKETS && !buckets.contains_key(&key) {
            let burst = self.burst;
            buckets.retain(|_, b| b.level + now.duration_since(b.at).as_secs_f64() * self.rate < burst);
        }
        let bucket = buckets.entry(key).or_insert(Bucket { level: self.burst, at: now });
        let level = (bucket.level + now.saturating_duration_since(bucket.at).as_secs_f64() * self.rate).min(self.burst);
        if level < 1.0 {
            let wait = (1.0 - level) / self.rate;
            return Err(Error::Exhausted(format!(
                "too many {}: this token may make {} per second ({} at once); retry in {wait:.1} s",
                self.what, self.rate, self.burst
            )));
        }
        *bucket = Bucket { level: level - 1.0, at: now };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_burst_passes_then_the_rate_holds_per_token() {
        let limit = RateLimit::new("job submissions", 2.0, 3);
        let t0 = Instant::now();
        for _ in 0..3 {
            limit.admit(Some(1), t0).unwrap();
        }
        let e = limit.admit(Some(1), t0).unwrap_err().to_string();
        assert!(e.contains("job submissions") && e.contains("retry in 0.5 s"), "{e}");
        // Another token has its own bucket.
        limit.admit(Some(2), t0).unwrap();
        // Half a second later one more fits, not two.
        let later = t0 + Duration::from_millis(500);
        limit.admit(Some(1), later).unwrap();
        assert!(limit.admit(Some(1), later).is_err());
        // Idle for long, the bucket holds no more than the burst.
        let much_later = t0 + Duration::from_secs(60);
        for _ in 0..3 {
            limit.admit(Some(1), much_later).unwrap();
        }
        assert!(limit.admit(Some(1), much_later).is_err());
    }
}
