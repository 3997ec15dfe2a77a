-- The algorithm the vendor library says it ran for a record's baseline: as
-- migrations/sqlite/20261127210000_vendor_algo.sql.
ALTER TABLE records ADD COLUMN vendor_algo TEXT NOT NULL DEFAULT '';
