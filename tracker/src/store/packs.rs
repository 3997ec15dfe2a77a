//! Record packs (`pack_records`): shipped or imported measurements that only the model tuner's
//! transfer prior reads (see `crate::packs`).

use crate::error::Result;
use crate::model::Status;
use crate::store::records::PriorRecord;
use crate::store::{Exec, json, on, sql};

/// One record of a pack, validated.
#[derive(Clone, Debug)]
pub(crate) struct PackRecord {
    pub(crate) workload_key: String,
    /// The workload as its JSON column.
    pub(crate) workload_json: String,
    pub(crate) workload: tensortune_kernels::Workload,
    pub(crate) template: String,
    pub(crate) template_version: u32,
    /// Canonical config JSON (`Config::to_json`).
    pub(crate) config: String,
    pub(crate) device_class: String,
    pub(crate) status: Status,
    pub(crate) median_us: f64,
}

/// Stores one record of `pack`; a record already stored (same pack, workload, template version,
/// config and class) is skipped. Returns whether it was new.
pub(crate) async fn insert(e: impl Into<Exec<'_>>, pack: &str, r: &PackRecord) -> Result<bool> {
    let done = on!(e, |c, pg| sqlx::query(sql(
        pg,
        "INSERT INTO pack_records (pack, workload_key, workload, template, template_version, config,
             device_class, status, median_us)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
         ON CONFLICT DO NOTHING",
    ))
    .bind(pack)
    .bind(&r.workload_key)
    .bind(&r.workload_json)
    .bind(&r.template)
    .bind(i64::from(r.template_version))
    .bind(&r.config)
    .bind(&r.device_class)
    .bind(r.status)
    .bind(r.median_us)
    .execute(c)
    .await
    .map(|r| r.rows_affected()))?;
    Ok(done > 0)
}

/// Pack records of one template version on device classes like `class_pattern` (an SQL LIKE
/// pattern: one class, or every class of an architecture), leaving out the workloads in
/// `exclude`, at most `limit`; with each record's device class.
pub(crate) async fn prior(
    e: impl Into<Exec<'_>>,
    template: &str,
    template_version: u32,
    class_pattern: &str,
    exclude: &[String],
    limit: u32,
) -> Result<Vec<(String, PriorRecord)>> {
    struct Row {
        device_class: String,
        record: PriorRecord,
    }
    impl<'r, R: sqlx::Row> sqlx::FromRow<'r, R> for Row
    where
        &'r str: sqlx::ColumnIndex<R>,
        String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
        PriorRecord: sqlx::FromRow<'r, R>,
    {
        fn from_row(row: &'r R) -> std::result::Result<Self, sqlx::Error> {
            Ok(Row { device_class: row.try_get("device_class")?, record: PriorRecord::from_row(row)? })
        }
    }
    let rows: Vec<Row> = on!(e, |c, pg| sqlx::query_as(sql(
        pg,
        "SELECT device_class, workload_key, workload, config, status, median_us FROM pack_records
         WHERE template = $1 AND template_version = $2 AND device_class LIKE $3
           AND workload_key NOT IN (SELECT value FROM json_each($4))
         ORDER BY id LIMIT $5",
    ))
    .bind(template)
    .bind(i64::from(template_version))
    .bind(class_pattern)
    .bind(json(exclude))
    .bind(i64::from(limit))
    .fetch_all(c)
    .await)?;
    Ok(rows.into_iter().map(|r| (r.device_class, r.record)).collect())
}
