-- No planner statistics for tasks.state: the planner then takes any one state for a small part of
-- the tasks, which pending and leased tasks are (a job's batch of them at most, while done tasks
-- pile up). Statistics of the column were only ever stale: gathered while a job's first batch was
-- all pending, they made the lease's plan walk the job's tasks by id through tasks_pkey, or read
-- the whole table, past thousands of done tasks (1 ms a job, 20 ms a lease, 2026-11-29). An
-- ANALYZE now passes the column over; statistics an earlier one left stay until the table is
-- analyzed with the column's target set again.
ALTER TABLE tasks ALTER COLUMN state SET STATISTICS 0;
