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

use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Connection, SqlitePool};

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
        .after_release(|conn, _| {
            Box::pin(async move {
                // The ping runs after the rollback a dropped transaction queued. When a COMMIT
                // failed (disk full, an I/O error, a file-size limit) SQLite may have rolled the
                // transaction back itself; sqlx's ROLLBACK then fails and the connection goes on
                // believing it is inside a transaction, refusing every later BEGIN: one failed
                // write would stop every write after it. Such a connection is closed instead.
                conn.ping().await?;
                Ok(!conn.is_in_transaction())
            })
        })
        .connect_with(options)
        .await
        .map_err(|e| unusable(path, "opening", e))?;
    sqlx::migrate!("../migrations").run(&pool).await.map_err(|e| match e {
        sqlx::migrate::MigrateError::Execute(e) | sqlx::migrate::MigrateError::ExecuteMigration(e, _) => {
            unusable(path, "applying migrations to", e)
        }
        e => anyhow::Error::new(e).context(format!("applying migrations to {}", path.display())),
    })?;
    // A database the tracker can read but not write would take jobs and then refuse every report:
    // take the write lock once (changing nothing) so that it refuses to start instead.
    let probe = async {
        let mut conn = pool.acquire().await?;
        sqlx::query("BEGIN IMMEDIATE").execute(&mut *conn).await?;
        sqlx::query("ROLLBACK").execute(&mut *conn).await?;
        Ok::<_, sqlx::Error>(())
    };
    probe.await.map_err(|e| unusable(path, "writing to", e))?;
    Ok(pool)
}

/// The start-up error for a database file that cannot be used, naming the file and, for the
/// failures an operator can fix (corrupted, read-only, full, unreadable), what to do.
fn unusable(path: &Path, doing: &str, e: sqlx::Error) -> anyhow::Error {
    let file = path.display();
    let code = match &e {
        sqlx::Error::Database(db) => db.code().and_then(|c| c.parse::<i64>().ok()).map(|c| c & 0xff),
        _ => None,
    };
    let hint = match code {
        Some(11 | 26) => format!(
            "database {file} is corrupted or not a tensortune database; move it away and restore it from a \
             backup (the tracker does not repair or overwrite it)"
        ),
        Some(8) => format!(
            "database {file} is read-only; the tracker must write every record it acknowledges: make the file, \
             its -wal and -shm files and its directory writable"
        ),
        Some(13) => format!("the disk holding database {file} is full; free space and start again"),
        Some(14) => format!(
            "database {file} cannot be opened for writing (a missing or read-only directory, or no permission); \
             the tracker needs to write the file and create its -wal and -shm files beside it"
        ),
        _ => return anyhow::Error::new(e).context(format!("{doing} database {file}")),
    };
    anyhow::Error::new(e).context(hint)
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
