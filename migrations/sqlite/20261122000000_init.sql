-- The tracker's database: the source of truth for jobs, tasks and measurement records. A tracker
-- killed at any point and restarted on the same file resumes every unfinished job from here.
--
-- Times are milliseconds since the Unix epoch. JSON columns hold canonical serde JSON of the
-- kernels crate's types (workloads, targets, configs), so they can be parsed back without the
-- protocol. Ids are SQLite rowids; u64 seeds are stored as their i64 bit pattern.

-- What makes timings comparable, and the limits validity rules need. One row per class key,
-- written when a worker of that class registers.
CREATE TABLE device_classes (
    key         TEXT PRIMARY KEY NOT NULL,
    name        TEXT NOT NULL,
    arch        INTEGER NOT NULL,
    sm_count    INTEGER NOT NULL,
    -- kernels::Target as JSON.
    target      TEXT NOT NULL,
    created_ms  INTEGER NOT NULL,
    updated_ms  INTEGER NOT NULL
) STRICT;

CREATE TABLE workers (
    id            INTEGER PRIMARY KEY,
    name          TEXT NOT NULL,
    device_class  TEXT NOT NULL REFERENCES device_classes (key),
    -- The full device description (limits and provenance) as JSON.
    device        TEXT NOT NULL,
    -- ["wmma_gemm@1", ...]: the templates and versions the worker can generate.
    templates     TEXT NOT NULL,
    registered_ms INTEGER NOT NULL,
    last_seen_ms  INTEGER NOT NULL,
    state         TEXT NOT NULL CHECK (state IN ('online', 'offline'))
) STRICT;

CREATE TABLE jobs (
    id                INTEGER PRIMARY KEY,
    state             TEXT NOT NULL CHECK (state IN ('queued', 'running', 'done', 'cancelled', 'failed')),
    template          TEXT NOT NULL,
    template_version  INTEGER NOT NULL,
    tuner             TEXT NOT NULL CHECK (tuner IN ('random', 'grid')),
    device_class      TEXT NOT NULL REFERENCES device_classes (key),
    trials            INTEGER NOT NULL CHECK (trials > 0),
    batch_size        INTEGER NOT NULL CHECK (batch_size > 0),
    seed              INTEGER NOT NULL,
    samples           INTEGER NOT NULL CHECK (samples > 0),
    label             TEXT NOT NULL,
    early_stop_trials INTEGER NOT NULL CHECK (early_stop_trials >= 0),
    early_stop_margin REAL NOT NULL CHECK (early_stop_margin BETWEEN 0 AND 1),
    error             TEXT NOT NULL DEFAULT '',
    created_ms        INTEGER NOT NULL,
    updated_ms        INTEGER NOT NULL,
    finished_ms       INTEGER
) STRICT;

CREATE INDEX jobs_by_state ON jobs (state, id);

-- One row per workload of a job: its budget and progress. `proposed`, `done` and `reused` count
-- tasks; `stall_*` is the early-stopping reference (the best that last improved by more than the
-- margin, and `done` when it did).
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
    state          TEXT NOT NULL CHECK (state IN ('running', 'done', 'early_stopped', 'exhausted')),
    best_record_id INTEGER REFERENCES records (id),
    stall_best_us  REAL,
    stall_since    INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (job_id, idx)
) STRICT;

CREATE TABLE tasks (
    id               INTEGER PRIMARY KEY,
    job_id           INTEGER NOT NULL REFERENCES jobs (id),
    workload_idx     INTEGER NOT NULL,
    config_index     INTEGER NOT NULL,
    -- Canonical JSON of the config (sorted keys).
    config           TEXT NOT NULL,
    state            TEXT NOT NULL CHECK (state IN ('pending', 'leased', 'done', 'cancelled')),
    -- The holder while leased; afterwards the last holder, whose late report is still accepted.
    worker_id        INTEGER REFERENCES workers (id),
    lease_expires_ms INTEGER,
    -- Leases handed out; a task whose lease expired this many times is recorded as device_lost.
    attempts         INTEGER NOT NULL DEFAULT 0,
    record_id        INTEGER REFERENCES records (id),
    -- Done without a measurement: record_id points at an earlier job's identical record.
    reused           INTEGER NOT NULL DEFAULT 0,
    created_ms       INTEGER NOT NULL,
    updated_ms       INTEGER NOT NULL,
    FOREIGN KEY (job_id, workload_idx) REFERENCES job_workloads (job_id, idx),
    CONSTRAINT tasks_config_unique UNIQUE (job_id, workload_idx, config_index)
) STRICT;

-- Leasing scans pending tasks oldest job first; the reaper scans leased tasks by expiry.
CREATE INDEX tasks_by_state ON tasks (state, job_id, id);
CREATE INDEX tasks_by_lease ON tasks (state, lease_expires_ms);
CREATE INDEX tasks_by_worker ON tasks (worker_id, state);

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
    -- Idempotency: one record per task, however often a worker reports it.
    CONSTRAINT records_task_unique UNIQUE (task_id)
) STRICT;

-- Reuse looks records up by content; best queries rank ok records of a workload by time.
CREATE INDEX records_by_content ON records (workload_key, template, template_version, device_class, config);
CREATE INDEX records_best ON records (workload_key, template, template_version, device_class, median_us)
    WHERE status = 'ok';
CREATE INDEX records_by_job ON records (job_id, id);
CREATE INDEX records_by_worker ON records (worker_id);
