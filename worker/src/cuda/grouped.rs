//! The vendor baseline of a grouped matmul: a loop of cuBLASLt calls, one per group, each with
//! the fastest of its own heuristic candidates (timed alone on its part of the packed operands),
//! the whole loop then checked against our reference and timed as one graph. A framework without
//! a grouped kernel runs exactly this loop. And cuBLAS's own grouped GEMM,
//! `cublasGemmGroupedBatchedEx` (cuBLAS 12.5+), which `blas::Blas::gemm` calls where it can.

use cudarc::cublas::sys as cublas_sys;
use tensortune_kernels::Matmul;

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
                    Ok(t) if best.is_none_or(|(us, _)| t.time_us < us) => best = Some((t.time_us, i)),
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
                t.time_us,
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

/// Whether `w` runs as one `cublasGemmGroupedBatchedEx`: grouped, 16-bit floats in and out with
/// f32 accumulation (the types its documentation lists for them), and a cuBLAS (12.5 or later)
/// that has the function.
pub(super) fn grouped_batched_usable(w: &Matmul) -> bool {
    use tensortune_kernels::DType;
    let t = &w.types;
    !w.groups.is_empty()
        && matches!(t.input, DType::F16 | DType::Bf16)
        && t.accumulator == DType::F32
        && t.output == t.input
        && has_grouped_batched()
}

/// Whether the loaded cuBLAS exports `cublasGemmGroupedBatchedEx` (cudarc's binding panics on a
/// missing symbol, so it is looked up first).
fn has_grouped_batched() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    // SAFETY: only looks a symbol up in the library cudarc loads; nothing is called through it.
    *HAS.get_or_init(|| unsafe {
        cublas_sys::is_culib_present()
            && cublas_sys::culib().get::<unsafe extern "C" fn()>(b"cublasGemmGroupedBatchedEx\0").is_ok()
    })
}

/// Which pointer array: the workload's key and its A, B and D.
type ArrayKey = (String, u64, u64, u64);

/// `cublasGemmGroupedBatchedEx`'s device arrays of pointers, one per [`ArrayKey`].
pub(super) struct PointerArrays {
    ctx: std::sync::Arc<cudarc::driver::CudaContext>,
    made: std::cell::RefCell<Vec<(ArrayKey, super::device::DevBuf)>>,
}

impl PointerArrays {
    pub(super) fn new(ctx: &std::sync::Arc<cudarc::driver::CudaContext>) -> PointerArrays {
        PointerArrays { ctx: ctx.clone(), made: Default::default() }
    }

    /// The device array [A_0 .. A_G-1, B_0 .., D_0 ..] of `w`'s groups over a, b, d; made (a
    /// synchronous copy) on first use, which is a warm-up or a check, never inside a capture.
    pub(super) fn pointers(&self, w: &Matmul, a: u64, b: u64, d: u64) -> Result<u64, super::CudaFailure> {
        let key = (tensortune_kernels::Workload::Matmul(*w).key(), a, b, d);
        if let Some((_, buf)) = self.made.borrow().iter().find(|(k, _)| *k == key) {
            return Ok(buf.ptr);
        }
        let (ea, eo) = (w.types.input.bytes() as u64, w.types.output.bytes() as u64);
        let parts: Vec<_> = (0..w.groups.len()).map(|g| group_part(w, g)).collect();
        let mut bytes = Vec::new();
        for p in &parts {
            bytes.extend((a + p.a_off * ea).to_le_bytes());
        }
        for p in &parts {
            bytes.extend((b + p.b_off * ea).to_le_bytes());
        }
        for p in &parts {
            bytes.extend((d + p.d_off * eo).to_le_bytes());
        }
        let buf = super::device::DevBuf::from_bytes(&self.ctx, &bytes)?;
        let ptr = buf.ptr;
        self.made.borrow_mut().push((key, buf));
        Ok(ptr)
    }
}

/// Group `g` of a grouped matmul as one GEMM: its M, the element offsets of its A, B and D in
/// the packed operands, and the leading dimensions (`Ops::of(w)`'s, the packed M's).
pub(crate) struct GroupPart {
    pub(crate) m: u64,
    pub(crate) a_off: u64,
    pub(crate) b_off: u64,
    pub(crate) d_off: u64,
}

pub(crate) fn group_part(w: &Matmul, g: usize) -> GroupPart {
    let m0 = w.groups.offsets()[g];
    let m = w.groups.iter().nth(g).unwrap_or(0);
    // A K-contiguous A holds M rows of K (group rows at m0 * K); an M-contiguous one K columns of
    // the packed M (group rows at m0, leading dimension the packed M). D is column-major.
    let a_off = if w.layout.a_k_contiguous() { m0 * w.k } else { m0 };
    GroupPart { m, a_off, b_off: g as u64 * w.k * w.n, d_off: m0 }
}
