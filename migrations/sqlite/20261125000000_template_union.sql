-- One search space per workload across templates: a job that names no template searches every
-- template that supports its workloads on its device class, so a job has a list of templates and
-- each task has its own.
--
-- `tasks` gets its template, and its UNIQUE key (one task per config of a workload) must name the
-- template too (two templates' spaces share config indices), a constraint SQLite cannot alter in
-- place, so `tasks` is rebuilt. It is the parent of `records.task_id`; as in the earlier
-- migrations, deferring foreign keys keeps this file one transaction: dropping `tasks` counts its
-- children as violations, re-inserting the same ids resolves them, and the commit checks that the
-- count is back to zero.
PRAGMA defer_foreign_keys = ON;

-- Jobs: the templates the job searches, in slot order, as a JSON list of "name@version" (a
-- candidate of the search is a slot of this list and a config index in that template's space).
-- `template` stays a display name ("wmma_gemm", or "wmma_gemm+wgmma_gemm" for several) and
-- `template_version` the version of a single template (0 when there are several). Jobs before this
-- migration searched their one template.
ALTER TABLE jobs ADD COLUMN templates TEXT NOT NULL DEFAULT '[]';
UPDATE jobs SET templates = json_array(template || '@' || template_version);

CREATE TABLE _tasks_v3 AS SELECT * FROM tasks;
DROP TABLE tasks;

CREATE TABLE tasks (
    id               INTEGER PRIMARY KEY,
    job_id           INTEGER NOT NULL REFERENCES jobs (id),
    workload_idx     INTEGER NOT NULL,
    kind             TEXT NOT NULL DEFAULT 'tuning' CHECK (kind IN ('tuning', 'finalist')),
    -- The template and version a tuning task's config belongs to. A finalist task has none of its
    -- own ('' and 0, as its config is '' and -1): each entry of `finalists` names its template.
    template         TEXT NOT NULL,
    template_version INTEGER NOT NULL,
    -- Index of the config in its template's space (-1 for a finalist task).
    config_index     INTEGER NOT NULL,
    -- Canonical JSON of the config (sorted keys).
    config           TEXT NOT NULL,
    -- A finalist task's list as JSON (empty for a tuning task): [{"template": "wgmma_gemm",
    -- "template_version": 2, "config_index": 12, "config": "{...}", "record_id": 40,
    -- "tuned_us": 8.1}, ...].
    finalists        TEXT NOT NULL DEFAULT '[]',
    state            TEXT NOT NULL CHECK (state IN ('pending', 'leased', 'done', 'cancelled')),
    -- The holder while leased; afterwards the last holder, whose late report is still accepted.
    worker_id        INTEGER REFERENCES workers (id),
    lease_expires_ms INTEGER,
    -- Leases handed out; a task whose lease expired this many times is recorded as device_lost.
    attempts         INTEGER NOT NULL DEFAULT 0,
    record_id        INTEGER REFERENCES records (id),
    -- Done without a measurement: record_id points at an earlier job's identical record.
    reused           INTEGER NOT NULL DEFAULT 0,
    -- The position of a finished tuning task among its workload's finished trials (1, 2, ...).
    trial            INTEGER CHECK (trial > 0),
    created_ms       INTEGER NOT NULL,
    updated_ms       INTEGER NOT NULL,
    FOREIGN KEY (job_id, workload_idx) REFERENCES job_workloads (job_id, idx),
    CONSTRAINT tasks_config_unique UNIQUE (job_id, workload_idx, template, config_index)
) STRICT;

-- Existing tuning tasks get their job's template; existing finalist tasks get it in every entry
-- of their list (json_set keeps each entry's other fields; json_each walks the list in order).
INSERT INTO tasks (id, job_id, workload_idx, kind, template, template_version, config_index, config, finalists,
                   state, worker_id, lease_expires_ms, attempts, record_id, reused, trial, created_ms, updated_ms)
SELECT t.id, t.job_id, t.workload_idx, t.kind,
       CASE t.kind WHEN 'tuning' THEN j.template ELSE '' END,
       CASE t.kind WHEN 'tuning' THEN j.template_version ELSE 0 END,
       t.config_index, t.config,
       CASE t.kind WHEN 'tuning' THEN t.finalists ELSE (
           SELECT json_group_array(json_set(f.value, '$.template', j.template, '$.template_version',
                                            j.template_version))
           FROM json_each(t.finalists) AS f) END,
       t.state, t.worker_id, t.lease_expires_ms, t.attempts, t.record_id, t.reused, t.trial, t.created_ms,
       t.updated_ms
FROM _tasks_v3 t JOIN jobs j ON j.id = t.job_id
ORDER BY t.id;

DROP TABLE _tasks_v3;

-- Leasing scans pending tasks oldest job first; the reaper scans leased tasks by expiry.
CREATE INDEX tasks_by_state ON tasks (state, job_id, id);
CREATE INDEX tasks_by_lease ON tasks (state, lease_expires_ms);
CREATE INDEX tasks_by_worker ON tasks (worker_id, state);
