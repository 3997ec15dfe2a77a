//! The vendor baseline of a grouped matmul: a loop of cuBLASLt calls, one per group, each with
//! the fastest of its own heuristic candidates (timed alone on its part of the packed operands),
//! the whole loop then checked against our reference and timed as one graph. A framework without
//! a grouped kernel runs exactly this loop.

use tensortune_kernels::Matmul;

use super::blas::group_part;
use super::{CudaExecutor, InputSet};
use crate::protocol::MeasureRequest;

impl CudaExecutor {
    /// (time, kind) of the cuBLASLt loop over `mm`'s groups, or why there is none.
    pub(super) fn grouped_lt_baseline(
        &mut self,
        wi: usize,
        mm: &Matmul,
        req: &MeasureRequest,
    ) -> Result<(f64, String), String> {
        self.load_matmul_vendor();
        let lt = match self.lt.as_ref().expect("set by load_matmul_vendor") {
            Ok(lt) => lt,
            Err(e) => return Err(e.clone()),
        };
        let w = &self.workloads[wi];
        let (ea, eo) = (mm.types.input.bytes() as u64, mm.types.output.bytes() as u64);
        let d = w.d.ptr;
        // Per group: its plan (the group's M inside the packed M), the fastest candidate, and the
        // element offsets of its A, B and D.
        let mut picks = Vec::new();
        for g in 0..mm.groups.len() {
            let part = group_part(mm, g);
            let one = Matmul { m: part.m, groups: Default::default(), ..*mm };
            let plan = lt.plan_ld(&one, None, mm.m)?;
            let candidates = plan.candidates()?;
            let (a, b) = w.inputs(InputSet::Timing);
            let at = (a + part.a_off * ea, b + part.b_off * ea, d + part.d_off * eo);
            let mut best: Option<(f64, usize)> = None;
            for (i, c) in candidates.iter().enumerate() {
                match self.timer.time(req, |_| plan.matmul(c, at.0, at.1, at.2)) {
                    Ok(t) if best.is_none_or(|(us, _)| t.median_us < us) => best = Some((t.median_us, i)),
                    Ok(_) => {}
                    Err(f) if f.is_sticky() => {
                        self.poisoned = true;
                        return Err(format!("group {g}: {f}"));
                    }
                    Err(f) => {
                        tracing::debug!(workload = %req.workload_key, group = g, candidate = i + 1, "cuBLASLt candidate skipped: {f}")
                    }
                }
            }
            let (_, i) = best.ok_or_else(|| format!("no cuBLASLt candidate ran for group {g} (m = {})", part.m))?;
            picks.push((plan, candidates[i], i + 1, part));
        }
        let run = |a: u64, b: u64| {
            picks
                .iter()
                .try_for_each(|(plan, c, _, p)| plan.matmul(c, a + p.a_off * ea, b + p.b_off * ea, d + p.d_off * eo))
        };
        let (a, b) = w.inputs(InputSet::Check);
        let checked = w
            .load_c_into_output(&self.stream)
            .and_then(|_| run(a, b))
            .and_then(|_| w.compare(&self.stream, &req.tolerance));
        match checked {
            Ok(c) if c.failures == 0 => {}
            Ok(c) => {
                return Err(format!(
                    "the loop's output failed our check: {} elements, max abs error {:.3e}",
                    c.failures, c.max_abs
                ));
            }
            Err(f) => {
                if f.is_sticky() {
                    self.poisoned = true;
                }
                return Err(f.to_string());
            }
        }
        let (a, b) = w.inputs(InputSet::Timing);
        let timed = self.timer.time(req, |_| run(a, b));
        let numbers: Vec<String> = picks.iter().map(|p| format!("#{}", p.2)).collect();
        match timed {
            Ok(t) => Ok((
                t.median_us,
                format!(
                    "cublasLt loop over {} groups (each group's fastest heuristic candidate: {})",
                    mm.groups.len(),
                    numbers.join(" ")
                ),
            )),
            Err(f) => {
                if f.is_sticky() {
                    self.poisoned = true;
                }
                Err(f.to_string())
            }
        }
    }
}
