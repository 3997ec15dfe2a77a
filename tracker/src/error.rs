//! The tracker's error type and its one mapping onto gRPC status codes.

use tensortune_proto::convert::FieldError;

/// Everything a tracker operation can fail with.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    /// A request field is missing, out of range or inconsistent.
    #[error("invalid {field}: {message}")]
    Invalid {
        /// Dotted path of the field, e.g. `workloads[0].matmul.k`.
        field: String,
        /// What is wrong and what is allowed.
        message: String,
    },
    /// No job with this id.
    #[error("job {0} does not exist")]
    JobNotFound(i64),
    /// No task with this id.
    #[error("task {0} does not exist")]
    TaskNotFound(i64),
    /// No worker with this id (it never registered, or the tracker's database was replaced).
    #[error("worker {0} is not registered; register again (with previous_id 0)")]
    WorkerNotFound(i64),
    /// A report from a worker that neither holds the task nor was its last holder.
    #[error("worker {worker} does not hold task {task}{}", holder.map(|h| format!(": it is leased to worker {h}")).unwrap_or_default())]
    NotHolder {
        /// The reporting worker.
        worker: i64,
        /// The task.
        task: i64,
        /// Who holds it now, if anyone.
        holder: Option<i64>,
    },
    /// A report for an earlier lease of a task the worker holds again.
    #[error("task {task} was leased again (lease {current}); this report answers lease {reported} and is stale")]
    StaleLease {
        /// The task.
        task: i64,
        /// The lease the report names.
        reported: u32,
        /// The task's current lease.
        current: u32,
    },
    /// The request conflicts with the tracker's state (no such device class, job already ended).
    #[error("{0}")]
    Precondition(String),
    /// The caller's token may not do this (another token's job or worker, a role without the
    /// right, a quarantined worker).
    #[error("{0}")]
    Denied(String),
    /// A bound on concurrent work (open streams) is reached; retrying later helps.
    #[error("{0}")]
    Exhausted(String),
    /// The tracker cannot take the call now (it is shutting down); retrying later helps.
    #[error("{0}")]
    Unavailable(String),
    /// A second record for a task (or for one finalist of a finalist task) reached the database
    /// (the `records_task_unique` constraint).
    #[error("the task already has a record")]
    DuplicateRecord,
    /// The database failed; the detail is logged, never sent to callers.
    #[error("database error: {0}")]
    Database(#[source] sqlx::Error),
    /// Anything else that is the tracker's fault; the message is safe to show.
    #[error("{0}")]
    Internal(String),
}

/// Result with the tracker's error.
pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An `Invalid` error for `field`.
    pub(crate) fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Invalid { field: field.into(), message: message.into() }
    }
}

impl Error {
    /// Whether this refuses one report of a batch for good (malformed, unknown task, stale, not
    /// the holder's) rather than failing the call: the batch goes on without it.
    pub(crate) fn refusal(&self) -> bool {
        matches!(
            self,
            Error::Invalid { .. } | Error::TaskNotFound(_) | Error::NotHolder { .. } | Error::StaleLease { .. }
        )
    }

    /// The same error again, for an answer given twice (a change run again after its group
    /// failed). A database error, which has no copy, comes back as an internal one.
    pub(crate) fn again(&self) -> Error {
        match self {
            Error::Invalid { field, message } => Error::Invalid { field: field.clone(), message: message.clone() },
            Error::JobNotFound(id) => Error::JobNotFound(*id),
            Error::TaskNotFound(id) => Error::TaskNotFound(*id),
            Error::WorkerNotFound(id) => Error::WorkerNotFound(*id),
            Error::NotHolder { worker, task, holder } => {
                Error::NotHolder { worker: *worker, task: *task, holder: *holder }
            }
            Error::StaleLease { task, reported, current } => {
                Error::StaleLease { task: *task, reported: *reported, current: *current }
            }
            Error::Precondition(m) => Error::Precondition(m.clone()),
            Error::Denied(m) => Error::Denied(m.clone()),
            Error::Exhausted(m) => Error::Exhausted(m.clone()),
            Error::Unavailable(m) => Error::Unavailable(m.clone()),
            Error::DuplicateRecord => Error::DuplicateRecord,
            Error::Database(e) => Error::Internal(format!("database error: {e}")),
            Error::Internal(m) => Error::Internal(m.clone()),
        }
    }

    /// Whether this is a failure of the storage under the database (see [`unwritable`]).
    pub(crate) fn unwritable(&self) -> bool {
        matches!(self, Error::Database(e) if unwritable(e).is_some())
    }
}

impl From<FieldError> for Error {
    fn from(e: FieldError) -> Self {
        Error::Invalid { field: e.field, message: e.message }
    }
}

impl From<sqlx::Error> for Error {
    fn from(e: sqlx::Error) -> Self {
        // SQLite does not report constraint names, but its message names the columns of the
        // violated UNIQUE constraint; PostgreSQL names the constraint. The one on records
        // (task_id, finalist_pos) is what makes reports idempotent.
        if let sqlx::Error::Database(db) = &e
            && db.is_unique_violation()
            && (db.message().contains("records.task_id") || db.constraint() == Some("records_task_unique"))
        {
            return Error::DuplicateRecord;
        }
        Error::Database(e)
    }
}

/// Why the database could not write, when `e` is a failure of the storage under the database
/// (full, read-only, an I/O error, locked by another process) or, on PostgreSQL, of reaching the
/// server, rather than of the query.
pub(crate) fn unwritable(e: &sqlx::Error) -> Option<&'static str> {
    let db = match e {
        sqlx::Error::Database(db) => db,
        // A PostgreSQL server gone (its connection broke, or none could be had in time).
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut => return Some("database server unreachable"),
        _ => return None,
    };
    if let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
        return pg_unwritable(pg.code());
    }
    // Extended result codes carry the primary code in their low byte.
    let code: i64 = db.code()?.parse().ok()?;
    match code & 0xff {
        13 => Some("disk full"),
        8 => Some("read-only database"),
        10 => Some("i/o error"),
        14 => Some("cannot open a database file"),
        5 | 6 => Some("database locked by another process"),
        _ => None,
    }
}

/// [`unwritable`] for a PostgreSQL SQLSTATE.
fn pg_unwritable(code: &str) -> Option<&'static str> {
    match code {
        "53100" => Some("disk full"),
        "25006" => Some("read-only database"),
        "58030" => Some("i/o error"),
        "57P01" | "57P02" | "57P03" => Some("database server shutting down or starting"),
        "53300" => Some("too many connections to the database server"),
        _ if code.starts_with("08") => Some("database server unreachable"),
        _ => None,
    }
}

impl From<tokio::task::JoinError> for Error {
    fn from(e: tokio::task::JoinError) -> Self {
        Error::Internal(format!("a background computation failed: {e}"))
    }
}

impl From<Error> for tonic::Status {
    fn from(e: Error) -> Self {
        use tonic::Status;
        match e {
            Error::Invalid { .. } => Status::invalid_argument(e.to_string()),
            Error::JobNotFound(_) | Error::TaskNotFound(_) | Error::WorkerNotFound(_) => {
                Status::not_found(e.to_string())
            }
            Error::NotHolder { .. } | Error::StaleLease { .. } | Error::Precondition(_) => {
                Status::failed_precondition(e.to_string())
            }
            Error::Denied(_) => Status::permission_denied(e.to_string()),
            Error::DuplicateRecord => Status::already_exists(e.to_string()),
            Error::Exhausted(_) => Status::resource_exhausted(e.to_string()),
            Error::Unavailable(_) => Status::unavailable(e.to_string()),
            Error::Database(db) => match unwritable(&db) {
                // Nothing of the call was stored (its transaction rolled back): a worker keeps its
                // result and retries, which `Unavailable` tells it to do.
                Some(why) => {
                    tracing::error!(error = %db, %why, "database write failed; the call changed nothing");
                    Status::unavailable(format!(
                        "the tracker cannot write its database ({why}); nothing was stored, retry later"
                    ))
                }
                None => {
                    tracing::error!(error = %db, "database error");
                    Status::internal("the tracker's database failed; see the tracker log")
                }
            },
            Error::Internal(message) => {
                tracing::error!(%message, "internal error");
                Status::internal(message)
            }
        }
    }
}
