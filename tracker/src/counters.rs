//! Counters of what happened since the tracker started, in memory: what the store cannot say
//! afterwards. The tracker owns them, dispatch and the lease reaper bump them, and the HTTP side
//! reads them for `/metrics`; they live apart from all three so none imports another for them.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of what happened since the tracker started (what the store cannot say afterwards).
#[derive(Default)]
pub(crate) struct Counters {
    /// Leases that ran out without a heartbeat (their tasks went back to the queue or were lost).
    pub(crate) leases_expired: AtomicU64,
    /// Reports stored.
    pub(crate) reports_stored: AtomicU64,
    /// Reports acknowledged as duplicates.
    pub(crate) reports_duplicate: AtomicU64,
    /// Reports stored but not trusted.
    pub(crate) reports_untrusted: AtomicU64,
}

impl Counters {
    /// Adds one to `counter`.
    pub(crate) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}
