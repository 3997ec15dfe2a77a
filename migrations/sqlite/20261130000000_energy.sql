-- Energy and the clock regime (issue 39). Every record may carry the energy per launch its
-- worker read from NVML's counter over the timed window, the mean power, mean SM clock and
-- temperature over it (NULL where unknown: older records, workers without NVML, windows too
-- short), the regime it was timed in ('burst' for every record before this), how long a
-- sustained measurement ran before it was steady and whether it was, and the vendor's energy.
ALTER TABLE records ADD COLUMN energy_mj REAL;
ALTER TABLE records ADD COLUMN power_w REAL;
ALTER TABLE records ADD COLUMN mean_clock_mhz REAL;
ALTER TABLE records ADD COLUMN temperature_c REAL;
ALTER TABLE records ADD COLUMN regime TEXT NOT NULL DEFAULT 'burst' CHECK (regime IN ('burst', 'sustained'));
ALTER TABLE records ADD COLUMN settle_ms REAL NOT NULL DEFAULT 0;
ALTER TABLE records ADD COLUMN steady INTEGER NOT NULL DEFAULT 1 CHECK (steady IN (0, 1));
ALTER TABLE records ADD COLUMN baseline_energy_mj REAL;
-- A job's regime, what it minimises ('time', 'energy', 'edp') and its max slowdown (a fraction;
-- 0: off): what every job before this did.
ALTER TABLE jobs ADD COLUMN regime TEXT NOT NULL DEFAULT 'burst' CHECK (regime IN ('burst', 'sustained'));
ALTER TABLE jobs ADD COLUMN objective TEXT NOT NULL DEFAULT 'time' CHECK (objective IN ('time', 'energy', 'edp'));
ALTER TABLE jobs ADD COLUMN max_slowdown REAL NOT NULL DEFAULT 0;
-- Whether its measurements skip their energy window.
ALTER TABLE jobs ADD COLUMN no_energy INTEGER NOT NULL DEFAULT 0 CHECK (no_energy IN (0, 1));
-- Reuse looks records up by content and regime: a burst record never answers a sustained trial.
DROP INDEX records_by_content;
CREATE INDEX records_by_content ON records (workload_key, template, template_version, device_class, config, regime);
