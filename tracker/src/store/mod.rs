//! The SQLite store, one function per query. The database is the source of truth: everything the
//! tracker knows about jobs, tasks and records can be rebuilt from it after a crash.
//!
//! Functions take any executor (the pool for reads, `&mut *tx` inside a write) and return the
//! tracker's [`Error`](crate::error::Error), so a database failure reaches callers as a plain
//! "internal" status with the detail only in the log.

pub(crate) mod classes;
pub(crate) mod jobs;
pub(crate) mod records;
pub(crate) mod tasks;
pub(crate) mod workers;
pub(crate) mod workloads;

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

/// How long a statement waits for SQLite's write lock before failing. Writes are serialised by the
/// tracker itself, so this only matters when another process (a backup, the sqlite3 shell) holds it.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections in the pool: reads (snapshots, watches, exports) run beside the one writer.
const MAX_CONNECTIONS: u32 = 8;

/// Opens (creating if needed) the database at `path` and applies the migrations.
pub(crate) async fn open(path: &Path) -> anyhow::Result<SqlitePool> {
    let options = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        // FULL: a report acknowledged to a worker must survive a power cut, since the worker
        // will not send it again.
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(BUSY_TIMEOUT)
        .foreign_keys(true);
    let pool = SqlitePoolOptions::new()
        .max_connections(MAX_CONNECTIONS)
        .connect_with(options)
        .await
        .with_context(|| format!("opening database {}", path.display()))?;
    sqlx::migrate!("../migrations")
        .run(&pool)
        .await
        .with_context(|| format!("applying migrations to {}", path.display()))?;
    Ok(pool)
}

/// A JSON column, decoded with `#[sqlx(try_from = "String")]`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Json<T>(pub(crate) T);

impl<T: DeserializeOwned> TryFrom<String> for Json<T> {
    type Error = serde_json::Error;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        serde_json::from_str(&s).map(Json)
    }
}

/// JSON text of a value for a JSON column or a `json_each` parameter.
pub(crate) fn json<T: Serialize + ?Sized>(value: &T) -> String {
    // Only plain data (numbers, strings, maps with string keys) is stored, which always serialises.
    serde_json::to_string(value).unwrap_or_else(|_| "null".to_owned())
}
