//! Support kernels every measurement needs besides the kernel under test: input generation,
//! output poisoning, the float64 reference and the full-output comparison, plus the tolerance
//! each type combination is checked with. Generated per workload (the shape is compiled in).

use serde::{Deserialize, Serialize};

use crate::cuda::Header;
use crate::dtype::DType;
use crate::workload::{Conv2d, Workload};

const BODY: &str = include_str!("cuda/support.cu");

/// Entry points of the support module, with their arguments:
/// `tt_fill_in(T_IN* p, u64 n, u32 seed, i32 check)`, `tt_fill_out(T_OUT* p, u64 n, u32 seed, i32 check)`,
/// `tt_poison(T_OUT* p, u64 n)`, `tt_reference(A, B, C, f64* ref, f64* sq, f64* mag, T_OUT* bias,
/// f32* row_scale, f32* tensor_scales)` (the last three read only when the workload's epilogue has
/// them: see [`crate::epilogue`]),
/// `tt_compare(T_OUT* out, f64* ref, f64* sq, f64* mag, f64 acc_tol, f64 out_tol, u64* stats[5])`.
/// `tt_epilogue(T_OUT* d, T_OUT* c, T_OUT* bias, f32* row_scale, f32* tensor_scales)` applies a
/// matmul's epilogue to a plain product in place (the vendor baseline's unfused epilogue).
pub const ENTRIES: [&str; 7] =
    ["tt_fill_in", "tt_fill_out", "tt_poison", "tt_reference", "tt_compare", "tt_epilogue", "tt_activate"];

/// How far an output element may be from the float64 reference:
/// `|out - ref| <= acc * sq + out * mag`, where `sq` is |alpha| times the root of the summed squared
/// products and `mag` is |alpha * sum| + |beta * c|.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Tolerance {
    /// Relative to `sq`: accumulation error.
    pub acc: f64,
    /// Relative to `mag`: epilogue arithmetic and output rounding.
    pub out: f64,
}

impl Tolerance {
    /// The tolerance of a workload's types for the check set (multiples of 1/8, or integers).
    ///
    /// Integer accumulation is exact. f32 accumulation of check-set products is exact up to
    /// K = 2^18 (every partial sum is a multiple of 2^-6 below 2^18), so only a sliver is allowed;
    /// beyond, one f32 rounding per 8 products. f16 accumulation rounds once per 16-deep MMA step.
    ///
    /// Exact f32 inputs draw a finer check set (multiples of 2^-11, see `support.cu`) whose sums
    /// round in f32: a random walk of K roundings, each at most u times a partial sum of about
    /// `sq`, has a standard deviation near 0.4 u sqrt(K) of `sq`; 8 u sqrt(K) (u = 2^-24) keeps
    /// the largest of 16M elements (about 5.5 deviations) inside with room, and is at least the
    /// 2^-20 sliver. A kernel that rounds its inputs to TF32 errs by about 2^-12.7 of `sq`, outside
    /// this up to K = 2^14 (5x at K = 4096, where every element fails). TF32 inputs
    /// keep the coarse set (exact in TF32) with TF32's own bound: each product's two inputs cut
    /// to TF32, by rounding (mma_ext_gemm) or by truncation (wgmma reads an f32's leading 19
    /// bits), 2 x 2 x 2^-11, over sqrt(K) products' worth of `sq`, plus the f32 sliver.
    pub fn for_workload(w: &Workload) -> Tolerance {
        let t = w.types();
        let k = match w {
            Workload::Matmul(m) => m.k,
            Workload::Conv2d(c) => c.gemm_dims().2,
        } as f64;
        let acc = match (t.input, t.accumulator) {
            (DType::F32, _) => (8.0 * DType::F32.unit_roundoff() * k.sqrt()).max(2f64.powi(-20)),
            (DType::Tf32, _) => 4.0 * DType::Tf32.unit_roundoff() * k.sqrt() + 2f64.powi(-20),
            // FP8 wgmma does not sum in full f32: DeepSeek-V3's report (section 3.3.2) measured
            // about 14 bits kept in the tensor cores' FP8 accumulation on Hopper. Allow a rounding
            // of 2^-13 of the running sum (at most `sq`-sized) per 32-deep wgmma step.
            (input, _) if input.is_fp8() => 2f64.powi(-13) * (k / 32.0).ceil() + 2f64.powi(-20),
            (_, accumulator) => match accumulator {
                DType::I32 => 0.0,
                DType::F32 if k <= (1u64 << 18) as f64 => 2f64.powi(-20),
                DType::F32 => 2f64.powi(-23) * (k / 8.0),
                _ => 2f64.powi(-10) * (k / 16.0).ceil(),
            },
        };
        let out =
            if t.output.is_int() { 0.0 } else { 2.0 * t.output.unit_roundoff() + 4.0 * DType::F32.unit_roundoff() };
        Tolerance { acc, out }
    }
}

/// Element counts of the operands of a workload: (A, B, C/D).
pub fn operand_elements(w: &Workload) -> (u64, u64, u64) {
    match w {
        // A batch's problems one after another; a grouped matmul's A and D packed along M, and
        // one K x N matrix of B per group.
        Workload::Matmul(m) => (m.batch * m.m * m.k, m.problems() * m.k * m.n, m.batch * m.m * m.n),
        Workload::Conv2d(c) => (c.n * c.h * c.w * c.c, c.k * c.r * c.s * c.c, c.n * c.p() * c.q() * c.k),
    }
}

/// The named constants of a conv's geometry, as generated headers spell them (the support module
/// and `wmma_conv2d`): input H, W, CI; output channels KO; filter R, S; output P, Q; padding,
/// stride and dilation per axis.
pub fn conv_geometry(c: &Conv2d) -> [(&'static str, u64); 14] {
    [
        ("H", c.h),
        ("W", c.w),
        ("CI", c.c),
        ("KO", c.k),
        ("R", c.r),
        ("S", c.s),
        ("P", c.p()),
        ("Q", c.q()),
        ("PAD_H", c.pad.0),
        ("PAD_W", c.pad.1),
        ("STRIDE_H", c.stride.0),
        ("STRIDE_W", c.stride.1),
        ("DIL_H", c.dilation.0),
        ("DIL_W", c.dilation.1),
    ]
}

/// The support module's CUDA source for `w`.
pub fn source(w: &Workload) -> String {
    let t = w.types();
    let (_, _, out_elems) = operand_elements(w);
    let mut h = Header::default();
    if t.input.is_fp8() {
        h.include("cuda_fp8.h");
    }
    h.comment(format!("tensortune support kernels for {}", w.key()))
        .typedef("T_IN", t.input.cuda())
        .typedef("T_OUT", t.output.cuda());
    let (alpha, beta, epilogue, input_scale) = match w {
        Workload::Matmul(m) => (m.alpha, m.beta, m.epilogue, m.input_scale),
        Workload::Conv2d(c) => (1.0, if c.residual { 1.0 } else { 0.0 }, c.epilogue, crate::InputScale::None),
    };
    match w {
        Workload::Matmul(m) => {
            h.define("TT_OP_CONV2D", 0)
                .int("M", m.m as i64)
                .int("N", m.n as i64)
                .int("K", m.k as i64)
                .flag("A_K_CONTIG", m.layout.a_k_contiguous())
                .flag("B_K_CONTIG", m.layout.b_k_contiguous())
                .define("TT_GROUPED", i32::from(!m.groups.is_empty()))
                .int("GROUPS", m.groups.len() as i64);
            if !m.groups.is_empty() {
                let starts: Vec<String> = m.groups.offsets().iter().map(|v| v.to_string()).collect();
                h.value("long long", "GROUP_M0[]", format!("{{{}}}", starts.join(", ")));
            }
        }
        Workload::Conv2d(c) => {
            h.define("TT_OP_CONV2D", 1);
            for (name, v) in conv_geometry(c) {
                h.int(name, v as i64);
            }
        }
    }
    let op = match t.input {
        DType::B1Xor => 1,
        DType::B1And => 2,
        _ => 0,
    };
    h.int("IN_BITS", t.input.bits() as i64)
        .flag("IN_SIGNED", t.input == DType::S4)
        .int("IN_OP", op)
        .flag("FINE_CHECK", t.input == DType::F32);
    h.value("unsigned long long", "OUT_ELEMS", format!("{out_elems}ull"))
        .flag("READ_C", beta != 0.0)
        .value("double", "ALPHA_F64", format!("{alpha:?}"))
        .value("double", "BETA_F64", format!("{beta:?}"))
        .flag("EPI_SCALE", epilogue.scale)
        .flag("EPI_BIAS", epilogue.bias)
        .int("EPI_ACT", epilogue.activation.code())
        .flag("TENSOR_SCALE", input_scale == crate::InputScale::Tensor);
    h.source("tt_support", &[BODY])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::{Layout, Matmul, Types};

    #[test]
    fn tolerances_follow_types() {
        let f = |input, acc, out, k| {
            Tolerance::for_workload(&Workload::Matmul(
                Matmul::new(64, 64, k, Layout::Nn, Types::new(input, acc, Some(out)).unwrap()).unwrap(),
            ))
        };
        assert_eq!(f(DType::I8, DType::I32, DType::I32, 64), Tolerance { acc: 0.0, out: 0.0 });
        let t = f(DType::F16, DType::F32, DType::F32, 4096);
        assert!(t.acc < 1e-5 && t.out < 1e-6, "{t:?}");
        let t16 = f(DType::F16, DType::F32, DType::F16, 4096);
        assert!(t16.out > t.out);
        let acc16 = f(DType::F16, DType::F16, DType::F16, 512);
        assert!(acc16.acc > 1e-3 && acc16.acc < 0.05, "{acc16:?}");
        // Exact f32 allows f32 rounding of its sums, far below TF32's input rounding (~2^-12).
        let exact = f(DType::F32, DType::F32, DType::F32, 4096);
        assert_eq!(exact.acc, 2f64.powi(-15));
        assert_eq!(f(DType::F32, DType::F32, DType::F32, 1).acc, 2f64.powi(-20));
        let tf32 = f(DType::Tf32, DType::F32, DType::F32, 4096);
        assert!(tf32.acc > 8.0 * exact.acc && tf32.acc > 2f64.powi(-12), "{tf32:?} {exact:?}");
        let packed = Tolerance::for_workload(&Workload::Matmul(
            Matmul::new(64, 64, 128, Layout::Tn, Types::default_for(DType::B1Xor).unwrap()).unwrap(),
        ));
        assert_eq!(packed, Tolerance { acc: 0.0, out: 0.0 });
    }

    #[test]
    fn source_has_every_entry() {
        let w = Workload::Matmul(Matmul::new(8, 8, 16, Layout::Tn, Types::default_for(DType::I8).unwrap()).unwrap());
        let s = source(&w);
        for e in ENTRIES {
            assert!(s.contains(&format!("void {e}(")), "{e}");
        }
        assert!(s.contains("constexpr unsigned long long OUT_ELEMS = 64ull;"));
        assert!(s.contains("constexpr int IN_BITS = 8;") && s.contains("constexpr int IN_OP = 0;"));
        let w =
            Workload::Matmul(Matmul::new(8, 8, 128, Layout::Tn, Types::default_for(DType::B1And).unwrap()).unwrap());
        let s = source(&w);
        assert!(s.contains("typedef unsigned T_IN;") && s.contains("constexpr int IN_BITS = 1;"), "{s}");
        assert!(s.contains("constexpr int IN_OP = 2;") && s.contains("constexpr bool FINE_CHECK = false;"));
        assert!(!s.contains("cuda_fp8.h"));
        let mut m =
            Matmul::new(64, 64, 64, Layout::Tn, Types::new(DType::E4m3, DType::F32, Some(DType::Bf16)).unwrap())
                .unwrap();
        m.epilogue = "scale+bias+gelu".parse().unwrap();
        m.input_scale = crate::InputScale::Tensor;
        let s = source(&Workload::Matmul(m));
        assert!(s.contains("#include <cuda_fp8.h>") && s.contains("typedef __nv_fp8_e4m3 T_IN;"), "{s}");
        for want in ["EPI_SCALE = true", "EPI_BIAS = true", "EPI_ACT = 2", "TENSOR_SCALE = true"] {
            assert!(s.contains(want), "{want}");
        }
    }

    #[test]
    fn conv_epilogues_reach_the_reference() {
        let key = "conv2d/n2h9w9c16/k40r3s3/pad1x1,stride1x1,dil1x1/nhwc/f16,f32,f16/beta=1,epi=bias+relu";
        let s = source(&Workload::from_key(key).unwrap());
        for want in ["EPI_BIAS = true", "EPI_ACT = 1", "READ_C = true", "BETA_F64 = 1.0", "TT_OP_CONV2D 1"] {
            assert!(s.contains(want), "{want}");
        }
        // The bias is read per output channel, the innermost index of NPQK.
        assert!(s.contains("const long long row = k;") && s.contains("(long long)(o % KO)"));
    }

    #[test]
    fn fp8_tolerance_allows_the_tensor_cores_short_sums() {
        let t = |input, k| {
            Tolerance::for_workload(&Workload::Matmul(
                Matmul::new(64, 64, k, Layout::Tn, Types::new(input, DType::F32, Some(DType::Bf16)).unwrap()).unwrap(),
            ))
        };
        let (short, long) = (t(DType::E4m3, 64), t(DType::E4m3, 4096));
        assert!(short.acc < long.acc && long.acc < 0.02, "{short:?} {long:?}");
        assert_eq!(t(DType::E5m2, 4096), long);
        let bf16 = Tolerance::for_workload(&Workload::Matmul(
            Matmul::new(64, 64, 4096, Layout::Tn, Types::new(DType::Bf16, DType::F32, Some(DType::Bf16)).unwrap())
                .unwrap(),
        ));
        assert!(bf16.acc < short.acc && bf16.out == long.out);
    }
}
