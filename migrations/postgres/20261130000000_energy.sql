-- Energy and the clock regime: as migrations/sqlite/20261130000000_energy.sql.
ALTER TABLE records ADD COLUMN energy_mj DOUBLE PRECISION;
ALTER TABLE records ADD COLUMN power_w DOUBLE PRECISION;
ALTER TABLE records ADD COLUMN mean_clock_mhz DOUBLE PRECISION;
ALTER TABLE records ADD COLUMN temperature_c DOUBLE PRECISION;
ALTER TABLE records ADD COLUMN regime TEXT NOT NULL DEFAULT 'burst' CHECK (regime IN ('burst', 'sustained'));
ALTER TABLE records ADD COLUMN settle_ms DOUBLE PRECISION NOT NULL DEFAULT 0;
ALTER TABLE records ADD COLUMN steady BOOLEAN NOT NULL DEFAULT TRUE;
ALTER TABLE records ADD COLUMN baseline_energy_mj DOUBLE PRECISION;
ALTER TABLE jobs ADD COLUMN regime TEXT NOT NULL DEFAULT 'burst' CHECK (regime IN ('burst', 'sustained'));
ALTER TABLE jobs ADD COLUMN objective TEXT NOT NULL DEFAULT 'time' CHECK (objective IN ('time', 'energy', 'edp'));
ALTER TABLE jobs ADD COLUMN max_slowdown DOUBLE PRECISION NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN no_energy BOOLEAN NOT NULL DEFAULT FALSE;
DROP INDEX records_by_content;
CREATE INDEX records_by_content ON records (workload_key, template, template_version, device_class, config, regime);
