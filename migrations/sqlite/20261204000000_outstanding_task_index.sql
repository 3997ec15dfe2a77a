-- `tasks_by_state` holds outstanding tasks only. It held every task, so a task's move to `done`
-- deleted its entry and inserted another, and the done tasks, nearly all of them, stayed in it for
-- good. Every query it serves asks for pending or leased tasks (the lease, the outstanding counts,
-- the cancellation of a workload's unfinished tasks, the reaper's expired leases); SQLite takes a
-- partial index only when the query's terms imply the index's condition, which `state = 'pending'`
-- does for this one (one side of the OR), and `state IN ('pending', 'leased')` does not: the
-- queries that mean both say `(state = 'pending' OR state = 'leased')` on SQLite.
DROP INDEX tasks_by_state;
CREATE INDEX tasks_by_state ON tasks (state, job_id, id) WHERE state = 'pending' OR state = 'leased';
