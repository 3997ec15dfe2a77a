//! `tensortune-tracker backup --to FILE`: a consistent copy of a SQLite database while a tracker
//! serves it. `VACUUM INTO` reads the database inside one read transaction (WAL mode lets the
//! tracker go on writing meanwhile), so the copy holds exactly the transactions committed when it
//! began: every record acknowledged before the backup started, and no half of any write. The copy
//! is then opened and checked (`PRAGMA integrity_check`) before it is reported good.
//!
//! PostgreSQL databases are backed up with `pg_dump` (see docs/operations.md): the tracker has
//! nothing to add to it.

use std::path::{Path, PathBuf};

use anyhow::Context;
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Connection};

use crate::store::{self, Location};

/// What a backup wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackupSummary {
    /// The copy.
    pub path: PathBuf,
    /// Its size, bytes.
    pub bytes: u64,
    /// Records it holds.
    pub records: i64,
    /// Jobs it holds.
    pub jobs: i64,
}

/// Copies the SQLite database `db` names to the new file `to` (which must not exist) and checks
/// the copy. Safe while a tracker serves `db`.
pub async fn backup(db: &Path, to: &Path) -> anyhow::Result<BackupSummary> {
    let path = match Location::parse(db)? {
        Location::Sqlite(path) => path,
        Location::Postgres(_) => anyhow::bail!(
            "--db {} is PostgreSQL: back it up with pg_dump (pg_dump --format=custom --file=FILE URL) and restore \
             with pg_restore; see docs/operations.md",
            store::redact(&db.to_string_lossy())
        ),
    };
    if !path.exists() {
        anyhow::bail!("database {} does not exist; give the --db the tracker serves", path.display());
    }
    if to.exists() {
        anyhow::bail!("--to {} exists already; a backup never overwrites a file: name a new one", to.display());
    }
    // Not read-only: a read-only connection cannot open a WAL database whose -shm file is missing
    // (no tracker running). VACUUM INTO only reads it all the same.
    let mut conn = SqliteConnectOptions::new()
        .filename(&path)
        .busy_timeout(store::BUSY_TIMEOUT)
        .connect()
        .await
        .with_context(|| format!("opening database {}", path.display()))?;
    let target = to.to_str().with_context(|| format!("--to {} is not valid UTF-8", to.display()))?;
    sqlx::query("VACUUM INTO $1")
        .bind(target)
        .execute(&mut conn)
        .await
        .with_context(|| format!("copying {} to {}", path.display(), to.display()))?;
    conn.close().await.ok();
    let summary = verify(to).await.with_context(|| format!("checking the copy {}", to.display()))?;
    tracing::info!(from = %path.display(), to = %to.display(), bytes = summary.bytes, records = summary.records, "backup written");
    Ok(summary)
}

/// Opens a backup, runs SQLite's integrity check and counts what it holds (changing nothing).
pub async fn verify(copy: &Path) -> anyhow::Result<BackupSummary> {
    let mut conn = SqliteConnectOptions::new().filename(copy).connect().await?;
    let problems: Vec<String> = sqlx::query_scalar("PRAGMA integrity_check").fetch_all(&mut conn).await?;
    if problems != ["ok"] {
        anyhow::bail!("the integrity check failed: {}", problems.join("; "));
    }
    let records: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM records").fetch_one(&mut conn).await?;
    let jobs: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM jobs").fetch_one(&mut conn).await?;
    conn.close().await.ok();
    let bytes = std::fs::metadata(copy)?.len();
    Ok(BackupSummary { path: copy.to_path_buf(), bytes, records, jobs })
}
