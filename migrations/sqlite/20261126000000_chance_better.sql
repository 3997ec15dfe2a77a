-- When a workload's tuning ended: the model's chance that a config it did not try is at least 2%
-- faster than the best it found (model tuner only; NULL otherwise and for workloads that ended
-- before this column existed).
ALTER TABLE job_workloads ADD COLUMN chance_better REAL;
