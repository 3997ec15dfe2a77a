-- Who may do what, and who produced each row.
--
-- Bearer tokens: the tracker keeps only the SHA-256 of each token's secret. A token is spelled
-- `tt_<id>_<secret>`; the id finds the row, the secret's hash is compared in constant time. A
-- database that has ever held a token requires one on every call (revoking the last token does
-- not open the tracker up again).
CREATE TABLE tokens (
    id            INTEGER PRIMARY KEY,
    name          TEXT NOT NULL UNIQUE,
    role          TEXT NOT NULL CHECK (role IN ('worker', 'client', 'admin')),
    secret_sha256 BLOB NOT NULL,
    created_ms    INTEGER NOT NULL,
    revoked_ms    INTEGER
) STRICT;

-- The token a job was submitted with (its owner: a client token cancels only its own jobs), the
-- token a worker registered with (its calls must carry the same one), and the token behind each
-- record. NULL where the tracker ran without tokens.
ALTER TABLE jobs ADD COLUMN token_id INTEGER REFERENCES tokens (id);
ALTER TABLE workers ADD COLUMN token_id INTEGER REFERENCES tokens (id);
ALTER TABLE records ADD COLUMN token_id INTEGER REFERENCES tokens (id);

-- Records that are not trusted: NULL for a trusted record; otherwise why not, e.g.
-- 'implausible: 0.10 us is below the device bound of 2.3 us' or 'quarantined: worker 7: ...'.
-- Untrusted records never win a workload, are never reused and never answer `best`.
ALTER TABLE records ADD COLUMN untrusted TEXT;

-- A worker an admin quarantined: its records are untrusted and it may not lease or report.
ALTER TABLE workers ADD COLUMN quarantined TEXT;

-- The plausibility checks of a report: the record speedup of a template on a class, and other
-- workers' vendor times for a workload.
CREATE INDEX records_trusted_speedup ON records (template, template_version, device_class, speedup)
    WHERE status = 'ok' AND untrusted IS NULL AND remeasure = 0;
CREATE INDEX records_vendor ON records (workload_key, device_class, worker_id)
    WHERE status = 'ok' AND untrusted IS NULL AND baseline_us > 0;
