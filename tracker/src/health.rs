//! Health for supervisors and load balancers: liveness (the process answers) and readiness (the
//! store can be written and every migration this build knows is applied). The HTTP side serves
//! them as `/healthz` and `/readyz`; the gRPC port answers the standard health-checking protocol
//! (`grpc.health.v1.Health`), whose status follows readiness.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::store::{self, Pool};
use crate::tracker::Tracker;

/// How long the write probe waits for the database's write lock: a tracker whose writes would
/// wait longer than this is not ready (another process holds the lock, or the disk stalls).
const WRITE_PROBE_WAIT: Duration = Duration::from_secs(1);

/// A group commit of this tracker's own at most this long ago shows the database writable: the
/// write probe is skipped. Under load the committer holds the write lock almost without a gap, and
/// the probe's wait for it ran out on a tracker that was storing thousands of tasks a second (14 of
/// 27 load runs logged "not ready: database is locked", 2026-11-29): gRPC health then said
/// NOT_SERVING, and a balancer would have drained the busiest tracker. Twice the probe's own wait.
const RECENT_COMMIT: Duration = Duration::from_secs(2);

/// Bound on a whole readiness check, whatever the database does.
const CHECK_DEADLINE: Duration = Duration::from_secs(5);

/// How often the gRPC health status is brought in line with readiness.
const GRPC_PERIOD: Duration = Duration::from_secs(2);

/// The services whose gRPC health status follows readiness ("" is the server as a whole).
pub(crate) const SERVICES: [&str; 3] = ["", "tensortune.v1.Tuning", "tensortune.v1.Dispatch"];

/// `Ok` when the tracker can do its work: every migration applied and the database writable (a
/// commit of its own within [`RECENT_COMMIT`], else the write lock obtainable); else why not, in
/// words an operator can act on.
pub(crate) async fn ready(tracker: &Tracker) -> Result<(), String> {
    let last = *tracker.last_commit.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    match tokio::time::timeout(CHECK_DEADLINE, check(&tracker.pool, committed_lately(last, Instant::now()))).await {
        Ok(result) => result,
        Err(_) => Err(format!("the database did not answer within {} s", CHECK_DEADLINE.as_secs())),
    }
}

/// Whether a commit at `last` is recent enough at `now` to stand for the write probe.
fn committed_lately(last: Option<Instant>, now: Instant) -> bool {
    last.is_some_and(|t| now.saturating_duration_since(t) <= RECENT_COMMIT)
}

async fn check(pool: &Pool, committed_lately: bool) -> Result<(), String> {
    let applied: Vec<i64> = match pool {
        Pool::Sqlite(p) => sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success").fetch_all(p).await,
        Pool::Postgres(p) => {
            sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success").fetch_all(p).await
        }
    }
    .map_err(|e| format!("reading the applied migrations failed: {e}"))?;
    if let Some(missing) = known_versions(pool).into_iter().find(|v| !applied.contains(v)) {
        return Err(format!("migration {missing} is not applied; restart the tracker to apply it"));
    }
    if committed_lately {
        return Ok(());
    }
    write_probe(pool).await.map_err(|e| format!("the database cannot be written: {e}"))
}

/// The migration versions this build ships for the database at hand.
fn known_versions(pool: &Pool) -> Vec<i64> {
    match pool {
        Pool::Sqlite(_) => crate::store::migrations::SQLITE.iter().map(|m| m.0).collect(),
        Pool::Postgres(_) => crate::store::migrations::POSTGRES.iter().map(|m| m.0).collect(),
    }
}

/// Takes the database's write lock and lets it go, changing nothing.
async fn write_probe(pool: &Pool) -> sqlx::Result<()> {
    match pool {
        Pool::Sqlite(p) => {
            let mut conn = p.acquire().await?;
            let wait = format!("PRAGMA busy_timeout = {}", WRITE_PROBE_WAIT.as_millis());
            sqlx::query(sqlx::AssertSqlSafe(wait)).execute(&mut *conn).await?;
            let probed = async {
                sqlx::query("BEGIN IMMEDIATE").execute(&mut *conn).await?;
                sqlx::query("ROLLBACK").execute(&mut *conn).await.map(|_| ())
            }
            .await;
            // Back to the pool's own patience for the tracker's writes.
            let restore = format!("PRAGMA busy_timeout = {}", store::BUSY_TIMEOUT.as_millis());
            sqlx::query(sqlx::AssertSqlSafe(restore)).execute(&mut *conn).await?;
            probed
        }
        Pool::Postgres(p) => {
            let mut tx = p.begin().await?;
            let wait = format!("SET LOCAL lock_timeout = {}", WRITE_PROBE_WAIT.as_millis());
            sqlx::query(sqlx::AssertSqlSafe(wait)).execute(&mut *tx).await?;
            sqlx::query("LOCK TABLE jobs, tasks, records, workers IN ROW EXCLUSIVE MODE").execute(&mut *tx).await?;
            tx.rollback().await
        }
    }
}

/// Keeps the gRPC health status of [`SERVICES`] in line with readiness until `stop`, then marks
/// them not serving.
pub(crate) async fn report_grpc(tracker: Arc<Tracker>, reporter: HealthReporter, stop: CancellationToken) {
    let mut last = None;
    loop {
        let status = match ready(&tracker).await {
            Ok(()) => ServingStatus::Serving,
            Err(why) => {
                if last != Some(ServingStatus::NotServing) {
                    tracing::warn!(%why, "not ready");
                }
                ServingStatus::NotServing
            }
        };
        if last != Some(status) {
            for service in SERVICES {
                reporter.set_service_status(service, status).await;
            }
            last = Some(status);
        }
        tokio::select! {
            () = stop.cancelled() => break,
            () = tokio::time::sleep(GRPC_PERIOD) => {}
        }
    }
    for service in SERVICES {
        reporter.set_service_status(service, ServingStatus::NotServing).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_commit_stands_for_the_write_probe_only_while_it_is_recent() {
        let now = Instant::now() + Duration::from_secs(60);
        assert!(!committed_lately(None, now), "no commit yet: probe");
        assert!(committed_lately(Some(now), now));
        assert!(committed_lately(Some(now - RECENT_COMMIT), now));
        assert!(!committed_lately(Some(now - RECENT_COMMIT - Duration::from_millis(1)), now), "stale: probe");
        // A commit noted after `now` was read (another thread) is recent, not a panic.
        assert!(committed_lately(Some(now + Duration::from_secs(1)), now));
    }
}
