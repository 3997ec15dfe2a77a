-- Record packs: measurements shipped with the tracker (or imported with `tensortune records
-- import`) that serve the model tuner's transfer prior only. They are never reused as a trial's
-- measurement and never answer `best`: they were measured on another machine.
CREATE TABLE pack_records (
    id BIGSERIAL PRIMARY KEY,
    pack TEXT NOT NULL,
    workload_key TEXT NOT NULL,
    workload TEXT NOT NULL,
    template TEXT NOT NULL,
    template_version BIGINT NOT NULL,
    config TEXT NOT NULL,
    device_class TEXT NOT NULL,
    status TEXT NOT NULL,
    median_us DOUBLE PRECISION NOT NULL,
    CONSTRAINT pack_records_once UNIQUE (pack, workload_key, template, template_version, config, device_class)
);
CREATE INDEX pack_records_scope ON pack_records (template, template_version, device_class);
