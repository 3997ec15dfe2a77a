//! Queries on `device_classes`.

use tensortune_kernels::Target;

use super::{Exec, Json, json, on};
use crate::error::Result;

/// Inserts a class, or refreshes its name and limits from the latest worker that registered it.
pub(crate) async fn upsert(e: impl Into<Exec<'_>>, target: &Target, now: i64) -> Result<()> {
    on!(e, |c, pg| sqlx::query(
        "INSERT INTO device_classes (key, name, arch, sm_count, target, created_ms, updated_ms)
         VALUES ($1, $2, $3, $4, $5, $6, $6)
         ON CONFLICT (key) DO UPDATE SET name = $2, arch = $3, sm_count = $4, target = $5, updated_ms = $6",
    )
    .bind(&target.class_key)
    .bind(&target.name)
    .bind(i64::from(target.arch))
    .bind(i64::from(target.sm_count))
    .bind(json(target))
    .bind(now)
    .execute(c)
    .await
    .map(|r| r.rows_affected()))?;
    Ok(())
}

/// Keys of every class some worker registered, sorted.
pub(crate) async fn keys(e: impl Into<Exec<'_>>) -> Result<Vec<String>> {
    Ok(on!(e, |c, pg| sqlx::query_scalar("SELECT key FROM device_classes ORDER BY key").fetch_all(c).await)?)
}

/// The limits of class `key`.
pub(crate) async fn target(e: impl Into<Exec<'_>>, key: &str) -> Result<Option<Target>> {
    let row: Option<(String,)> = on!(e, |c, pg| sqlx::query_as("SELECT target FROM device_classes WHERE key = $1")
        .bind(key)
        .fetch_optional(c)
        .await)?;
    row.map(|(text,)| Json::<Target>::try_from(text).map(|j| j.0)).transpose().map_err(|err| {
        crate::error::Error::Internal(format!("the stored limits of device class {key:?} are unreadable: {err}"))
    })
}
