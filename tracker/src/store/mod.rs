//! The store, one function per query, on SQLite or PostgreSQL. The database is the source of
//! truth: everything the tracker knows about jobs, tasks and records can be rebuilt from it after a
//! crash.
//!
//! Functions take any [`Exec`] (the [`Pool`] for reads, a write's or a snapshot's [`Tx`]) and
//! return the tracker's [`Error`](crate::error::Error), so a database failure reaches callers as a
//! plain "internal" status with the detail only in the log. Each function's body is written once
//! and compiled for both databases by [`on!`]; where the dialects differ (JSON arrays, aggregates)
//! it picks the SQL text by the `pg` flag [`on!`] gives it.
//!
//! Several trackers may share one PostgreSQL database: a write takes a transaction-scoped advisory
//! lock first ([`Pool::begin_write`]), so writes stay one at a time across every tracker, as they
//! are on SQLite, and each read-decide-write sequence (leasing, reporting, proposing) stays atomic.
//! The dispatch calls' group writes, the bulk of them, take that lock shared instead
//! ([`Pool::begin_dispatch`]) and a lock per job they change ([`tasks::lock_jobs_of`], and the lease's
//! `pg_try_advisory_xact_lock`), so that two trackers' groups run at once on different jobs.
//! There, [`statistics::keep_current`] analyzes the tables as they grow, so that plans are not made
//! from a new database's missing statistics.

pub(crate) mod classes;
pub(crate) mod jobs;
pub(crate) mod packs;
pub(crate) mod records;
pub(crate) mod statistics;
pub(crate) mod tasks;
pub(crate) mod workers;
pub(crate) mod workloads;

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use anyhow::Context;
use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Connection, PgConnection, PgPool, Postgres, Sqlite, SqliteConnection, SqlitePool, Transaction};

/// How long a statement waits for SQLite's write lock before failing. Writes are serialised by the
/// tracker itself, so this only matters when another process (a backup, the sqlite3 shell) holds it.
pub(crate) const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// Page cache of each SQLite connection, KiB (see `open_sqlite`).
const SQLITE_CACHE_KIB: u32 = 32 * 1024;

/// Connections in the pool: reads (snapshots, watches, exports) run beside the one writer.
const MAX_CONNECTIONS: u32 = 8;

/// How long a call waits for a PostgreSQL connection (the server unreachable, or the pool busy)
/// before it fails with `Unavailable`: shorter than a worker's lease, so it retries in time.
const PG_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);

/// The advisory lock key every tracker's writes take on PostgreSQL ("tensortn" in ASCII): one
/// writer at a time across all trackers on the database. The dispatch groups take it shared
/// ([`Pool::begin_dispatch`]): any other write excludes them all, and they exclude one another
/// only by their jobs' locks.
const WRITER_LOCK: i64 = 0x7465_6e73_6f72_746e;

/// The first key of a job's advisory lock on PostgreSQL ("tnjb"); the second is the job id's low
/// 31 bits, `CAST(job_id % 2147483648 AS INTEGER)` (ids never reach them; two jobs sharing a key
/// would only wait for each other). Two 32-bit keys are a key space apart from [`WRITER_LOCK`]'s.
pub(crate) const JOB_LOCK_CLASS: i32 = 0x746e_6a62;

/// Runs `$body` with `$c` bound to the executor inside `$e` (anything `Into<Exec>`) and `$pg` to
/// whether it is PostgreSQL. The body is compiled once per database, so it must type-check on both.
macro_rules! on {
    ($e:expr, |$c:ident, $pg:ident| $body:expr) => {
        match ::std::convert::Into::<$crate::store::Exec<'_>>::into($e) {
            $crate::store::Exec::SqlitePool($c) => {
                #[allow(unused_variables)]
                let $pg = false;
                $body
            }
            $crate::store::Exec::Sqlite($c) => {
                #[allow(unused_variables)]
                let $pg = false;
                $body
            }
            $crate::store::Exec::PgPool($c) => {
                #[allow(unused_variables)]
                let $pg = true;
                $body
            }
            $crate::store::Exec::Postgres($c) => {
                #[allow(unused_variables)]
                let $pg = true;
                $body
            }
        }
    };
}
pub(crate) use on;

/// Stores a fieldless enum as its name in a TEXT column, on either database: `text_column!(Type {
/// Type::Variant => "name", ... })`.
macro_rules! text_column {
    ($ty:ident { $($variant:path => $name:literal),+ $(,)? }) => {
        impl $ty {
            /// The variant stored as `name`, if any.
            pub(crate) fn from_column(name: &str) -> Option<Self> {
                match name {
                    $($name => Some($variant),)+
                    _ => None,
                }
            }
        }

        impl<DB: sqlx::Database> sqlx::Type<DB> for $ty
        where
            str: sqlx::Type<DB>,
        {
            fn type_info() -> DB::TypeInfo {
                <str as sqlx::Type<DB>>::type_info()
            }

            fn compatible(ty: &DB::TypeInfo) -> bool {
                <str as sqlx::Type<DB>>::compatible(ty)
            }
        }

        impl<'q, DB: sqlx::Database> sqlx::Encode<'q, DB> for $ty
        where
            &'static str: sqlx::Encode<'q, DB>,
        {
            fn encode_by_ref(
                &self,
                buf: &mut <DB as sqlx::Database>::ArgumentBuffer,
            ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
                let name: &'static str = match self {
                    $($variant => $name,)+
                };
                <&'static str as sqlx::Encode<'q, DB>>::encode(name, buf)
            }
        }

        impl<'r, DB: sqlx::Database> sqlx::Decode<'r, DB> for $ty
        where
            &'r str: sqlx::Decode<'r, DB>,
        {
            fn decode(value: <DB as sqlx::Database>::ValueRef<'r>) -> Result<Self, sqlx::error::BoxDynError> {
                let name = <&'r str as sqlx::Decode<'r, DB>>::decode(value)?;
                Self::from_column(name)
                    .ok_or_else(|| format!("unknown {} {name:?} in the database", stringify!($ty)).into())
            }
        }
    };
}
pub(crate) use text_column;

/// A struct read from a row, on either database (what `#[derive(sqlx::FromRow)]` does, without
/// sqlx's proc-macro, which builds its drivers and SQLite a second time for the host). Each field
/// is the column of its name; `field: T as S` reads an `S` and converts it with `TryFrom` (an
/// integer column into a `u32`, a JSON text into `Json<T>`); `field: T = value` takes `value` when
/// the row has no such column.
macro_rules! from_row {
    (
        $(#[$m:meta])*
        $vis:vis struct $name:ident {
            $($(#[$fm:meta])* $fvis:vis $field:ident : $ty:ty $(as $stored:ty)? $(= $default:expr)?),* $(,)?
        }
    ) => {
        $(#[$m])*
        $vis struct $name {
            $($(#[$fm])* $fvis $field: $ty),*
        }
        $crate::store::from_row!(@impl $name, sqlx::sqlite::SqliteRow, $($field $(as $stored)? $(= $default)?),*);
        $crate::store::from_row!(@impl $name, sqlx::postgres::PgRow, $($field $(as $stored)? $(= $default)?),*);
    };
    (@impl $name:ident, $row:ty, $($field:ident $(as $stored:ty)? $(= $default:expr)?),*) => {
        impl<'r> sqlx::FromRow<'r, $row> for $name {
            fn from_row(row: &'r $row) -> Result<Self, sqlx::Error> {
                Ok($name { $($field: $crate::store::from_row!(@get row, $field $(as $stored)? $(= $default)?)),* })
            }
        }
    };
    (@get $row:ident, $field:ident) => {
        sqlx::Row::try_get($row, stringify!($field))?
    };
    (@get $row:ident, $field:ident as $stored:ty) => {
        sqlx::Row::try_get::<$stored, _>($row, stringify!($field))?.try_into().map_err(|e| {
            sqlx::Error::ColumnDecode { index: stringify!($field).to_owned(), source: Box::new(e) }
        })?
    };
    (@get $row:ident, $field:ident = $default:expr) => {
        match sqlx::Row::try_get($row, stringify!($field)) {
            Err(sqlx::Error::ColumnNotFound(_)) => $default,
            found => found?,
        }
    };
}
pub(crate) use from_row;

/// The migrations this build carries for each database, as (version, description, SQL):
/// `migrations::SQLITE` and `migrations::POSTGRES` (written by tracker/build.rs from
/// `migrations/`).
pub(crate) mod migrations {
    include!(concat!(env!("OUT_DIR"), "/migrations.rs"));
}

/// sqlx's migrator for one database's migrations (`migrations::SQLITE` or `POSTGRES`), each with
/// the checksum and description sqlx gives the same file read from a folder, so a database
/// migrated by an earlier build (which embedded them with sqlx's `migrate!`) is recognised.
pub(crate) fn migrator(set: &[(i64, &'static str, &'static str)]) -> sqlx::migrate::Migrator {
    use sqlx::SqlSafeStr;
    use sqlx::migrate::{Migration, MigrationType, Migrator};
    Migrator::with_migrations(
        set.iter()
            .map(|&(version, description, sql)| {
                let no_tx = sql.starts_with("-- no-transaction");
                Migration::new(version, description.into(), MigrationType::Simple, sql.into_sql_str(), no_tx)
            })
            .collect(),
    )
}

/// Where the database is: what `--db` names.
#[derive(Clone, Debug)]
pub(crate) enum Location {
    /// A SQLite file (a path, or a `sqlite://` URL).
    Sqlite(PathBuf),
    /// A PostgreSQL server and database (a `postgres://` or `postgresql://` URL).
    Postgres(Box<PgConnectOptions>),
}

impl Location {
    /// Reads `--db`: a `postgres://` or `postgresql://` URL, a `sqlite://` URL, or a file path.
    pub(crate) fn parse(db: &Path) -> anyhow::Result<Location> {
        let text = db.to_string_lossy();
        if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            let options = PgConnectOptions::from_str(&text).map_err(|e| {
                anyhow::anyhow!(
                    "--db {:?} is not a usable PostgreSQL URL ({e}); expected postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE",
                    redact(&text)
                )
            })?;
            return Ok(Location::Postgres(Box::new(options)));
        }
        if let Some(path) = text.strip_prefix("sqlite://") {
            if path.contains('?') {
                anyhow::bail!(
                    "--db {text:?}: options in a sqlite:// URL are not taken (the tracker sets WAL, full sync and \
                     foreign keys itself); give sqlite://PATH"
                );
            }
            if path.is_empty() {
                anyhow::bail!("--db {text:?} names no file; expected sqlite://PATH (or just PATH)");
            }
            return Ok(Location::Sqlite(PathBuf::from(path)));
        }
        if let Some((scheme, _)) = text.split_once("://") {
            anyhow::bail!(
                "--db {:?} has an unknown scheme {scheme:?}; expected a file path, sqlite://PATH or postgres://...",
                redact(&text)
            );
        }
        if text.is_empty() {
            anyhow::bail!("--db is empty; expected a file path, sqlite://PATH or postgres://...");
        }
        Ok(Location::Sqlite(db.to_path_buf()))
    }
}

/// `--db` as it may be shown: a URL's password replaced by `***`.
pub(crate) fn redact(db: &str) -> String {
    let Some((scheme, rest)) = db.split_once("://") else { return db.to_owned() };
    let (authority, tail) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    match authority.rsplit_once('@') {
        Some((user, host)) => match user.split_once(':') {
            Some((name, _)) => format!("{scheme}://{name}:***@{host}{tail}"),
            None => db.to_owned(),
        },
        None => db.to_owned(),
    }
}

/// The connection pool of either database.
#[derive(Clone, Debug)]
pub(crate) enum Pool {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

/// A transaction on either database; dropped without [`Tx::commit`], it rolls back.
pub(crate) enum Tx {
    Sqlite(Transaction<'static, Sqlite>),
    Postgres(Transaction<'static, Postgres>),
}

/// Something a query runs on: a pool or a transaction's connection, of either database.
pub(crate) enum Exec<'e> {
    SqlitePool(&'e SqlitePool),
    Sqlite(&'e mut SqliteConnection),
    PgPool(&'e PgPool),
    Postgres(&'e mut PgConnection),
}

impl Exec<'_> {
    /// The same executor for one more query, leaving this one usable after it.
    pub(crate) fn reborrow(&mut self) -> Exec<'_> {
        match self {
            Exec::SqlitePool(p) => Exec::SqlitePool(p),
            Exec::Sqlite(c) => Exec::Sqlite(c),
            Exec::PgPool(p) => Exec::PgPool(p),
            Exec::Postgres(c) => Exec::Postgres(c),
        }
    }
}

impl<'e> From<&'e Pool> for Exec<'e> {
    fn from(pool: &'e Pool) -> Self {
        match pool {
            Pool::Sqlite(p) => Exec::SqlitePool(p),
            Pool::Postgres(p) => Exec::PgPool(p),
        }
    }
}

impl<'e> From<&'e mut Tx> for Exec<'e> {
    fn from(tx: &'e mut Tx) -> Self {
        tx.exec()
    }
}

impl Pool {
    /// A transaction for reads that must see one instant (a job with its workloads and records).
    pub(crate) async fn begin(&self) -> sqlx::Result<Tx> {
        Ok(match self {
            Pool::Sqlite(p) => Tx::Sqlite(p.begin().await?),
            // READ COMMITTED would give each statement its own snapshot.
            Pool::Postgres(p) => Tx::Postgres(p.begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ").await?),
        })
    }

    /// A write transaction, holding the database's write lock from its start: SQLite's (IMMEDIATE,
    /// so it never has to upgrade a read lock, which fails instead of waiting), or on PostgreSQL
    /// the advisory lock that every tracker on the database takes for its writes.
    pub(crate) async fn begin_write(&self) -> sqlx::Result<Tx> {
        Ok(match self {
            Pool::Sqlite(p) => Tx::Sqlite(p.begin_with("BEGIN IMMEDIATE").await?),
            Pool::Postgres(p) => {
                let mut tx = p.begin().await?;
                sqlx::query("SELECT pg_advisory_xact_lock($1)").bind(WRITER_LOCK).execute(&mut *tx).await?;
                Tx::Postgres(tx)
            }
        })
    }

    /// The write of a dispatch group (leases, heartbeats, reports; `commits`): on SQLite
    /// [`Pool::begin_write`]'s; on PostgreSQL the writer lock taken shared, beside every other
    /// tracker's groups. Such a write must lock each job it changes ([`tasks::lock_jobs_of`], or the
    /// lease's own try) before it reads what it decides on.
    pub(crate) async fn begin_dispatch(&self) -> sqlx::Result<Tx> {
        Ok(match self {
            Pool::Sqlite(_) => self.begin_write().await?,
            Pool::Postgres(p) => {
                let mut tx = p.begin().await?;
                sqlx::query("SELECT pg_advisory_xact_lock_shared($1)").bind(WRITER_LOCK).execute(&mut *tx).await?;
                Tx::Postgres(tx)
            }
        })
    }

    /// Whether this is PostgreSQL (several trackers may share it).
    pub(crate) fn is_postgres(&self) -> bool {
        matches!(self, Pool::Postgres(_))
    }

    /// Closes every connection.
    pub(crate) async fn close(&self) {
        match self {
            Pool::Sqlite(p) => p.close().await,
            Pool::Postgres(p) => p.close().await,
        }
    }
}

impl Tx {
    /// The transaction's connection.
    pub(crate) fn exec(&mut self) -> Exec<'_> {
        match self {
            Tx::Sqlite(tx) => Exec::Sqlite(tx),
            Tx::Postgres(tx) => Exec::Postgres(tx),
        }
    }

    /// Commits.
    pub(crate) async fn commit(self) -> sqlx::Result<()> {
        match self {
            Tx::Sqlite(tx) => tx.commit().await,
            Tx::Postgres(tx) => tx.commit().await,
        }
    }
}

/// Opens the database `db` names (a path or URL, see [`Location::parse`]), creating a SQLite file
/// when missing, and applies the migrations.
pub(crate) async fn open(db: &Path) -> anyhow::Result<Pool> {
    match Location::parse(db)? {
        Location::Sqlite(path) => open_sqlite(&path).await.map(Pool::Sqlite),
        Location::Postgres(options) => {
            open_postgres(*options, &redact(&db.to_string_lossy())).await.map(Pool::Postgres)
        }
    }
}

/// The start of the PostgreSQL `application_name` of a serving tracker's connections; the rest
/// names the process (a random number). The trackers on a database find one another by it (see
/// `tasks::LEASE_PG`).
pub(crate) const TRACKER_APPLICATION: &str = "tensortune-tracker ";

/// [`open`] for a tracker that serves: on PostgreSQL its connections carry its name
/// ([`TRACKER_APPLICATION`]), by which the other trackers on the database count it.
pub(crate) async fn open_serving(db: &Path) -> anyhow::Result<Pool> {
    match Location::parse(db)? {
        Location::Postgres(options) => {
            let name = format!("{TRACKER_APPLICATION}{:016x}", rand::random::<u64>());
            open_postgres(options.application_name(&name), &redact(&db.to_string_lossy())).await.map(Pool::Postgres)
        }
        Location::Sqlite(_) => open(db).await,
    }
}

/// Connects to the PostgreSQL database and applies its migrations; `shown` is the URL without its
/// password, for errors.
async fn open_postgres(options: PgConnectOptions, shown: &str) -> anyhow::Result<PgPool> {
    let pool = PgPoolOptions::new()
        .max_connections(MAX_CONNECTIONS)
        .acquire_timeout(PG_ACQUIRE_TIMEOUT)
        .connect_with(options)
        .await
        .with_context(|| format!("connecting to the PostgreSQL database {shown}"))?;
    migrator(migrations::POSTGRES)
        .run(&pool)
        .await
        .with_context(|| format!("applying migrations to the PostgreSQL database {shown}"))?;
    // As on SQLite: a database the tracker can read but not write (a standby, a role without
    // rights) would take jobs and then refuse every report, so it refuses to start instead.
    let probe = async {
        let mut tx = pool.begin().await?;
        sqlx::query("LOCK TABLE jobs, tasks, records, workers IN ROW EXCLUSIVE MODE").execute(&mut *tx).await?;
        tx.rollback().await
    };
    probe.await.with_context(|| {
        format!(
            "the PostgreSQL database {shown} cannot be written (a read-only standby, or a role without write rights?)"
        )
    })?;
    Ok(pool)
}

/// Pages the WAL may grow by before a commit checkpoints it (SQLite's `wal_autocheckpoint`).
const WAL_AUTOCHECKPOINT: u32 = 10_000;

/// [`WAL_AUTOCHECKPOINT`], or `TENSORTUNE_WAL_AUTOCHECKPOINT` when set (pages, 1 or more; for load
/// comparisons); any other value is an error naming the variable.
fn wal_autocheckpoint() -> anyhow::Result<u32> {
    let Ok(value) = std::env::var("TENSORTUNE_WAL_AUTOCHECKPOINT") else { return Ok(WAL_AUTOCHECKPOINT) };
    value.trim().parse::<u32>().ok().filter(|&n| n >= 1).ok_or_else(|| {
        anyhow::anyhow!(
            "TENSORTUNE_WAL_AUTOCHECKPOINT must be a whole number of pages from 1 to {}, not {value:?}",
            u32::MAX
        )
    })
}

/// Opens (creating if needed) the SQLite database at `path` and applies the migrations.
async fn open_sqlite(path: &Path) -> anyhow::Result<SqlitePool> {
    let options = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        // FULL: a report acknowledged to a worker must survive a power cut, since the worker
        // will not send it again.
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(BUSY_TIMEOUT)
        .foreign_keys(true)
        // The default 2 MiB of page cache holds a fraction of a busy database's tasks and records:
        // every lease and report then reads pages back through the kernel (a tenth of the
        // tracker's time at 1,000 workers).
        .pragma("cache_size", format!("-{}", SQLITE_CACHE_KIB))
        // Statement journals (what SQLite keeps to undo one statement inside a transaction) in
        // memory instead of a temporary file: at 1,000 workers their writes to that file were
        // 6-7% of the tracker's CPU (`pwrite` under `subjournalPageIfRequired`, 2026-11-28). They
        // are never read after a crash (the WAL is), so nothing durable moves.
        .pragma("temp_store", "memory")
        .pragma("wal_autocheckpoint", wal_autocheckpoint()?.to_string());
    let pool = SqlitePoolOptions::new()
        .max_connections(MAX_CONNECTIONS)
        .after_connect(|conn, _| Box::pin(stable_plans(conn)))
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
    migrator(migrations::SQLITE).run(&pool).await.map_err(|e| match e {
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

/// Turns on SQLite's query planner stability guarantee (`SQLITE_DBCONFIG_ENABLE_QPSG`) on `conn`.
///
/// Without it, SQLite marks a statement whose plan looked at a bound value (a `LIMIT $n`, a term a
/// partial index's condition was matched against) to be compiled again whenever it is bound anew,
/// and sqlx binds anew at every execution: the lease and report statements were compiled again
/// each time they ran, a quarter of the tracker's CPU under load (docs/tracker-scaling.md). With
/// the guarantee a plan never depends on bound values, so each statement is compiled once per
/// connection; no query here needs a bound value to find its index.
async fn stable_plans(conn: &mut SqliteConnection) -> sqlx::Result<()> {
    use std::ffi::c_int;
    let mut handle = conn.lock_handle().await?;
    let db = handle.as_raw_handle().as_ptr();
    // SAFETY: `db` is this connection's open handle, held by `handle` for the call, so no other
    // thread uses it; SQLITE_DBCONFIG_ENABLE_QPSG takes an int (1: on) and an `int*` for the
    // setting it leaves, which may be null.
    let rc = unsafe {
        libsqlite3_sys::sqlite3_db_config(
            db,
            libsqlite3_sys::SQLITE_DBCONFIG_ENABLE_QPSG,
            1 as c_int,
            std::ptr::null_mut::<c_int>(),
        )
    };
    if rc != libsqlite3_sys::SQLITE_OK {
        return Err(sqlx::Error::Configuration(
            format!("SQLite refused its query planner stability guarantee (code {rc})").into(),
        ));
    }
    Ok(())
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

/// The SQL text of a query for the database at hand: `sqlite` as written, or for PostgreSQL (`pg`)
/// with each `json_each($N)` (the elements of a JSON array parameter, as rows of one `value`
/// column) spelled `json_array_elements_text($N::json)`. Elements come back as text on
/// PostgreSQL, so queries compare numbers as `CAST(value AS BIGINT)`, which both read alike.
/// Everything else must already mean the same on both; queries that differ more pick their text
/// by `pg` themselves.
pub(crate) fn sql(pg: bool, sqlite: &'static str) -> &'static str {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    // Rewritten once per query text (a fixed, small set) and kept for the process's life.
    static REWRITTEN: OnceLock<Mutex<HashMap<&'static str, &'static str>>> = OnceLock::new();
    if !pg || !sqlite.contains("json_each($") {
        return sqlite;
    }
    let mut cache = REWRITTEN.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    cache.entry(sqlite).or_insert_with(|| {
        let mut out = String::with_capacity(sqlite.len() + 32);
        let mut rest = sqlite;
        while let Some(at) = rest.find("json_each($") {
            out.push_str(&rest[..at]);
            let after = &rest[at + "json_each(".len()..];
            let end = after.find(')').unwrap_or(after.len());
            out.push_str("json_array_elements_text(");
            out.push_str(&after[..end]);
            out.push_str("::json");
            rest = &after[end..];
        }
        out.push_str(rest);
        Box::leak(out.into_boxed_str())
    })
}

/// The channel a write that made tasks pending notifies on PostgreSQL, so that every tracker on
/// the database wakes its long-polling leases (see `lib::relay_notifications`). Payload: the
/// writing tracker's instance number, `:`, how many tasks became pending.
pub(crate) const TASKS_CHANNEL: &str = "tensortune_tasks";

/// The channel a write that changed jobs notifies on PostgreSQL, so that every tracker wakes its
/// job watchers. Payload: the writing tracker's instance number, `:`, the job ids comma-separated.
pub(crate) const JOBS_CHANNEL: &str = "tensortune_jobs";

/// On PostgreSQL, inside a write: notifies `channel` with `payload` (delivered when the write
/// commits). Nothing on SQLite.
pub(crate) async fn notify(e: impl Into<Exec<'_>>, channel: &str, payload: &str) -> crate::error::Result<()> {
    let notify = || sqlx::query("SELECT pg_notify($1, $2)").bind(channel).bind(payload);
    match e.into() {
        Exec::PgPool(c) => notify().execute(c).await.map(|_| ())?,
        Exec::Postgres(c) => notify().execute(c).await.map(|_| ())?,
        Exec::SqlitePool(_) | Exec::Sqlite(_) => {}
    }
    Ok(())
}

/// A stored count or index as the `u32` the tracker uses (every integer column is 64-bit on
/// PostgreSQL, which has no unsigned types); out-of-range values, which the tracker never writes,
/// saturate.
pub(crate) fn small(n: i64) -> u32 {
    u32::try_from(n.max(0)).unwrap_or(u32::MAX)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The migrations this build embeds are the files of `migrations/` as sqlx itself reads a
    /// folder (what its `migrate!` embedded in earlier builds): same versions, descriptions,
    /// checksums and transaction flags, so databases those builds migrated are recognised.
    #[tokio::test]
    async fn the_embedded_migrations_are_the_folders_as_sqlx_reads_them() {
        for (set, dir) in [(migrations::SQLITE, "sqlite"), (migrations::POSTGRES, "postgres")] {
            let folder = Path::new(env!("CARGO_MANIFEST_DIR")).join("../migrations").join(dir);
            let read = sqlx::migrate::Migrator::new(folder).await.unwrap();
            let key = |m: &sqlx::migrate::Migration| {
                (m.version, m.description.to_string(), m.checksum.to_vec(), m.no_tx, m.migration_type)
            };
            let ours: Vec<_> = migrator(set).iter().map(key).collect();
            assert!(ours.len() >= 6, "{dir}: only {} migrations embedded", ours.len());
            assert_eq!(ours, read.iter().map(key).collect::<Vec<_>>(), "{dir}");
        }
    }

    #[test]
    fn db_names_a_file_a_sqlite_url_or_a_postgres_url() {
        assert!(
            matches!(Location::parse(Path::new("a/t.db")).unwrap(), Location::Sqlite(p) if p == Path::new("a/t.db"))
        );
        assert!(
            matches!(Location::parse(Path::new("sqlite://a/t.db")).unwrap(), Location::Sqlite(p) if p == Path::new("a/t.db"))
        );
        match Location::parse(Path::new("postgresql://tt:pw@db.example:6543/tune")).unwrap() {
            Location::Postgres(o) => {
                assert_eq!((o.get_host(), o.get_port(), o.get_username()), ("db.example", 6543, "tt"));
                assert_eq!(o.get_database(), Some("tune"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_bad_db_is_refused_naming_the_flag_and_never_the_password() {
        for bad in
            ["mysql://tt:secret@db/x", "sqlite://", "sqlite://t.db?mode=ro", "", "postgres://tt:secret@db:notaport/x"]
        {
            let e = Location::parse(Path::new(bad)).unwrap_err().to_string();
            assert!(e.contains("--db"), "{bad}: {e}");
            assert!(!e.contains("secret"), "{bad}: {e}");
        }
        assert_eq!(redact("postgres://tt:secret@db:5/x?sslmode=require"), "postgres://tt:***@db:5/x?sslmode=require");
        assert_eq!(redact("postgres://tt@db/x"), "postgres://tt@db/x");
        assert_eq!(redact("t.db"), "t.db");
    }
}
