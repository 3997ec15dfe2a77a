//! Batched and grouped matmul on the wgmma template: one launch runs every problem's tiles.
//!
//! The grid's cluster tiles are numbered problem after problem (`gemm.cu`'s `tile_at`): a batched
//! matmul's problems have a plain problem's tiles each, a grouped one's group g the columns of
//! [`TileSchedule`]. A tile's problem moves the outer TMA coordinate of the operands that are
//! stacked per problem (2-D tensor maps over all of them: K-major rows past a problem's end only
//! reach rows the store masks; an MN-major operand's K tail would read the next problem's rows,
//! so those need whole K tiles) and the offset of its D; a group's columns are a run of the packed
//! M, stored up to the group's end. The TMA-store epilogue stores through one map of every
//! problem's D, so it needs tiles that end at their problem's edges. Stream-K, K splits and a
//! resident Y are single-problem paths: their configs are rejected or fall back.

use super::plan::Plan;
use crate::cuda::Header;
use crate::error::{Error, Result};
use crate::grouped::TileSchedule;
use crate::workload::Matmul;

/// Workload rules of the multi-problem paths (before any config is looked at): a plain epilogue,
/// and whole K tiles where an MN-major operand is stacked per problem.
pub(super) fn check_workload(w: &Matmul) -> Result<()> {
    if !w.multi() {
        return Ok(());
    }
    let what = if w.groups.is_empty() { "batched" } else { "grouped" };
    if w.fused() {
        return Err(Error::invalid(
            "epilogue",
            format!("wgmma_gemm runs a {what} matmul with alpha and beta only, not epi={}", w.epilogue),
        ));
    }
    if w.types.input.is_fp8() {
        return Err(Error::invalid(
            "input",
            format!(
                "wgmma_gemm runs a {what} matmul of f16, bf16, i8 or tf32, not {} (its vendor loop of FP8 calls is not written)",
                w.types.input
            ),
        ));
    }
    let bk = 128 / w.types.input.bytes() as u64;
    // B is one matrix per problem in both; A only when batched (grouped A is packed along M).
    let stacked_mn = !w.layout.b_k_contiguous() || (w.groups.is_empty() && !w.layout.a_k_contiguous());
    if stacked_mn && !w.k.is_multiple_of(bk) {
        return Err(Error::invalid(
            "k",
            format!(
                "{} must be a multiple of {bk} for a {what} {} matmul in layout {}: an operand stored K-major-outer is stacked by problem, and a partial K tile would read the next problem's rows",
                w.k, w.types.input, w.layout
            ),
        ));
    }
    Ok(())
}

impl Plan {
    /// The grouped tile schedule in tile columns (one tile row per column: the kernel multiplies
    /// by its cluster rows); `None` unless grouped.
    pub(super) fn schedule(&self) -> Option<TileSchedule> {
        (!self.w.groups.is_empty()).then(|| TileSchedule::new(&self.w.groups, self.bq as u64, 1))
    }

    /// Whether every problem's M (so every group's start in the packed M) is a multiple of `n`.
    pub(super) fn m_multiple_of(&self, n: u64) -> bool {
        if self.w.groups.is_empty() { self.w.m.is_multiple_of(n) } else { self.w.groups.all_multiple_of(n) }
    }

    /// Config rules of the multi-problem paths.
    pub(super) fn check_problems(&self) -> Result<()> {
        if !self.w.multi() {
            return Ok(());
        }
        if self.stream_k {
            return Err(Error::Rejected(
                "stream_k shares out one problem's K tiles; a batched or grouped grid walks whole tiles".into(),
            ));
        }
        if self.swap {
            return Err(Error::Rejected(
                "block_n below 64 (the swapped view of a skinny GEMM) runs one problem; a batched or grouped matmul takes block_n 64 and up".into(),
            ));
        }
        // The TMA store clips at the map's edges only: a tile must not reach past its problem
        // into the next one's rows (batched: whole tiles of N) or columns (grouped: every group
        // whole tiles of M).
        let whole = if self.w.groups.is_empty() {
            self.tiles_p() * self.bp as u64 == self.w.n
        } else {
            self.m_multiple_of(self.bq as u64)
        };
        if self.tma_store && !whole {
            return Err(Error::Rejected(reason!(format!(
                "epilogue tma clips only at D's edges: a {} matmul needs every problem in whole {}",
                if self.w.groups.is_empty() { "batched" } else { "grouped" },
                if self.w.groups.is_empty() {
                    format!("block_n tiles (N={} in tiles of {}, clusters of {})", self.w.n, self.bp, self.cluster)
                } else {
                    format!("block_m tiles (groups' M {} in tiles of {})", self.w.groups.spelling(), self.bq)
                }
            ))));
        }
        Ok(())
    }

    /// The header's problem constants: BATCH, GROUPS, D's row stride LDQ (M, or the packed M) and,
    /// when grouped, the tables of `tile_at` (each group's first tile column and first row of the
    /// packed M, each with the total after the last).
    pub(super) fn problems_header(&self, h: &mut Header) {
        let w = &self.w;
        h.define("TT_GROUPED", i32::from(!w.groups.is_empty()))
            .int("BATCH", w.batch as i64)
            .int("GROUPS", if w.groups.is_empty() { 0 } else { w.groups.len() as i64 })
            .int("LDQ", w.m as i64);
        if let Some(s) = self.schedule() {
            let list = |v: &mut dyn Iterator<Item = u64>| v.map(|x| x.to_string()).collect::<Vec<_>>().join(", ");
            let mut starts = w.groups.offsets();
            starts.push(w.m);
            h.value("int", "GROUP_COLS[]", format!("{{{}}}", list(&mut s.first_columns().iter().copied()))).value(
                "int",
                "GROUP_M0[]",
                format!("{{{}}}", list(&mut starts.into_iter())),
            );
        }
    }

    /// Where cluster tile `ct` lies for the block of cluster rank `rank` (a mirror of `gemm.cu`'s
    /// `tile_at`, for the CPU check of the walk): (problem, tile row, first column, end of the
    /// problem's columns), columns in the packed M when grouped.
    pub fn tile_at(&self, target: &crate::target::Target, ct: u64, rank: u64) -> (u64, u64, u64, u64) {
        let g = self.grid(target);
        let cl = self.cluster as u64;
        let cp = g.tiles_p / cl;
        let Some(s) = self.schedule() else {
            let per = cp * g.tiles_q;
            let (tp, tq) = self.tile_of(target, ct % per, rank);
            return (ct / per, tp, tq * self.bq as u64, self.w.m);
        };
        let cols = s.first_columns();
        let starts = self.w.groups.offsets();
        let group = cols.partition_point(|c| cp * c <= ct) - 1;
        let (local, width) = (ct - cp * cols[group], cols[group + 1] - cols[group]);
        let band = self.group as u64;
        let (pc, tq) = if self.raster_m {
            let (tq, pc) = super::plan::banded(local, width, cp, band);
            (pc, tq)
        } else {
            super::plan::banded(local, cp, width, band)
        };
        let m0 = starts[group];
        let end = m0 + self.w.groups.iter().nth(group).unwrap_or(0);
        (group as u64, pc * cl + rank, m0 + tq * self.bq as u64, end)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::target::Target;
    use crate::template::Template;
    use crate::wgmma::WgmmaGemm;
    use crate::workload::Workload;

    fn config(json: &str) -> crate::space::Config {
        serde_json::from_str(json).unwrap()
    }

    /// Every (problem, tile) of the grid once, each tile inside its problem's columns.
    fn walk_covers(key: &str, json: &str) {
        let target = Target::sm90();
        let Workload::Matmul(w) = Workload::from_key(key).unwrap() else { unreachable!() };
        let plan = Plan::new(&w, &config(json)).unwrap();
        plan.check(&target).unwrap();
        let g = plan.grid(&target);
        let mut seen = HashSet::new();
        for ct in 0..g.cluster_tiles {
            for rank in 0..plan.cluster as u64 {
                let (prob, tp, q0, end) = plan.tile_at(&target, ct, rank);
                assert!(prob < w.problems() && tp < g.tiles_p && q0 < end, "{key} ct {ct}: {prob} {tp} {q0} {end}");
                assert!(seen.insert((prob, tp, q0)), "{key}: tile {prob} {tp} {q0} twice");
            }
        }
        let per_problem: u64 = match w.groups.is_empty() {
            true => w.batch * w.m.div_ceil(plan.bq as u64),
            false => w.groups.iter().map(|m| m.div_ceil(plan.bq as u64)).sum(),
        };
        assert_eq!(seen.len() as u64, per_problem * g.tiles_p, "{key}");
    }

    #[test]
    fn batched_and_grouped_walks_cover_every_tile_once() {
        let base = r#""consumers":2,"stages":4,"producer":"warpgroup","schedule":"cooperative","stream_k":0,"epilogue":"direct""#;
        walk_covers(
            "matmul/b12m384n2048k64/tn/f16,f32,f16/alpha=1,beta=0",
            &format!(r#"{{"block_m":128,"block_n":128,"cluster":2,"persistent":1,"raster_group":4,{base}}}"#),
        );
        walk_covers(
            "matmul/m100+300+64+1000n512k128/tn/bf16,f32,bf16/alpha=1,beta=0",
            &format!(r#"{{"block_m":128,"block_n":128,"cluster":1,"persistent":0,"raster_group":1,{base}}}"#),
        );
        walk_covers(
            "matmul/m100+300+64+1000n1024k128/tn/bf16,f32,bf16/alpha=1,beta=0",
            &format!(
                r#"{{"block_m":64,"block_n":128,"cluster":2,"persistent":1,"raster_group":4,"raster":"m",{base}}}"#
            ),
        );
    }

    #[test]
    fn multi_problem_rules_name_what_they_refuse() {
        let target = Target::sm90();
        let t = WgmmaGemm;
        let moe = Workload::from_key("matmul/m128+4096n4096k4096/tn/bf16,f32,bf16/alpha=1,beta=0").unwrap();
        let valid = t.valid_indices(&moe, &target).unwrap();
        assert!(!valid.is_empty());
        let sk = config(
            r#"{"block_m":128,"block_n":128,"cluster":1,"consumers":2,"persistent":1,"raster_group":1,"producer":"warpgroup","schedule":"cooperative","stages":4,"stream_k":1,"epilogue":"direct"}"#,
        );
        assert!(t.check(&moe, &sk, &target).unwrap_err().to_string().contains("stream_k shares out one problem"));
        // The TMA store: whole tiles of every group (128 | each M) pass, a ragged group does not.
        let tma = config(
            r#"{"block_m":128,"block_n":128,"cluster":1,"consumers":2,"persistent":0,"raster_group":1,"producer":"warpgroup","schedule":"cooperative","stages":4,"stream_k":0,"epilogue":"tma"}"#,
        );
        t.check(&moe, &tma, &target).unwrap();
        let ragged = Workload::from_key("matmul/m100+4096n4096k4096/tn/bf16,f32,bf16/alpha=1,beta=0").unwrap();
        let e = t.check(&ragged, &tma, &target).unwrap_err().to_string();
        assert!(e.contains("epilogue tma clips only at D's edges") && e.contains("100+4096"), "{e}");
        let e = t
            .check_workload(&Workload::from_key("matmul/b4m64n64k96/nt/f16,f32,f32/alpha=1,beta=0").unwrap())
            .unwrap_err();
        assert!(e.field() == Some("k") && e.to_string().contains("multiple of 64"), "{e}");
        let e = t
            .check_workload(&Workload::from_key("matmul/b4m64n64k64/tn/f16,f32,f32/alpha=1,beta=0,epi=relu").unwrap())
            .unwrap_err();
        assert_eq!(e.field(), Some("epilogue"));
        // K-major operands take any K: their K tail is zero-filled within each row.
        t.check_workload(&Workload::from_key("matmul/b4m64n64k72/tn/f16,f32,f32/alpha=1,beta=0").unwrap()).unwrap();
    }
}
