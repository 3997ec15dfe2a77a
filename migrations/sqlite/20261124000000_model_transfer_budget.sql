-- Model-guided search: the `model` tuner, transfer from other workloads' records, and a job-wide
-- trial budget shared across workloads by expected gain.
--
-- `jobs.tuner` has a CHECK that SQLite cannot alter in place, so `jobs` is rebuilt. It is the
-- parent of foreign keys (job_workloads, tasks and records point at it); as in the previous
-- migration, deferring them keeps this file one transaction: dropping `jobs` counts its children as
-- violations, re-inserting the same ids resolves them, and the commit checks the count is zero.
PRAGMA defer_foreign_keys = ON;

CREATE TABLE _jobs_v2 AS SELECT * FROM jobs;
DROP TABLE jobs;

CREATE TABLE jobs (
    id                INTEGER PRIMARY KEY,
    state             TEXT NOT NULL CHECK (state IN ('queued', 'running', 'done', 'cancelled', 'failed')),
    template          TEXT NOT NULL,
    template_version  INTEGER NOT NULL,
    tuner             TEXT NOT NULL CHECK (tuner IN ('random', 'grid', 'model')),
    device_class      TEXT NOT NULL REFERENCES device_classes (key),
    trials            INTEGER NOT NULL CHECK (trials > 0),
    batch_size        INTEGER NOT NULL CHECK (batch_size > 0),
    seed              INTEGER NOT NULL,
    samples           INTEGER NOT NULL CHECK (samples > 0),
    label             TEXT NOT NULL,
    early_stop_trials INTEGER NOT NULL CHECK (early_stop_trials >= 0),
    early_stop_margin REAL NOT NULL CHECK (early_stop_margin BETWEEN 0 AND 1),
    finalists         INTEGER NOT NULL DEFAULT 1 CHECK (finalists BETWEEN 1 AND 16),
    finalist_rounds   INTEGER NOT NULL DEFAULT 3 CHECK (finalist_rounds BETWEEN 1 AND 20),
    flush_l2          INTEGER NOT NULL DEFAULT 0 CHECK (flush_l2 IN (0, 1)),
    -- Whether a `model` search starts from other workloads' records on the same device class and
    -- template version (ignored by the other tuners). Earlier jobs never used a model; 1 is the
    -- wire's default.
    transfer          INTEGER NOT NULL DEFAULT 1 CHECK (transfer IN (0, 1)),
    -- Tuning trials the whole job may measure, shared across its workloads by expected gain;
    -- 0: no job-wide budget (each workload tunes to its own target).
    total_trials      INTEGER NOT NULL DEFAULT 0 CHECK (total_trials BETWEEN 0 AND 1000000),
    error             TEXT NOT NULL DEFAULT '',
    created_ms        INTEGER NOT NULL,
    updated_ms        INTEGER NOT NULL,
    finished_ms       INTEGER
) STRICT;

INSERT INTO jobs (id, state, template, template_version, tuner, device_class, trials, batch_size, seed, samples,
                  label, early_stop_trials, early_stop_margin, finalists, finalist_rounds, flush_l2, error,
                  created_ms, updated_ms, finished_ms)
SELECT id, state, template, template_version, tuner, device_class, trials, batch_size, seed, samples, label,
       early_stop_trials, early_stop_margin, finalists, finalist_rounds, flush_l2, error, created_ms, updated_ms,
       finished_ms
FROM _jobs_v2 ORDER BY id;

DROP TABLE _jobs_v2;

CREATE INDEX jobs_by_state ON jobs (state, id);

-- Tasks: the position of a finished tuning task among its workload's finished trials (1, 2, ...),
-- so that a restarted tracker hands a model its observations in the order they came. NULL until
-- the task is done, and for tasks that finished before this column existed (they sort first).
ALTER TABLE tasks ADD COLUMN trial INTEGER CHECK (trial > 0);

-- Transfer reads the most recent tuning records of a device class, template and version.
CREATE INDEX records_by_class ON records (device_class, template, template_version, id);
