-- How much a workload matters to a job with a trial budget (how many times a model runs it): the
-- scheduler weighs its expected gain by it. 1 for workloads of jobs from before this column.
ALTER TABLE job_workloads ADD COLUMN weight REAL NOT NULL DEFAULT 1;
