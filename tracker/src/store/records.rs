//! Queries on `records`.

use tensortune_kernels::Workload;
use tensortune_kernels::energy::{Objective, Regime};

use super::{Exec, Json, from_row, json, on, sql};
use crate::error::Result;
use crate::model::{JobId, Provenance, RecordFilter, RecordId, Status, TaskId, WorkerId};

from_row! {
    /// A stored measurement record.
    #[derive(Clone, Debug)]
    pub(crate) struct Record {
        pub(crate) id: RecordId,
        pub(crate) task_id: TaskId,
        pub(crate) job_id: JobId,
        pub(crate) worker_id: Option<WorkerId>,
        pub(crate) workload_key: String,
        pub(crate) workload: Json<Workload> as String,
        pub(crate) template: String,
        pub(crate) template_version: u32 as i64,
        pub(crate) config: String,
        pub(crate) config_index: i64,
        pub(crate) device_class: String,
        pub(crate) status: Status,
        pub(crate) error: String,
        pub(crate) compile_ms: f64,
        pub(crate) measure_ms: f64,
        pub(crate) samples: Json<Vec<f64>> as String,
        pub(crate) median_us: f64,
        pub(crate) spread: f64,
        pub(crate) batch: u32 as i64,
        pub(crate) baseline_us: Option<f64>,
        pub(crate) baseline_kind: String,
        /// The algorithm the vendor library says it ran for the baseline (empty when unknown).
        pub(crate) vendor_algo: String = String::new(),
        pub(crate) max_abs_err: Option<f64>,
        pub(crate) max_rel_err: Option<f64>,
        pub(crate) registers: u32 as i64,
        pub(crate) smem_bytes: u32 as i64,
        pub(crate) cache_hit: bool,
        pub(crate) provenance: Json<Provenance> as String,
        pub(crate) tflops: f64,
        pub(crate) speedup: f64,
        pub(crate) created_ms: i64,
        /// A re-measurement of a finalist, not a tuning trial.
        pub(crate) remeasure: bool,
        /// The token the report came with.
        pub(crate) token_id: Option<i64>,
        /// Why the record is not trusted (never wins, never answers `best`), if it is not.
        pub(crate) untrusted: Option<String>,
        /// Millijoules per launch over the timed window (unknown: NULL).
        pub(crate) energy_mj: Option<f64>,
        /// Mean board power, watts.
        pub(crate) power_w: Option<f64>,
        /// Mean SM clock, MHz.
        pub(crate) mean_clock_mhz: Option<f64>,
        /// Degrees Celsius at the end of the window.
        pub(crate) temperature_c: Option<f64>,
        /// `burst` or `sustained`.
        pub(crate) regime: String,
        /// Sustained: how long it ran before it was steady, ms.
        pub(crate) settle_ms: f64,
        /// Sustained: whether it was found steady.
        pub(crate) steady: bool,
        /// The vendor baseline's energy per launch, mJ.
        pub(crate) baseline_energy_mj: Option<f64>,
    }
}

from_row! {
    /// The identity and outcome of a record, enough to update a job's progress.
    #[derive(Clone, Copy, Debug, PartialEq)]
    pub(crate) struct Outcome {
        pub(crate) id: RecordId,
        pub(crate) status: Status,
        pub(crate) median_us: f64,
        /// False for a record marked untrusted: its time counts for nothing.
        pub(crate) trusted: bool,
        /// Millijoules per launch, when read.
        pub(crate) energy_mj: Option<f64>,
    }
}

impl Outcome {
    /// The record's score for `objective` (smaller is better), when it gives one to trust: ok,
    /// trusted, and with the energy the objective needs.
    pub(crate) fn score(&self, objective: Objective) -> Option<f64> {
        (self.status == Status::Ok && self.trusted).then(|| objective.score(self.median_us, self.energy_mj)).flatten()
    }
}

/// A record to insert: the task's identity plus what was measured.
pub(crate) struct NewRecord<'a> {
    pub(crate) task_id: TaskId,
    pub(crate) job_id: JobId,
    pub(crate) worker_id: Option<WorkerId>,
    pub(crate) workload: &'a Workload,
    pub(crate) template: &'a str,
    pub(crate) template_version: u32,
    pub(crate) config: &'a str,
    pub(crate) config_index: i64,
    pub(crate) device_class: &'a str,
    pub(crate) measurement: &'a crate::model::Measurement,
    /// `Some(position)` for the re-measurement of a finalist task's finalist.
    pub(crate) finalist: Option<u32>,
    /// The token the report came with.
    pub(crate) token_id: Option<i64>,
    /// Why the measurement is not trusted, if it is not.
    pub(crate) untrusted: Option<&'a str>,
}

/// Inserts a record, deriving TFLOP/s and the speedup over the vendor baseline.
pub(crate) async fn insert(e: impl Into<Exec<'_>>, r: &NewRecord<'_>, now: i64) -> Result<RecordId> {
    let ids = insert_many(e, std::slice::from_ref(r), now).await?;
    ids.first().copied().ok_or_else(|| crate::error::Error::Internal("a record inserted without its id".to_owned()))
}

/// Binds the values [`INSERT_RECORD`] names for record `$r` to the row `$b` of a `push_values`
/// (a macro: the binder's database differs between the two backends).
macro_rules! push_record {
    ($b:expr, $r:expr, $now:expr) => {{
        let r = $r;
        let m = r.measurement;
        let (tflops, speedup) = derived(r);
        $b.push_bind(r.task_id)
            .push_bind(r.job_id)
            .push_bind(r.worker_id)
            .push_bind(r.workload.key())
            .push_bind(json(r.workload))
            .push_bind(r.template)
            .push_bind(i64::from(r.template_version))
            .push_bind(r.config)
            .push_bind(r.config_index)
            .push_bind(r.device_class)
            .push_bind(m.status)
            .push_bind(&m.error)
            .push_bind(m.compile_ms)
            .push_bind(m.measure_ms)
            .push_bind(json(&m.samples_us))
            .push_bind(m.median_us)
            .push_bind(m.spread)
            .push_bind(i64::from(m.batch))
            .push_bind(m.baseline_us)
            .push_bind(&m.baseline_kind)
            .push_bind(m.max_abs_err)
            .push_bind(m.max_rel_err)
            .push_bind(i64::from(m.registers))
            .push_bind(i64::from(m.smem_bytes))
            .push_bind(m.cache_hit)
            .push_bind(json(&m.provenance))
            .push_bind(tflops)
            .push_bind(speedup)
            .push_bind($now)
            .push_bind(r.finalist.is_some())
            .push_bind(i64::from(r.finalist.unwrap_or(0)))
            .push_bind(r.token_id)
            .push_bind(r.untrusted)
            .push_bind(&m.vendor_algo)
            .push_bind(m.power.energy_mj)
            .push_bind(m.power.power_w)
            .push_bind(m.power.mean_clock_mhz)
            .push_bind(m.power.temperature_c)
            .push_bind(m.regime.name())
            .push_bind(m.settle_ms)
            .push_bind(m.steady)
            .push_bind(m.baseline_energy_mj);
    }};
}

/// Most records one [`insert_many`] statement inserts: 42 values each, well within SQLite's 32,766
/// and PostgreSQL's 65,535 bound values per statement.
const RECORDS_PER_STATEMENT: usize = 64;

/// Inserts `records` (distinct by task and finalist position) as [`insert`] would, many to a
/// statement; returns their ids in `records`' order.
///
/// One statement per record was a third of a report's statements, each a round trip to the
/// connection's thread. The statements insert a power of two of records each (64, 32, ... 1), so
/// that their texts are few and each is prepared once per connection.
pub(crate) async fn insert_many(e: impl Into<Exec<'_>>, records: &[NewRecord<'_>], now: i64) -> Result<Vec<RecordId>> {
    let mut e = e.into();
    if records.len() > 1
        && let Exec::Sqlite(_) = e
    {
        return insert_numbered(e, records, now).await;
    }
    let mut ids = std::collections::HashMap::with_capacity(records.len());
    let mut rest = records;
    while !rest.is_empty() {
        let n = rest.len().min(RECORDS_PER_STATEMENT);
        let n = 1 << n.ilog2();
        let (chunk, tail) = rest.split_at(n);
        rest = tail;
        let rows: Vec<(RecordId, TaskId, i64)> = on!(e.reborrow(), |c, pg| {
            let mut qb = sqlx::QueryBuilder::new(INSERT_RECORD);
            qb.push_values(chunk, |mut b, r| push_record!(b, r, now));
            qb.push(" RETURNING id, task_id, finalist_pos");
            qb.build_query_as().fetch_all(c).await
        })?;
        ids.extend(rows.into_iter().map(|(id, task, pos)| ((task, pos), id)));
    }
    records
        .iter()
        .map(|r| {
            ids.get(&(r.task_id, i64::from(r.finalist.unwrap_or(0)))).copied().ok_or_else(|| {
                crate::error::Error::Internal(format!("the record of task {} came back without its id", r.task_id))
            })
        })
        .collect()
}

/// [`insert_many`] on a SQLite connection (inside a write: SQLite has one writer at a time):
/// the records are numbered from the table's highest id on, so that no statement returns a row.
/// Each row `RETURNING` gave back crossed from sqlx's connection thread to the writer's task on
/// its own (a channel message, often a wake-up): ~25 us a record on the loaded CI machine, where
/// SQLite's own work for a record is ~19 us (2026-11-29).
async fn insert_numbered(mut e: Exec<'_>, records: &[NewRecord<'_>], now: i64) -> Result<Vec<RecordId>> {
    let first: i64 = on!(e.reborrow(), |c, pg| sqlx::query_scalar("SELECT COALESCE(MAX(id), 0) + 1 FROM records")
        .fetch_one(c)
        .await)?;
    let mut ids = Vec::with_capacity(records.len());
    let mut rest = records;
    while !rest.is_empty() {
        let n = rest.len().min(RECORDS_PER_STATEMENT);
        let n = 1 << n.ilog2();
        let (chunk, tail) = rest.split_at(n);
        rest = tail;
        let inserted = on!(e.reborrow(), |c, pg| {
            let mut qb = sqlx::QueryBuilder::new(INSERT_NUMBERED_RECORD);
            qb.push_values(chunk, |mut b, r| {
                let id = first + i64::try_from(ids.len()).unwrap_or(i64::MAX);
                ids.push(id);
                b.push_bind(id);
                push_record!(b, r, now);
            });
            qb.build().execute(c).await.map(|r| r.rows_affected())
        })?;
        if inserted != n as u64 {
            return Err(crate::error::Error::Internal(format!("{inserted} of {n} records were inserted")));
        }
    }
    Ok(ids)
}

/// Every column [`insert`] writes but the id, in the order `push_record!` binds them.
macro_rules! record_columns {
    () => {
        "task_id, job_id, worker_id, workload_key, workload, template, template_version, config, config_index,
    device_class, status, error, compile_ms, measure_ms, samples, median_us, spread, batch, baseline_us, baseline_kind,
    max_abs_err, max_rel_err, registers, smem_bytes, cache_hit, provenance, tflops, speedup, created_ms, remeasure,
    finalist_pos, token_id, untrusted, vendor_algo, energy_mj, power_w, mean_clock_mhz, temperature_c, regime,
    settle_ms, steady, baseline_energy_mj"
    };
}

/// `INSERT INTO records (...) ` for [`insert_many`]'s values.
const INSERT_RECORD: &str = concat!("INSERT INTO records (", record_columns!(), ") ");

/// [`INSERT_RECORD`] with the id first, for [`insert_numbered`].
const INSERT_NUMBERED_RECORD: &str = concat!("INSERT INTO records (id, ", record_columns!(), ") ");

/// A record's TFLOP/s and speedup over the vendor baseline, derived from its measurement (0 for
/// a failed one).
fn derived(r: &NewRecord<'_>) -> (f64, f64) {
    let m = r.measurement;
    let ok = m.status == Status::Ok && m.median_us > 0.0;
    let tflops = if ok { r.workload.flops() / m.median_us / 1e6 } else { 0.0 };
    let speedup = match m.baseline_us {
        Some(baseline) if ok && baseline > 0.0 => baseline / m.median_us,
        _ => 0.0,
    };
    (tflops, speedup)
}

/// The records `ids`.
pub(crate) async fn get_many(e: impl Into<Exec<'_>>, ids: &[RecordId]) -> Result<Vec<Record>> {
    Ok(on!(e, |c, pg| sqlx::query_as(sql(
        pg,
        "SELECT * FROM records WHERE id IN (SELECT CAST(value AS BIGINT) FROM json_each($1))"
    ))
    .bind(json(ids))
    .fetch_all(c)
    .await)?)
}

/// The content key of a measurement but its config (records with equal keys measured the same
/// kernel): a workload's configs of one template on one class, in one regime.
pub(crate) struct ContentScope<'a> {
    /// The regime it was timed in: a burst record never answers a sustained trial.
    pub(crate) regime: &'a str,
    pub(crate) workload_key: &'a str,
    pub(crate) template: &'a str,
    pub(crate) template_version: u32,
    pub(crate) device_class: &'a str,
}

/// A reusable record of one config (see [`reusable_among`]).
struct ReusableOf {
    config_index: i64,
    config: String,
    outcome: Outcome,
}

impl<'r, R: sqlx::Row> sqlx::FromRow<'r, R> for ReusableOf
where
    &'r str: sqlx::ColumnIndex<R>,
    String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Outcome: sqlx::FromRow<'r, R>,
{
    fn from_row(row: &'r R) -> std::result::Result<Self, sqlx::Error> {
        Ok(ReusableOf {
            config_index: row.try_get("config_index")?,
            config: row.try_get("config")?,
            outcome: Outcome::from_row(row)?,
        })
    }
}

/// [`reusable_among`] on PostgreSQL: the configs drive the read, a `records_by_content` seek each,
/// which its planner picks once the table has statistics (`store::statistics`).
pub(crate) const REUSABLE_AMONG_PG: &str =
    "SELECT r.config_index, r.config, r.id, r.status, r.median_us, r.untrusted IS NULL AS trusted, r.energy_mj
     FROM json_array_elements_text($5::json) AS c (value) JOIN records r ON r.config = c.value
     WHERE r.workload_key = $1 AND r.template = $2 AND r.template_version = $3 AND r.device_class = $4
       AND r.regime = $6 AND r.status NOT IN ('timeout', 'device_lost') AND NOT r.remeasure
       AND r.untrusted IS NULL";

/// [`reusable_among`] on SQLite: the configs' indexes drive the read, a `records_by_content` seek
/// each (the index keys a config by its index since migration `20261205000000`: a record's
/// entry there was mostly the config's text). The text is compared afterwards, in Rust.
pub(crate) const REUSABLE_AMONG_SQLITE: &str =
    "SELECT config_index, config, id, status, median_us, untrusted IS NULL AS trusted, energy_mj FROM records
     WHERE workload_key = $1 AND template = $2 AND template_version = $3 AND device_class = $4
       AND config_index IN (SELECT value FROM json_each($5))
       AND regime = $6 AND status NOT IN ('timeout', 'device_lost') AND NOT remeasure AND untrusted IS NULL";

/// Per config of `configs` (each its index in the template version's space and its canonical
/// JSON) that has one, the oldest tuning record of `scope` with that config whose status would
/// repeat if measured again: every status but `timeout` and `device_lost`, which say more about
/// the worker than about the kernel. Re-measurements are left out so that a trial always points
/// at a tuning record. One statement for a proposal's configs (one each before: two of the ~8
/// statements of a report went to proposing). Keyed by the config's text.
///
/// A record answers only for the config it names by both index and text: SQLite seeks by index,
/// PostgreSQL by text, and a record of an index whose text differs (a space that changed without
/// a new version) is never reused.
pub(crate) async fn reusable_among(
    e: impl Into<Exec<'_>>,
    scope: &ContentScope<'_>,
    configs: &[(u64, &str)],
) -> Result<std::collections::HashMap<String, Outcome>> {
    // On PostgreSQL, without statistics, its planner walks every record of the class through
    // `records_by_class` whichever way the query is spelled (`config IN (...)`, a join, a lateral
    // seek per config): 17-36 ms a proposal at 20,000 records, a quarter of the server's time in a
    // load run (2026-11-29), against 0.5 ms with them. A config named twice gives its rows twice,
    // which the oldest-of pick below absorbs.
    let rows: Vec<ReusableOf> = on!(e, |c, pg| {
        let keys = if pg {
            json(&configs.iter().map(|&(_, config)| config).collect::<Vec<_>>())
        } else {
            json(&configs.iter().map(|&(index, _)| index).collect::<Vec<_>>())
        };
        sqlx::query_as(if pg { REUSABLE_AMONG_PG } else { REUSABLE_AMONG_SQLITE })
            .bind(scope.workload_key)
            .bind(scope.template)
            .bind(i64::from(scope.template_version))
            .bind(scope.device_class)
            .bind(keys)
            .bind(scope.regime)
            .fetch_all(c)
            .await
    })?;
    let asked: std::collections::HashSet<(i64, &str)> =
        configs.iter().map(|&(index, config)| (i64::try_from(index).unwrap_or(-1), config)).collect();
    // The oldest is picked here: an `ORDER BY id` made SQLite walk every record of the class in
    // id order (`records_by_class`) instead of looking the configs up in `records_by_content`
    // (2026-11-28: a tracker twice as slow per task at 37,000 records).
    let mut oldest: std::collections::HashMap<String, Outcome> = std::collections::HashMap::with_capacity(rows.len());
    for r in rows {
        if !asked.contains(&(r.config_index, r.config.as_str())) {
            continue;
        }
        let kept = oldest.entry(r.config).or_insert(r.outcome);
        if r.outcome.id < kept.id {
            *kept = r.outcome;
        }
    }
    Ok(oldest)
}

from_row! {
    /// An ok trial of a workload: its config and the record its task points at.
    #[derive(Clone, Debug, PartialEq)]
    pub(crate) struct Trial {
        pub(crate) template: String,
        pub(crate) template_version: u32 as i64,
        pub(crate) config_index: i64,
        pub(crate) config: String,
        pub(crate) record_id: RecordId,
        pub(crate) median_us: f64,
        /// Millijoules per launch, when read.
        pub(crate) energy_mj: Option<f64>,
    }
}

/// The `limit` fastest ok trials of workload `idx` of `job` (by the median of the record each
/// trial points at, reused records included), fastest first. Each trial has its own config.
pub(crate) async fn fastest_trials(e: impl Into<Exec<'_>>, job: JobId, idx: u32, limit: u32) -> Result<Vec<Trial>> {
    Ok(on!(e, |c, pg| sqlx::query_as(
        "SELECT t.template, t.template_version, t.config_index, t.config, r.id AS record_id, r.median_us, r.energy_mj
         FROM tasks t JOIN records r ON r.id = t.record_id
         WHERE t.job_id = $1 AND t.workload_idx = $2 AND t.kind = 'tuning' AND t.state = 'done' AND r.status = 'ok'
           AND r.untrusted IS NULL
         ORDER BY r.median_us, r.id
         LIMIT $3",
    )
    .bind(job)
    .bind(i64::from(idx))
    .bind(i64::from(limit))
    .fetch_all(c)
    .await)?)
}

from_row! {
    /// The outcome of one finished tuning trial of a workload, as a model search reads it.
    #[derive(Clone, Debug, PartialEq)]
    pub(crate) struct TrialOutcome {
        pub(crate) template: String,
        pub(crate) template_version: u32 as i64,
        pub(crate) config_index: i64,
        pub(crate) status: Status,
        pub(crate) median_us: f64,
        /// False for a record marked untrusted.
        pub(crate) trusted: bool,
        /// Millijoules per launch, when read.
        pub(crate) energy_mj: Option<f64>,
    }
}

/// The outcomes of the finished tuning trials of workload `idx` of `job` (the record each points
/// at, reused records included), in the order they finished. Trials finished before the `trial`
/// column existed come first, in the order their tasks were last updated.
pub(crate) async fn trial_outcomes(e: impl Into<Exec<'_>>, job: JobId, idx: u32) -> Result<Vec<TrialOutcome>> {
    Ok(on!(e, |c, pg| sqlx::query_as(
        "SELECT t.template, t.template_version, t.config_index, r.status, r.median_us,
                r.untrusted IS NULL AS trusted, r.energy_mj
         FROM tasks t JOIN records r ON r.id = t.record_id
         WHERE t.job_id = $1 AND t.workload_idx = $2 AND t.kind = 'tuning' AND t.state = 'done'
         ORDER BY t.trial, t.updated_ms, t.id",
    )
    .bind(job)
    .bind(i64::from(idx))
    .fetch_all(c)
    .await)?)
}

from_row! {
    /// A stored tuning record as transfer reads it.
    #[derive(Clone, Debug)]
    pub(crate) struct PriorRecord {
        pub(crate) workload_key: String,
        pub(crate) workload: Json<Workload> as String,
        pub(crate) config: String,
        pub(crate) status: Status,
        pub(crate) median_us: f64,
    }
}

/// What a transfer prior is built from.
pub(crate) struct PriorScope<'a> {
    pub(crate) device_class: &'a str,
    pub(crate) template: &'a str,
    pub(crate) template_version: u32,
    /// Workload keys left out (the job's own).
    pub(crate) exclude: &'a [String],
    /// Only records created before this time (the job's submission), so that a restarted tracker
    /// builds the same prior.
    pub(crate) before_ms: i64,
    pub(crate) limit: u32,
}

/// The `limit` most recent tuning records in `scope`, newest first, whose status would repeat if
/// measured again (as for reuse: not `timeout` or `device_lost`).
pub(crate) async fn prior_records(e: impl Into<Exec<'_>>, scope: &PriorScope<'_>) -> Result<Vec<PriorRecord>> {
    Ok(on!(e, |c, pg| sqlx::query_as(sql(
        pg,
        "SELECT workload_key, workload, config, status, median_us FROM records
         WHERE device_class = $1 AND template = $2 AND template_version = $3
           AND workload_key NOT IN (SELECT value FROM json_each($4)) AND created_ms < $5
           AND NOT remeasure AND status NOT IN ('timeout', 'device_lost') AND untrusted IS NULL
         ORDER BY id DESC LIMIT $6",
    ))
    .bind(scope.device_class)
    .bind(scope.template)
    .bind(i64::from(scope.template_version))
    .bind(json(scope.exclude))
    .bind(scope.before_ms)
    .bind(i64::from(scope.limit))
    .fetch_all(c)
    .await)?)
}

from_row! {
    /// A re-measurement record of a finalist.
    #[derive(Clone, Copy, Debug, PartialEq)]
    pub(crate) struct Remeasure {
        pub(crate) workload_idx: u32 as i64,
        pub(crate) finalist_pos: u32 as i64,
        pub(crate) id: RecordId,
        pub(crate) status: Status,
        pub(crate) median_us: f64,
    }
}

/// The re-measurement records of every finalist task of `job`, by workload and position.
pub(crate) async fn remeasured(e: impl Into<Exec<'_>>, job: JobId) -> Result<Vec<Remeasure>> {
    Ok(on!(e, |c, pg| sqlx::query_as(
        "SELECT t.workload_idx, r.finalist_pos, r.id, r.status, r.median_us
         FROM tasks t JOIN records r ON r.task_id = t.id
         WHERE t.job_id = $1 AND t.kind = 'finalist' AND r.remeasure
         ORDER BY t.workload_idx, r.finalist_pos",
    )
    .bind(job)
    .fetch_all(c)
    .await)?)
}

/// The condition on `records` that [`best`] and [`best_per_workload`] share: a workload of a time
/// job whose finalists were re-measured competes with its verdict alone (`best_record_id`, the
/// winner's re-measurement): a trial of a config its rounds measured slower, or a trial timed
/// cooler than the rounds, would otherwise answer in its place (an f16 8192^3 bundle held a
/// finalist whose trial read 1455.5 us and whose rounds 1512 us, not the winner; H200,
/// 2026-11-28). Jobs of another objective, and workloads without re-measured finalists, compete
/// with every record.
macro_rules! not_superseded {
    () => {
        "
               AND NOT EXISTS (SELECT 1 FROM job_workloads jw JOIN jobs j ON j.id = jw.job_id
                               WHERE jw.job_id = records.job_id AND jw.workload_key = records.workload_key
                                 AND jw.finalist_gap IS NOT NULL AND jw.best_record_id <> records.id
                                 AND j.objective = 'time' AND j.max_slowdown = 0)"
    };
}

/// The fastest ok record of a workload per device class (only `device_class` when given) among
/// the records of `templates` (each `name@version`), fastest first; a re-measured time job's
/// verdict stands for its other records (`not_superseded!`).
pub(crate) async fn best(
    e: impl Into<Exec<'_>>,
    workload_key: &str,
    templates: &[String],
    device_class: Option<&str>,
    regime: Regime,
) -> Result<Vec<Record>> {
    Ok(on!(e, |c, pg| sqlx::query_as(sql(
        pg,
        concat!(
            "SELECT * FROM (
             SELECT *, ROW_NUMBER() OVER (PARTITION BY device_class ORDER BY median_us, id) AS rank
             FROM records
             WHERE workload_key = $1 AND template || '@' || template_version IN (SELECT value FROM json_each($2))
               AND status = 'ok' AND untrusted IS NULL AND ($3 IS NULL OR device_class = $3) AND regime = $4",
            not_superseded!(),
            ") AS ranked
         WHERE rank = 1
         ORDER BY median_us, id"
        ),
    ))
    .bind(workload_key)
    .bind(json(templates))
    .bind(device_class)
    .bind(regime.name())
    .fetch_all(c)
    .await)?)
}

/// The best trusted ok record per (device class, workload), counted as [`best`] counts them, among
/// workloads whose key matches the SQL `LIKE` pattern `key_like` (of the templates `name@version`
/// in `templates`, on `device_class` when given): the candidates of a nearest-shape answer.
pub(crate) async fn best_per_workload(
    e: impl Into<Exec<'_>>,
    key_like: &str,
    templates: &[String],
    device_class: Option<&str>,
    regime: Regime,
) -> Result<Vec<Record>> {
    Ok(on!(e, |c, pg| sqlx::query_as(sql(
        pg,
        concat!(
            "SELECT * FROM (
             SELECT *, ROW_NUMBER() OVER (PARTITION BY device_class, workload_key ORDER BY median_us, id) AS rank
             FROM records
             WHERE workload_key LIKE $1 AND template || '@' || template_version IN (SELECT value FROM json_each($2))
               AND status = 'ok' AND untrusted IS NULL AND ($3 IS NULL OR device_class = $3) AND regime = $4",
            not_superseded!(),
            ") AS ranked
         WHERE rank = 1
         ORDER BY device_class, workload_key"
        ),
    ))
    .bind(key_like)
    .bind(json(templates))
    .bind(device_class)
    .bind(regime.name())
    .fetch_all(c)
    .await)?)
}

/// Up to `limit` records matching `filter` with ids above `after`, oldest first.
pub(crate) async fn page(
    e: impl Into<Exec<'_>>,
    filter: &RecordFilter,
    after: RecordId,
    limit: u32,
) -> Result<Vec<Record>> {
    Ok(on!(e, |c, pg| sqlx::query_as(
        "SELECT * FROM records
         WHERE id > $1 AND ($2 IS NULL OR workload_key = $2) AND ($3 IS NULL OR device_class = $3)
           AND ($4 IS NULL OR job_id = $4) AND (NOT $5 OR (status = 'ok' AND untrusted IS NULL))
         ORDER BY id LIMIT $6",
    )
    .bind(after)
    .bind(filter.workload_key.as_deref())
    .bind(filter.device_class.as_deref())
    .bind(filter.job_id)
    .bind(filter.ok_only)
    .bind(i64::from(limit))
    .fetch_all(c)
    .await)?)
}

/// [`vendor_times`] on SQLite: the workload's workers, one index seek each (the recursive step
/// finds the next worker id above the last in `records_vendor`), then each one's latest record,
/// one seek more. A `GROUP BY worker_id` with `MAX(id)` (before 2026-11-28 evening) read every
/// record of the workload, row and all, at every ok report of a GPU worker: 1.8 ms at 2,000
/// records of a workload and class (all in the index, eight workers), 0.30 ms at 1,000 (about
/// 430 in it), growing with the workload; this takes 0.03 ms on the latter (Python's sqlite3
/// 3.40 on a copy of the schema, the same answers on four look-ups).
pub(crate) const VENDOR_TIMES_SQLITE: &str = "WITH RECURSIVE w(worker_id) AS (
         SELECT MIN(worker_id) FROM records
         WHERE workload_key = $1 AND device_class = $2 AND status = 'ok' AND untrusted IS NULL AND baseline_us > 0
           AND worker_id IS NOT NULL
         UNION ALL
         SELECT (SELECT MIN(r.worker_id) FROM records r
                 WHERE r.workload_key = $1 AND r.device_class = $2 AND r.status = 'ok' AND r.untrusted IS NULL
                   AND r.baseline_us > 0 AND r.worker_id > w.worker_id)
         FROM w WHERE w.worker_id IS NOT NULL)
     SELECT (SELECT r.baseline_us FROM records r
             WHERE r.workload_key = $1 AND r.device_class = $2 AND r.worker_id = w.worker_id
               AND r.status = 'ok' AND r.untrusted IS NULL AND r.baseline_us > 0
             ORDER BY r.id DESC LIMIT 1), w.worker_id
     FROM w WHERE w.worker_id IS NOT NULL AND w.worker_id != $3";

/// The latest trusted vendor time of `workload_key` on `device_class` from each worker other than
/// `worker`: the same vendor kernel, so they should agree.
pub(crate) async fn vendor_times(
    e: impl Into<Exec<'_>>,
    workload_key: &str,
    device_class: &str,
    worker: WorkerId,
) -> Result<Vec<f64>> {
    let rows: Vec<(f64, i64)> = on!(e, |c, pg| sqlx::query_as(if pg {
        "SELECT DISTINCT ON (worker_id) baseline_us, id FROM records
         WHERE workload_key = $1 AND device_class = $2 AND status = 'ok' AND untrusted IS NULL AND baseline_us > 0
           AND worker_id IS NOT NULL AND worker_id != $3
         ORDER BY worker_id, id DESC"
    } else {
        VENDOR_TIMES_SQLITE
    })
    .bind(workload_key)
    .bind(device_class)
    .bind(worker)
    .fetch_all(c)
    .await)?;
    Ok(rows.into_iter().map(|(t, _)| t).collect())
}

/// [`best_speedup`] on SQLite. `remeasure = 0`, spelled as in `records_trusted_speedup`'s
/// condition: SQLite uses a partial index only when the query's terms contain the index's, and
/// with `NOT remeasure` it walked every record of the class instead (`records_by_class`; 26 ms a
/// call at 40,000 records against 0.013 ms, once per ok report of a GPU worker, in the writer).
pub(crate) const BEST_SPEEDUP_SQLITE: &str = "SELECT MAX(speedup) FROM records
     WHERE template = $1 AND template_version = $2 AND device_class = $3 AND status = 'ok' AND untrusted IS NULL
       AND remeasure = 0";

/// The highest speedup over the vendor of a trusted tuning record of a template on a class.
pub(crate) async fn best_speedup(
    e: impl Into<Exec<'_>>,
    template: &str,
    template_version: u32,
    device_class: &str,
) -> Result<Option<f64>> {
    Ok(on!(e, |c, pg| sqlx::query_scalar(if pg {
        "SELECT MAX(speedup) FROM records
         WHERE template = $1 AND template_version = $2 AND device_class = $3 AND status = 'ok' AND untrusted IS NULL
           AND NOT remeasure"
    } else {
        BEST_SPEEDUP_SQLITE
    })
    .bind(template)
    .bind(i64::from(template_version))
    .bind(device_class)
    .fetch_one(c)
    .await)?)
}

/// Marks every record of worker `id` untrusted with `reason` (records already untrusted keep
/// their first reason); returns how many it marked.
pub(crate) async fn quarantine_worker(e: impl Into<Exec<'_>>, id: WorkerId, reason: &str) -> Result<u64> {
    let done =
        on!(e, |c, pg| sqlx::query("UPDATE records SET untrusted = $2 WHERE worker_id = $1 AND untrusted IS NULL")
            .bind(id)
            .bind(reason)
            .execute(c)
            .await
            .map(|r| r.rows_affected()))?;
    Ok(done)
}

/// The worker that produced record `id`.
pub(crate) async fn worker_of(e: impl Into<Exec<'_>>, id: RecordId) -> Result<Option<WorkerId>> {
    Ok(on!(e, |c, pg| sqlx::query_scalar("SELECT worker_id FROM records WHERE id = $1")
        .bind(id)
        .fetch_optional(c)
        .await)?
    .flatten())
}

/// Marks record `id` untrusted with `reason` unless it already is.
pub(crate) async fn distrust(e: impl Into<Exec<'_>>, id: RecordId, reason: &str) -> Result<()> {
    on!(e, |c, pg| sqlx::query("UPDATE records SET untrusted = $2 WHERE id = $1 AND untrusted IS NULL")
        .bind(id)
        .bind(reason)
        .execute(c)
        .await
        .map(|r| r.rows_affected()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn memory_db() -> sqlx::SqlitePool {
        let pool = sqlx::sqlite::SqlitePoolOptions::new().max_connections(1).connect("sqlite::memory:").await.unwrap();
        crate::store::migrator(crate::store::migrations::SQLITE).run(&pool).await.unwrap();
        pool
    }

    #[tokio::test]
    async fn vendor_times_are_each_other_workers_latest_trusted_ok_time() {
        let pool = memory_db().await;
        sqlx::query("PRAGMA foreign_keys = OFF").execute(&pool).await.unwrap();
        /// id, worker, workload, status, untrusted, baseline_us.
        type Row<'a> = (i64, Option<i64>, &'a str, &'a str, Option<&'a str>, f64);
        let rows: [Row<'_>; 9] = [
            (1, Some(1), "wk", "ok", None, 9.0),
            (2, Some(2), "wk", "ok", None, 8.0),
            (3, Some(1), "wk", "ok", None, 9.5),
            (4, Some(2), "wk", "ok", Some("quarantined"), 7.0),
            (5, Some(2), "wk", "compile_error", None, 6.0),
            (6, Some(3), "wk", "ok", None, 5.0),
            (7, None, "wk", "ok", None, 4.0),
            (8, Some(4), "other", "ok", None, 3.0),
            (9, Some(5), "wk", "ok", None, 0.0),
        ];
        for (id, worker, workload, status, untrusted, baseline) in rows {
            sqlx::query(
                "INSERT INTO records (id, task_id, job_id, worker_id, workload_key, workload, template, template_version,
                     config, config_index, device_class, status, error, compile_ms, measure_ms, samples, median_us,
                     spread, batch, baseline_us, baseline_kind, registers, smem_bytes, cache_hit, provenance, tflops,
                     speedup, created_ms, untrusted)
                 VALUES ($1, $1, 1, $2, $3, '{}', 'wmma_gemm', 1, '{}', $1, 'h200', $4, '', 1, 1, '[]', 10, 0, 1, $5,
                     'cublas', 64, 0, 0, '{}', 1, 1, $1, $6)",
            )
            .bind(id)
            .bind(worker)
            .bind(workload)
            .bind(status)
            .bind(baseline)
            .bind(untrusted)
            .execute(&pool)
            .await
            .unwrap();
        }
        let mut times = vendor_times(crate::store::Exec::SqlitePool(&pool), "wk", "h200", 3).await.unwrap();
        times.sort_by(f64::total_cmp);
        assert_eq!(times, [8.0, 9.5], "worker 1's latest, worker 2's latest trusted ok one; not 3's own");
        let mut times = vendor_times(crate::store::Exec::SqlitePool(&pool), "wk", "h200", 1).await.unwrap();
        times.sort_by(f64::total_cmp);
        assert_eq!(times, [5.0, 8.0]);
        assert!(vendor_times(crate::store::Exec::SqlitePool(&pool), "wk", "a100", 0).await.unwrap().is_empty());
    }

    /// The reuse lookup seeks `records_by_content` by the configs' indexes on SQLite, and a record
    /// answers only for the config it names by both index and text.
    #[tokio::test]
    async fn reuse_seeks_configs_by_index_and_matches_their_text() {
        let pool = memory_db().await;
        let plan: Vec<(i64, i64, i64, String)> =
            sqlx::query_as(sqlx::AssertSqlSafe(format!("EXPLAIN QUERY PLAN {REUSABLE_AMONG_SQLITE}")))
                .bind("wk")
                .bind("wmma_gemm")
                .bind(1_i64)
                .bind("h200")
                .bind("[5, 6]")
                .bind("burst")
                .fetch_all(&pool)
                .await
                .unwrap();
        let steps: Vec<&str> = plan.iter().map(|p| p.3.as_str()).collect();
        assert!(
            steps.iter().any(|s| s.contains("USING INDEX records_by_content") && s.contains("config_index=?")),
            "the plan should seek records_by_content by config index: {steps:?}"
        );
        sqlx::query("PRAGMA foreign_keys = OFF").execute(&pool).await.unwrap();
        // id, config index, config: record 3 is a later one of index 5; 2 names index 6 with
        // another text than the one asked for.
        for (id, index, config) in [(1, 5, r#"{"a":1}"#), (2, 6, r#"{"b":2}"#), (3, 5, r#"{"a":1}"#)] {
            sqlx::query(
                "INSERT INTO records (id, task_id, job_id, worker_id, workload_key, workload, template, template_version,
                     config, config_index, device_class, status, error, compile_ms, measure_ms, samples, median_us,
                     spread, batch, baseline_us, baseline_kind, registers, smem_bytes, cache_hit, provenance, tflops,
                     speedup, created_ms)
                 VALUES ($1, $1, 1, 1, 'wk', '{}', 'wmma_gemm', 1, $2, $3, 'h200', 'ok', '', 1, 1, '[]', 10, 0, 1, NULL,
                     'cublas', 64, 0, 0, '{}', 1, 1, $1)",
            )
            .bind(id)
            .bind(config)
            .bind(index)
            .execute(&pool)
            .await
            .unwrap();
        }
        let scope = ContentScope {
            regime: "burst",
            workload_key: "wk",
            template: "wmma_gemm",
            template_version: 1,
            device_class: "h200",
        };
        let found = reusable_among(
            crate::store::Exec::SqlitePool(&pool),
            &scope,
            &[(5, r#"{"a":1}"#), (6, r#"{"a":2}"#), (7, r#"{"b":2}"#)],
        )
        .await
        .unwrap();
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[r#"{"a":1}"#].id, 1, "the oldest record of the config");
    }

    /// SQLite takes a partial index only when the query's terms contain the index's condition:
    /// a query spelled differently walks another index, which no result shows, only its time.
    #[tokio::test]
    async fn the_best_speedup_look_up_uses_its_partial_index_on_sqlite() {
        let pool = memory_db().await;
        let plan: Vec<(i64, i64, i64, String)> =
            sqlx::query_as(sqlx::AssertSqlSafe(format!("EXPLAIN QUERY PLAN {BEST_SPEEDUP_SQLITE}")))
                .bind("wmma_gemm")
                .bind(1_i64)
                .bind("h200")
                .fetch_all(&pool)
                .await
                .unwrap();
        let steps: Vec<&str> = plan.iter().map(|p| p.3.as_str()).collect();
        assert!(
            steps.iter().any(|s| s.contains("USING INDEX records_trusted_speedup")),
            "the plan should seek records_trusted_speedup: {steps:?}"
        );
    }
}
