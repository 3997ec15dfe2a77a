-- `records_by_content` keys a record's config by its index in the template version's space, not
-- by its canonical JSON (~150 characters): every record insert writes an entry of this index, and
-- the config's text was most of it (10-15 us of a 30-48 us record insert, the costliest of the
-- records' indexes; issue 40). A template version's space is fixed (`Template::space`), so
-- (template, version, config_index) names one config, as `tasks_config_unique` already assumes;
-- the reuse lookup (`records::reusable_among`) seeks by index and still compares the config's
-- text, so a record whose text differs is never reused. `best` reads the index's prefix, as before.
-- PostgreSQL keeps its index on the text (its reuse lookup joins on it).
DROP INDEX IF EXISTS records_by_content;
CREATE INDEX records_by_content ON records (workload_key, template, template_version, device_class, config_index, regime);
