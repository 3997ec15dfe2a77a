-- The lease indexes hold leased tasks only. `tasks_by_lease` (state, lease_expires_ms) and
-- `tasks_by_worker` (worker_id, state) held every task, so each task's two moves (pending ->
-- leased -> done) deleted and inserted an entry in both, and the done tasks, nearly all of them,
-- stayed in both for good. Every query they serve asks for `state = 'leased'` (the reaper's
-- expired leases, a worker's held and finalist tasks, the leased count per worker), which SQLite
-- matches to these conditions; a pending task now enters neither, and a done one leaves both.
DROP INDEX tasks_by_lease;
CREATE INDEX tasks_by_lease ON tasks (lease_expires_ms) WHERE state = 'leased';
DROP INDEX tasks_by_worker;
CREATE INDEX tasks_by_worker ON tasks (worker_id) WHERE state = 'leased';
