-- The algorithm the vendor library says it ran for a record's baseline (cuBLASLt's tile, stages,
-- cluster shape, split-K, swizzle), so that where the vendor beats a space the report can say
-- with what. Empty where unknown (older records, cublasGemmEx, cuDNN: its algorithm is in
-- baseline_kind).
ALTER TABLE records ADD COLUMN vendor_algo TEXT NOT NULL DEFAULT '';
