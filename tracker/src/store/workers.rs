//! Queries on `workers`.

use super::{Exec, Json, from_row, json, on};
use crate::error::Result;
use crate::model::{Device, Registration, WorkerId};

from_row! {
    /// A registered worker with what it holds and has reported.
    #[derive(Clone, Debug)]
    pub(crate) struct WorkerRow {
        pub(crate) id: WorkerId,
        pub(crate) name: String,
        pub(crate) device_class: String,
        pub(crate) device: Json<Device> as String,
        /// `name@version` of each template it implements.
        pub(crate) templates: Json<Vec<String>> as String,
        pub(crate) registered_ms: i64,
        pub(crate) last_seen_ms: i64,
        pub(crate) state: String,
        /// Tasks it holds now.
        pub(crate) leased: u32 as i64,
        /// Records it reported (records the tracker wrote for it, `device_lost`, do not count).
        pub(crate) reported: i64,
        /// Its latest timing of the shared reference kernel, microseconds; `None` until it sent one.
        pub(crate) reference_us: Option<f64>,
        /// Whether its last heartbeat found it drifting from its peers (so that the warning is logged
        /// when it becomes flagged, not at every heartbeat).
        pub(crate) drift_flagged: bool,
        /// The token it registered with; its calls must carry the same one.
        pub(crate) token_id: Option<i64>,
        /// Why an admin quarantined it, if one did.
        pub(crate) quarantined: Option<String>,
    }
}

/// `SELECT` of [`WorkerRow`]s followed by `$tail`.
macro_rules! select_workers {
    ($tail:literal) => {
        concat!(
            "SELECT w.*,
                (SELECT COUNT(*) FROM tasks t WHERE t.worker_id = w.id AND t.state = 'leased') AS leased,
                (SELECT COUNT(*) FROM records r WHERE r.worker_id = w.id AND r.status != 'device_lost') AS reported
             FROM workers w",
            $tail
        )
    };
}

/// `name@version` of every template some registered worker of `device_class` implements (online or
/// not: a job waits for its workers), sorted.
pub(crate) async fn class_templates(e: impl Into<Exec<'_>>, device_class: &str) -> Result<Vec<String>> {
    Ok(on!(e, |c, pg| sqlx::query_scalar(if pg {
        "SELECT DISTINCT t.value FROM workers w, json_array_elements_text(w.templates::json) AS t (value)
         WHERE w.device_class = $1 ORDER BY 1"
    } else {
        "SELECT DISTINCT t.value FROM workers w, json_each(w.templates) t WHERE w.device_class = $1 ORDER BY 1"
    })
    .bind(device_class)
    .fetch_all(c)
    .await)?)
}

/// Registers a new worker; returns its id.
pub(crate) async fn insert(
    e: impl Into<Exec<'_>>,
    r: &Registration,
    token_id: Option<i64>,
    now: i64,
) -> Result<WorkerId> {
    Ok(on!(e, |c, pg| sqlx::query_scalar(
        "INSERT INTO workers (name, device_class, device, templates, registered_ms, last_seen_ms, state, token_id)
         VALUES ($1, $2, $3, $4, $5, $5, 'online', $6)
         RETURNING id",
    )
    .bind(&r.name)
    .bind(&r.device.target.class_key)
    .bind(json(&r.device))
    .bind(json(&r.templates.iter().map(|t| t.spelled()).collect::<Vec<_>>()))
    .bind(now)
    .bind(token_id)
    .fetch_one(c)
    .await)?)
}

/// Refreshes worker `id` from a new registration (it keeps its id and leases); false when unknown.
/// Its reference timing is forgotten: the new session (possibly on another GPU, or after a reset)
/// has not timed the reference kernel yet.
pub(crate) async fn reregister(e: impl Into<Exec<'_>>, id: WorkerId, r: &Registration, now: i64) -> Result<bool> {
    let done = on!(e, |c, pg| sqlx::query(
        "UPDATE workers SET name = $2, device_class = $3, device = $4, templates = $5, last_seen_ms = $6,
                            state = 'online', reference_us = NULL, drift_flagged = FALSE
         WHERE id = $1",
    )
    .bind(id)
    .bind(&r.name)
    .bind(&r.device.target.class_key)
    .bind(json(&r.device))
    .bind(json(&r.templates.iter().map(|t| t.spelled()).collect::<Vec<_>>()))
    .bind(now)
    .execute(c)
    .await
    .map(|r| r.rows_affected()))?;
    Ok(done == 1)
}

/// The worker `id`.
pub(crate) async fn get(e: impl Into<Exec<'_>>, id: WorkerId) -> Result<Option<WorkerRow>> {
    Ok(on!(e, |c, pg| sqlx::query_as(select_workers!(" WHERE w.id = $1")).bind(id).fetch_optional(c).await)?)
}

/// The worker `id` without its counts (`leased` and `reported` read 0): what a dispatch call needs
/// (its token, class, templates, quarantine). [`get`] counts the worker's records, a walk that
/// grows with everything it ever reported; a call of a busy worker must not pay for that.
pub(crate) async fn get_lean(e: impl Into<Exec<'_>>, id: WorkerId) -> Result<Option<WorkerRow>> {
    Ok(on!(e, |c, pg| sqlx::query_as(
        "SELECT w.*, CAST(0 AS BIGINT) AS leased, CAST(0 AS BIGINT) AS reported FROM workers w WHERE w.id = $1"
    )
    .bind(id)
    .fetch_optional(c)
    .await)?)
}

/// Every worker, by id.
pub(crate) async fn list(e: impl Into<Exec<'_>>) -> Result<Vec<WorkerRow>> {
    Ok(on!(e, |c, pg| sqlx::query_as(select_workers!(" ORDER BY w.id")).fetch_all(c).await)?)
}

/// Records that the worker was heard from at `now`, in `state`; false when unknown.
async fn seen(e: impl Into<Exec<'_>>, id: WorkerId, now: i64, state: &str) -> Result<bool> {
    let done = on!(e, |c, pg| sqlx::query("UPDATE workers SET last_seen_ms = $2, state = $3 WHERE id = $1")
        .bind(id)
        .bind(now)
        .bind(state)
        .execute(c)
        .await
        .map(|r| r.rows_affected()))?;
    Ok(done == 1)
}

/// Records that each worker of `seen` was heard from at its time (heartbeats, leases and reports
/// noted in memory, stored later by the reaper): online again, unless it was heard from later
/// than that (it left since). One statement for them all: the reaper stores every live worker's.
pub(crate) async fn seen_at(e: impl Into<Exec<'_>>, seen: &[(WorkerId, i64)]) -> Result<()> {
    if seen.is_empty() {
        return Ok(());
    }
    on!(e, |c, pg| {
        sqlx::query(if pg {
        "UPDATE workers SET last_seen_ms = x.seen, state = 'online'
         FROM (SELECT (value ->> 0)::bigint AS id, (value ->> 1)::bigint AS seen FROM json_array_elements($1::json)) AS x
         WHERE workers.id = x.id AND workers.last_seen_ms < x.seen"
    } else {
        "UPDATE workers SET last_seen_ms = value ->> '$[1]', state = 'online'
         FROM json_each($1)
         WHERE workers.id = value ->> '$[0]' AND workers.last_seen_ms < value ->> '$[1]'"
    })
    .bind(json(seen))
    .execute(c)
    .await
    .map(|r| r.rows_affected())
    })?;
    Ok(())
}

/// How many workers of `device_class` are online: how many batches a job with a trial budget
/// keeps in flight (one worker per GPU).
pub(crate) async fn online_in_class(e: impl Into<Exec<'_>>, device_class: &str) -> Result<u32> {
    let n: i64 = on!(e, |c, pg| sqlx::query_scalar(
        "SELECT COUNT(*) FROM workers WHERE device_class = $1 AND state = 'online'"
    )
    .bind(device_class)
    .fetch_one(c)
    .await)?;
    Ok(u32::try_from(n).unwrap_or(u32::MAX))
}

/// Marks online workers not heard from since `before` offline; returns them.
pub(crate) async fn mark_offline(e: impl Into<Exec<'_>>, before: i64) -> Result<Vec<WorkerId>> {
    Ok(on!(e, |c, pg| sqlx::query_scalar(
        "UPDATE workers SET state = 'offline' WHERE state = 'online' AND last_seen_ms < $1 RETURNING id",
    )
    .bind(before)
    .fetch_all(c)
    .await)?)
}

/// Marks worker `id` offline (it left); false when unknown.
pub(crate) async fn set_offline(e: impl Into<Exec<'_>>, id: WorkerId, now: i64) -> Result<bool> {
    seen(e, id, now, "offline").await
}

/// Stores the worker's latest timing of the reference kernel.
pub(crate) async fn set_reference(e: impl Into<Exec<'_>>, id: WorkerId, reference_us: f64) -> Result<()> {
    on!(e, |c, pg| sqlx::query("UPDATE workers SET reference_us = $2 WHERE id = $1")
        .bind(id)
        .bind(reference_us)
        .execute(c)
        .await
        .map(|r| r.rows_affected()))?;
    Ok(())
}

/// Stores whether the worker was last found drifting.
pub(crate) async fn set_drift_flagged(e: impl Into<Exec<'_>>, id: WorkerId, flagged: bool) -> Result<()> {
    on!(e, |c, pg| sqlx::query("UPDATE workers SET drift_flagged = $2 WHERE id = $1")
        .bind(id)
        .bind(flagged)
        .execute(c)
        .await
        .map(|r| r.rows_affected()))?;
    Ok(())
}

/// Reference timings of the online workers of `device_class` that have one.
pub(crate) async fn class_references(e: impl Into<Exec<'_>>, device_class: &str) -> Result<Vec<f64>> {
    Ok(on!(e, |c, pg| sqlx::query_scalar(
        "SELECT reference_us FROM workers
         WHERE device_class = $1 AND state = 'online' AND reference_us IS NOT NULL",
    )
    .bind(device_class)
    .fetch_all(c)
    .await)?)
}

/// Quarantines worker `id` with `reason`; false when unknown.
pub(crate) async fn quarantine(e: impl Into<Exec<'_>>, id: WorkerId, reason: &str) -> Result<bool> {
    let done = on!(e, |c, pg| sqlx::query("UPDATE workers SET quarantined = $2 WHERE id = $1")
        .bind(id)
        .bind(reason)
        .execute(c)
        .await
        .map(|r| r.rows_affected()))?;
    Ok(done == 1)
}
