-- A workload's weight in its job's trial budget: as
-- migrations/sqlite/20261129000000_workload_weight.sql.
ALTER TABLE job_workloads ADD COLUMN weight DOUBLE PRECISION;
