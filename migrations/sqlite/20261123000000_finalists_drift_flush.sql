-- Noise-aware winners (finalists), reference-kernel drift and L2 flushing.
--
-- Two tables change constraints SQLite cannot alter in place (a CHECK on job_workloads.state, the
-- UNIQUE key of records), so they are rebuilt. Both are parents of foreign keys (tasks points at
-- job_workloads and records; job_workloads at records), and foreign keys stay on during
-- migrations (sqlx runs each file in a transaction, where `PRAGMA foreign_keys` cannot change).
-- Deferring them instead lets this file stay one transaction with sqlx's bookkeeping: dropping a
-- parent counts its children as violations, re-inserting the same ids resolves them, and the
-- commit checks that the count is back to zero, so a rebuild that lost a row fails loudly.
PRAGMA defer_foreign_keys = ON;

-- Jobs: how many finalists to re-measure and how often, and whether to flush L2 between samples.
-- Jobs submitted before this migration did not ask for finalists: 1 keeps them disabled.
ALTER TABLE jobs ADD COLUMN finalists INTEGER NOT NULL DEFAULT 1 CHECK (finalists BETWEEN 1 AND 16);
ALTER TABLE jobs ADD COLUMN finalist_rounds INTEGER NOT NULL DEFAULT 3 CHECK (finalist_rounds BETWEEN 1 AND 20);
ALTER TABLE jobs ADD COLUMN flush_l2 INTEGER NOT NULL DEFAULT 0 CHECK (flush_l2 IN (0, 1));

-- Workers: their latest timing of the shared reference kernel (NULL until they report one), and
-- whether the tracker last found them drifting (so that it warns once when a worker becomes
-- flagged, not at every heartbeat).
ALTER TABLE workers ADD COLUMN reference_us REAL;
ALTER TABLE workers ADD COLUMN drift_flagged INTEGER NOT NULL DEFAULT 0;

-- Tasks: a finalist task re-measures a workload's fastest configs; it has no config of its own
-- (config '' and config_index -1, which also makes it one per workload under
-- tasks_config_unique), and `finalists` holds its list as JSON (empty for a tuning task):
-- [{"config_index": 12, "config": "{...}", "record_id": 40, "tuned_us": 8.1}, ...].
ALTER TABLE tasks ADD COLUMN kind TEXT NOT NULL DEFAULT 'tuning' CHECK (kind IN ('tuning', 'finalist'));
ALTER TABLE tasks ADD COLUMN finalists TEXT NOT NULL DEFAULT '[]';

CREATE TABLE _records_v1 AS SELECT * FROM records;
CREATE TABLE _job_workloads_v1 AS SELECT * FROM job_workloads;
DROP TABLE records;
DROP TABLE job_workloads;

CREATE TABLE records (
    id               INTEGER PRIMARY KEY,
    task_id          INTEGER NOT NULL REFERENCES tasks (id),
    job_id           INTEGER NOT NULL REFERENCES jobs (id),
    worker_id        INTEGER REFERENCES workers (id),
    workload_key     TEXT NOT NULL,
    workload         TEXT NOT NULL,
    template         TEXT NOT NULL,
    template_version INTEGER NOT NULL,
    config           TEXT NOT NULL,
    config_index     INTEGER NOT NULL,
    device_class     TEXT NOT NULL,
    status           TEXT NOT NULL CHECK (status IN (
        'ok', 'invalid_config', 'compile_error', 'launch_error', 'wrong_result', 'timeout', 'device_lost')),
    error            TEXT NOT NULL,
    compile_ms       REAL NOT NULL,
    measure_ms       REAL NOT NULL,
    -- JSON array of per-launch sample times, microseconds.
    samples          TEXT NOT NULL,
    median_us        REAL NOT NULL,
    spread           REAL NOT NULL,
    batch            INTEGER NOT NULL,
    baseline_us      REAL,
    baseline_kind    TEXT NOT NULL,
    max_abs_err      REAL,
    max_rel_err      REAL,
    registers        INTEGER NOT NULL,
    smem_bytes       INTEGER NOT NULL,
    cache_hit        INTEGER NOT NULL,
    -- Where the measurement was taken, as JSON.
    provenance       TEXT NOT NULL,
    tflops           REAL NOT NULL,
    speedup          REAL NOT NULL,
    created_ms       INTEGER NOT NULL,
    -- A re-measurement of a job's finalist (1), not a tuning trial (0).
    remeasure        INTEGER NOT NULL DEFAULT 0 CHECK (remeasure IN (0, 1)),
    -- The finalist's position in its finalist task's list; 0 for a tuning record.
    finalist_pos     INTEGER NOT NULL DEFAULT 0 CHECK (finalist_pos >= 0),
    -- Idempotency: one record per task and finalist position (a tuning task has one record, a
    -- finalist task one per finalist), however often a worker reports it.
    CONSTRAINT records_task_unique UNIQUE (task_id, finalist_pos)
) STRICT;

INSERT INTO records (id, task_id, job_id, worker_id, workload_key, workload, template, template_version, config,
                     config_index, device_class, status, error, compile_ms, measure_ms, samples, median_us, spread,
                     batch, baseline_us, baseline_kind, max_abs_err, max_rel_err, registers, smem_bytes, cache_hit,
                     provenance, tflops, speedup, created_ms)
SELECT id, task_id, job_id, worker_id, workload_key, workload, template, template_version, config, config_index,
       device_class, status, error, compile_ms, measure_ms, samples, median_us, spread, batch, baseline_us,
       baseline_kind, max_abs_err, max_rel_err, registers, smem_bytes, cache_hit, provenance, tflops, speedup,
       created_ms
FROM _records_v1 ORDER BY id;

-- Reuse looks records up by content; best queries rank ok records of a workload by time.
CREATE INDEX records_by_content ON records (workload_key, template, template_version, device_class, config);
CREATE INDEX records_best ON records (workload_key, template, template_version, device_class, median_us)
    WHERE status = 'ok';
CREATE INDEX records_by_job ON records (job_id, id);
CREATE INDEX records_by_worker ON records (worker_id);

-- One row per workload of a job: its budget and progress. `proposed`, `done` and `reused` count
-- tuning tasks; `stall_*` is the early-stopping reference (the best that last improved by more
-- than the margin, and `done` when it did). A workload whose tuning ended is `finalizing` while
-- its finalists are re-measured; `end_state` holds the state it takes afterwards, and
-- `finalist_gap` is set once the re-measurement chose its winner.
CREATE TABLE job_workloads (
    job_id         INTEGER NOT NULL REFERENCES jobs (id),
    idx            INTEGER NOT NULL,
    workload_key   TEXT NOT NULL,
    -- kernels::Workload as JSON.
    workload       TEXT NOT NULL,
    trials_target  INTEGER NOT NULL,
    space_size     INTEGER NOT NULL,
    proposed       INTEGER NOT NULL DEFAULT 0,
    done           INTEGER NOT NULL DEFAULT 0,
    reused         INTEGER NOT NULL DEFAULT 0,
    state          TEXT NOT NULL CHECK (state IN ('running', 'finalizing', 'done', 'early_stopped', 'exhausted')),
    best_record_id INTEGER REFERENCES records (id),
    stall_best_us  REAL,
    stall_since    INTEGER NOT NULL DEFAULT 0,
    end_state      TEXT CHECK (end_state IN ('done', 'early_stopped', 'exhausted')),
    finalist_gap   REAL,
    PRIMARY KEY (job_id, idx),
    CHECK ((state = 'finalizing') = (end_state IS NOT NULL))
) STRICT;

INSERT INTO job_workloads (job_id, idx, workload_key, workload, trials_target, space_size, proposed, done, reused,
                           state, best_record_id, stall_best_us, stall_since)
SELECT job_id, idx, workload_key, workload, trials_target, space_size, proposed, done, reused, state,
       best_record_id, stall_best_us, stall_since
FROM _job_workloads_v1 ORDER BY job_id, idx;

DROP TABLE _records_v1;
DROP TABLE _job_workloads_v1;
