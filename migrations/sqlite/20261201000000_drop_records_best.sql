-- `records_best` (workload, template, version, class, median) of ok records served `best` and
-- `best_per_workload` alone, and both rank every ok record of a workload with a window function
-- whatever the index: `records_by_content`'s prefix (workload, template, version, class) finds
-- the same rows. Every record insert paid for a b-tree it did not need (issue 40).
DROP INDEX IF EXISTS records_best;
