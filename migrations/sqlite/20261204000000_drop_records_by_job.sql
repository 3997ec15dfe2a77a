-- `records_by_job` (job, id) served one query: prune's, which now reaches an ended job's records
-- through its tasks (`tasks_config_unique` leads with the job, `records_task_unique` with the
-- task). The records page filtered by job never used it (`$4 IS NULL OR job_id = $4` is no
-- index term: it walks the primary key from its cursor). Every record insert paid for its b-tree
-- (issue 40).
DROP INDEX IF EXISTS records_by_job;
