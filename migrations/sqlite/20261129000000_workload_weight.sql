-- How much a workload matters to a model's job (how many times the model runs it): the scheduler
-- weighs its expected gain by it and caps its curve at the vendor's time. NULL for a job submitted
-- without weights (and for every job from before this column): weight 1, no cap.
ALTER TABLE job_workloads ADD COLUMN weight REAL;
