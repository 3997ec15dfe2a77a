//! Planner statistics on PostgreSQL: the tracker runs `ANALYZE` on a table that doubled since its
//! last one, since autovacuum may wait a minute to look.
//!
//! PostgreSQL plans a statement from its tables' statistics, and a new database has none: the
//! tracker fills its tables from empty in seconds, long before autovacuum's first look (once a
//! minute). Plans made meanwhile assume any column picks few rows, and a connection keeps a
//! statement's generic plan until the statistics change. In a load run (2026-11-29) the reuse
//! lookup of a proposal (`records::reusable_among`) then walked every record of the class through
//! `records_by_class` instead of seeking `records_by_content`: 17-36 ms a call at 20,000 records
//! against 0.4-0.5 ms with statistics. An `ANALYZE` here gives every later plan statistics and
//! makes every connection plan its statements again.
//!
//! A table is analyzed once it has [`MIN_ROWS`] rows and twice the rows it had at its last
//! `ANALYZE` (anyone's: autovacuum's too): a growing table is analyzed each time it doubled, so
//! the `ANALYZE`s of a table's life cost about two of its final size, and a table that only
//! changes (tasks moving from pending to done, workers' heartbeats) is left to autovacuum. Its
//! trigger (a tenth of the rows changed) comes long before a doubling on a table it keeps up with.
//! SQLite needs none of this: its planner does not look at sizes or values (`stable_plans`), and
//! queries that need an index name it (`INDEXED BY`).

use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use super::Pool;

/// How often the tables' rows are counted: a load run fills `tasks` with thousands of rows in its
/// first second.
const POLL: Duration = Duration::from_secs(1);

/// Rows a table needs before its first `ANALYZE`: below this a plan made without statistics
/// reads little whatever it is (the reuse lookup's walk of a class took 1.5 us a record), and
/// autovacuum analyzes any table over 50 changes within its minute anyway.
pub(crate) const MIN_ROWS: i64 = 1_000;

/// The statistics target of the tracker's `ANALYZE` (PostgreSQL's default is 100): it samples
/// 300 rows per unit, so 3,000 rows at most, enough to tell a column of one value (a class, a
/// template) from one of thousands (a config). At 20,000 records the `ANALYZE` of `records`'
/// planned columns took 4.6 ms with it against 255 ms with the default (2026-11-29).
const TARGET: u32 = 10;

/// The advisory lock key of an `ANALYZE` ("tnanalyz" in ASCII, apart from `WRITER_LOCK`'s): when
/// several trackers share the database one analyzes while the others skip their turn.
const ANALYZE_LOCK: i64 = 0x746e_616e_616c_797a;

/// The tables whose statistics the tracker's plans depend on, each with the columns its
/// statements filter, join or group on (the wide ones, the records' JSON and samples, took
/// nine tenths of a whole-table `ANALYZE`), or `None` for every column (small tables).
const TABLES: &[(&str, Option<&str>)] = &[
    // Not `state`: a migration keeps its statistics off (a few pending tasks among many done is
    // what the planner should always expect).
    ("tasks", Some("job_id, kind, workload_idx, template, template_version, worker_id, lease_expires_ms")),
    (
        "records",
        Some(
            "workload_key, template, template_version, device_class, config, regime, status, job_id, task_id, \
             worker_id, remeasure, untrusted",
        ),
    ),
    ("jobs", None),
    ("job_workloads", None),
    ("workers", None),
];

/// Analyzes the tables due (see the module's notes) every [`POLL`] until `stop`, on PostgreSQL;
/// returns at once on SQLite. A failed round is logged and tried again at the next.
pub(crate) async fn keep_current(pool: Pool, stop: CancellationToken) {
    let Pool::Postgres(pool) = pool else { return };
    let mut tick = tokio::time::interval(POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => match analyze_due(&pool).await {
                Ok(tables) if !tables.is_empty() => tracing::debug!(?tables, "analyzed"),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "analyzing the grown tables failed; trying again"),
            },
        }
    }
}

/// Runs `ANALYZE` on each of [`TABLES`] that has [`MIN_ROWS`] rows and twice as many as at its
/// last `ANALYZE`, and returns their names; none while another tracker's `ANALYZE` runs. The rows
/// are PostgreSQL's counts, which each connection sends every second or so.
pub(crate) async fn analyze_due(pool: &PgPool) -> sqlx::Result<Vec<&'static str>> {
    let mut tx = pool.begin().await?;
    let ours: bool =
        sqlx::query_scalar("SELECT pg_try_advisory_xact_lock($1)").bind(ANALYZE_LOCK).fetch_one(&mut *tx).await?;
    if !ours {
        return Ok(Vec::new());
    }
    let names: Vec<&str> = TABLES.iter().map(|&(name, _)| name).collect();
    let grown: Vec<String> = sqlx::query_scalar(
        "SELECT s.relname::text FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
         WHERE s.schemaname = current_schema() AND s.relname = ANY($1)
           AND s.n_live_tup >= GREATEST($2, 2 * c.reltuples)",
    )
    .bind(&names)
    .bind(MIN_ROWS)
    .fetch_all(&mut *tx)
    .await?;
    let due: Vec<_> = TABLES.iter().filter(|(name, _)| grown.iter().any(|g| g == name)).collect();
    if due.is_empty() {
        return Ok(Vec::new());
    }
    sqlx::query("SELECT set_config('default_statistics_target', $1, true)")
        .bind(TARGET.to_string())
        .execute(&mut *tx)
        .await?;
    for (name, columns) in &due {
        // Names and columns are this file's constants, never input.
        let statement = match columns {
            Some(columns) => format!("ANALYZE {name} ({columns})"),
            None => format!("ANALYZE {name}"),
        };
        sqlx::query(sqlx::AssertSqlSafe(statement)).execute(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok(due.into_iter().map(|&(name, _)| name).collect())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use sqlx::{AssertSqlSafe, Connection, PgConnection};

    use super::*;

    /// Jobs the test's tasks and records are spread over, a workload each.
    const JOBS: i64 = 20;

    /// The jobs (with their class and workloads) and pending tasks `from..to` with their records,
    /// task `n` of job `n % JOBS + 1`, with a config as wide as a real one.
    async fn fill(pool: &PgPool, from: i64, to: i64) {
        let mut tx = pool.begin().await.unwrap();
        if from == 0 {
            for statement in [
                "INSERT INTO device_classes (key, name, arch, sm_count, target, created_ms, updated_ms)
                 VALUES ('sim', 'sim', 90, 132, '{}', 0, 0)",
                "INSERT INTO jobs (id, state, template, template_version, tuner, device_class, trials, batch_size, seed,
                                   samples, label, early_stop_trials, early_stop_margin, created_ms, updated_ms)
                 SELECT j, 'running', 'wmma_gemm', 6, 'random', 'sim', 100000, 256, 1, 5, '', 0, 0, 0, 0
                 FROM generate_series(1, $1) j",
                "INSERT INTO job_workloads (job_id, idx, workload_key, workload, trials_target, space_size, state)
                 SELECT j, 0, 'matmul/m256n512k512/nn/f16,f32,f32/' || j, '{}', 100000, 100000, 'running'
                 FROM generate_series(1, $1) j",
            ] {
                sqlx::query(statement).bind(JOBS).execute(&mut *tx).await.unwrap();
            }
        }
        for statement in [
            "INSERT INTO tasks (id, job_id, workload_idx, template, template_version, config_index, config, state,
                                created_ms, updated_ms)
             SELECT n + 1, n % $3 + 1, 0, 'wmma_gemm', 6, n, '{}', 'pending', 0, 0 FROM generate_series($1, $2 - 1) n",
            "INSERT INTO records (task_id, job_id, workload_key, workload, template, template_version, config,
                                  config_index, device_class, status, error, compile_ms, measure_ms, samples, median_us,
                                  spread, batch, baseline_kind, registers, smem_bytes, cache_hit, provenance, tflops,
                                  speedup, created_ms)
             SELECT n + 1, n % $3 + 1, 'matmul/m256n512k512/nn/f16,f32,f32/' || n % $3 + 1, '{}', 'wmma_gemm', 6,
                    '{\"block_k\":64,\"block_m\":32,\"block_n\":128,\"frag\":\"m16n16k16\",\"split_k\":1,\"i\":' || n || '}',
                    n, 'sim', 'ok', '', 1, 1, '[]', 10 + n, 0, 1, '', 64, 0, FALSE, '{}', 1, 1, 0
             FROM generate_series($1, $2 - 1) n",
        ] {
            sqlx::query(statement).bind(from).bind(to).bind(JOBS).execute(&mut *tx).await.unwrap();
        }
        tx.commit().await.unwrap();
    }

    /// Waits until PostgreSQL's statistics count `rows` live rows in `records` (each connection
    /// sends its counts every second or so, or once idle for longer).
    async fn counted(pool: &PgPool, rows: i64) {
        for _ in 0..300 {
            let seen: i64 = sqlx::query_scalar(
                "SELECT n_live_tup FROM pg_stat_user_tables WHERE schemaname = current_schema() AND relname = 'records'",
            )
            .fetch_one(pool)
            .await
            .unwrap();
            if seen >= rows {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("PostgreSQL's statistics never counted {rows} records");
    }

    /// `EXPLAIN (COSTS OFF)` of `statement`, one text.
    fn explain(statement: &str) -> AssertSqlSafe<String> {
        AssertSqlSafe(format!("EXPLAIN (COSTS OFF) {statement}"))
    }

    /// On PostgreSQL (`TENSORTUNE_TEST_PG`): a new database's tables are analyzed once they have
    /// [`MIN_ROWS`] rows, not before, and not again until they double; only the planned columns
    /// get statistics. The reuse lookup then seeks `records_by_content` (without statistics it
    /// walked `records_by_class`), and the lease still seeks pending tasks by job once most are
    /// done, though every task was pending when the table was analyzed.
    #[tokio::test]
    async fn grown_tables_are_analyzed_and_the_plans_then_seek_their_indexes() {
        let server = match std::env::var("TENSORTUNE_TEST_PG") {
            Ok(s) if !s.is_empty() => s,
            _ => {
                eprintln!("SKIPPED: TENSORTUNE_TEST_PG is not set (the statistics are PostgreSQL's)");
                return;
            }
        };
        let name = format!("tt_{}_statistics", std::process::id());
        let mut admin = PgConnection::connect(&server).await.unwrap();
        let drop = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
        sqlx::query(AssertSqlSafe(drop.clone())).execute(&mut admin).await.unwrap();
        sqlx::query(AssertSqlSafe(format!("CREATE DATABASE {name}"))).execute(&mut admin).await.unwrap();
        let (scheme, rest) = server.split_once("://").unwrap();
        let authority = rest.split(['/', '?']).next().unwrap();
        let url = format!("{scheme}://{authority}/{name}");
        let Pool::Postgres(pool) = crate::store::open(Path::new(&url)).await.unwrap() else {
            panic!("{url} opened something else than PostgreSQL");
        };

        let half = MIN_ROWS / 2;
        fill(&pool, 0, half).await;
        counted(&pool, half).await;
        assert_eq!(analyze_due(&pool).await.unwrap(), Vec::<&str>::new(), "{half} rows are too few");

        // Enough records for a seek to beat reading them all, as the planner sees it.
        let rows = 5 * MIN_ROWS;
        fill(&pool, half, rows).await;
        counted(&pool, rows).await;
        let analyzed = analyze_due(&pool).await.unwrap();
        assert!(analyzed.contains(&"records") && analyzed.contains(&"tasks"), "{analyzed:?}");
        let columns: Vec<String> = sqlx::query_scalar(
            "SELECT tablename || '.' || attname FROM pg_stats
             WHERE schemaname = current_schema() AND tablename IN ('records', 'tasks')",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        for (analyzed, column) in [(true, "records.config"), (false, "records.samples"), (false, "tasks.state")] {
            assert_eq!(columns.iter().any(|c| c == column), analyzed, "{column}: {columns:?}");
        }
        assert_eq!(analyze_due(&pool).await.unwrap(), Vec::<&str>::new(), "analyzed again before doubling");

        let configs = [2, 702]
            .map(|n| format!(r#"{{"block_k":64,"block_m":32,"block_n":128,"frag":"m16n16k16","split_k":1,"i":{n}}}"#));
        let reuse: Vec<String> = sqlx::query_scalar(explain(crate::store::records::REUSABLE_AMONG_PG))
            .bind("matmul/m256n512k512/nn/f16,f32,f32/3")
            .bind("wmma_gemm")
            .bind(6_i64)
            .bind("sim")
            .bind(crate::store::json(&configs))
            .bind("burst")
            .fetch_all(&pool)
            .await
            .unwrap();
        let reuse = reuse.join("\n");
        assert!(reuse.contains("records_by_content") && !reuse.contains("records_by_class"), "{reuse}");

        // Most tasks done since, as in a run: the newest few of each job are pending.
        sqlx::query("UPDATE tasks SET state = 'done' WHERE id <= $1")
            .bind(rows - 5 * JOBS)
            .execute(&pool)
            .await
            .unwrap();
        let lease: Vec<String> = sqlx::query_scalar(explain(crate::store::tasks::LEASE_PG))
            .bind(1_i64)
            .bind(0_i64)
            .bind(0_i64)
            .bind("sim")
            .bind(r#"["wmma_gemm@6"]"#)
            .bind(16_i64)
            .bind(crate::store::JOB_LOCK_CLASS)
            .fetch_all(&pool)
            .await
            .unwrap();
        let lease = lease.join("\n");
        // A sequential scan or one of `tasks_pkey` reads the done tasks too.
        let walks = |alias: &str| {
            lease.lines().any(|l| {
                l.trim_end().ends_with(&format!(" on tasks {alias}"))
                    && (l.contains("Seq Scan") || l.contains("tasks_pkey"))
            })
        };
        assert!(!walks("p") && !walks("t"), "the lease reads done tasks:\n{lease}");

        pool.close().await;
        sqlx::query(AssertSqlSafe(drop)).execute(&mut admin).await.unwrap();
    }
}
