//! Workloads: the operations we tune, their validation and their canonical keys.
//!
//! A workload holds everything that changes a kernel's meaning. Its key is a stable string used
//! everywhere (records, best-config queries, exports); `Workload::from_key` parses it back.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

use crate::dtype::DType;
use crate::epilogue::{Epilogue, InputScale};
use crate::error::{Error, Result};
use crate::grouped::{Groups, MAX_BATCH};

/// Largest matmul dimension accepted.
pub const MAX_DIM: u64 = 1 << 20;
/// Largest element count of any one operand: kernels index with 32-bit integers.
pub const MAX_ELEMENTS: u64 = (1 << 31) - 1;

/// Operand layouts in BLAS convention (C is column-major M x N).
///
/// The first letter is op(A): `N` means A is stored M x K column-major (M contiguous), `T` means A is
/// stored K x M column-major (K contiguous). The second is op(B): `N` means B is stored K x N
/// column-major (K contiguous), `T` means stored N x K (N contiguous).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Layout {
    /// A M-contiguous, B K-contiguous.
    Nn,
    /// A M-contiguous, B N-contiguous.
    Nt,
    /// A K-contiguous, B K-contiguous.
    Tn,
    /// A K-contiguous, B N-contiguous.
    Tt,
}

impl Layout {
    /// Every layout.
    pub const ALL: [Layout; 4] = [Layout::Nn, Layout::Nt, Layout::Tn, Layout::Tt];

    /// Lowercase name (`nn`, `nt`, `tn`, `tt`).
    pub fn name(self) -> &'static str {
        match self {
            Layout::Nn => "nn",
            Layout::Nt => "nt",
            Layout::Tn => "tn",
            Layout::Tt => "tt",
        }
    }

    /// Whether A is stored with K contiguous.
    pub fn a_k_contiguous(self) -> bool {
        matches!(self, Layout::Tn | Layout::Tt)
    }

    /// Whether B is stored with K contiguous.
    pub fn b_k_contiguous(self) -> bool {
        matches!(self, Layout::Nn | Layout::Tn)
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Layout {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Layout::ALL
            .into_iter()
            .find(|l| l.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| Error::invalid("layout", format!("unknown layout {s:?}; expected nn, nt, tn or tt")))
    }
}

/// Input, accumulator and output types of a tensor-core operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Types {
    /// Type of both inputs.
    pub input: DType,
    /// Type the products are summed in.
    pub accumulator: DType,
    /// Type of the output.
    pub output: DType,
}

impl Types {
    /// The combinations a workload may have, as (input, accumulator, outputs): the tensor cores'
    /// (through WMMA), exact f32 (on the CUDA cores), TF32 (f32 data, tensor-core math) and the
    /// packed integer types, which accumulate in i32.
    pub const SUPPORTED: &'static [(DType, DType, &'static [DType])] = &[
        (DType::F16, DType::F32, &[DType::F32, DType::F16]),
        (DType::F16, DType::F16, &[DType::F16]),
        (DType::Bf16, DType::F32, &[DType::F32, DType::Bf16]),
        (DType::I8, DType::I32, &[DType::I32]),
        (DType::F32, DType::F32, &[DType::F32]),
        (DType::Tf32, DType::F32, &[DType::F32]),
        (DType::S4, DType::I32, &[DType::I32]),
        (DType::U4, DType::I32, &[DType::I32]),
        (DType::B1Xor, DType::I32, &[DType::I32]),
        (DType::B1And, DType::I32, &[DType::I32]),
        (DType::E4m3, DType::F32, &[DType::Bf16, DType::F16, DType::F32]),
        (DType::E5m2, DType::F32, &[DType::Bf16, DType::F16, DType::F32]),
    ];

    /// The input types of [`Types::SUPPORTED`], for messages.
    fn inputs() -> String {
        let mut names: Vec<&str> = Self::SUPPORTED.iter().map(|r| r.0.name()).collect();
        names.dedup();
        names.join(", ")
    }

    /// Types from an input type alone: f16, bf16, f32 and tf32 accumulate in f32, the integer
    /// types in i32; the output is the accumulator's type.
    pub fn default_for(input: DType) -> Result<Types> {
        let Some(row) = Self::SUPPORTED.iter().find(|r| r.0 == input) else {
            return Err(Error::invalid(
                "input",
                format!("{input} is not an input type; expected one of {}", Self::inputs()),
            ));
        };
        Types::new(input, row.1, None)
    }

    /// Checks a combination; `output` defaults to the accumulator type.
    pub fn new(input: DType, accumulator: DType, output: Option<DType>) -> Result<Types> {
        let output = output.unwrap_or(accumulator);
        if !Self::SUPPORTED.iter().any(|r| r.0 == input) {
            return Err(Error::invalid(
                "input",
                format!("{input} is not an input type; expected one of {}", Self::inputs()),
            ));
        }
        let Some(row) = Self::SUPPORTED.iter().find(|r| r.0 == input && r.1 == accumulator) else {
            let allowed: Vec<_> = Self::SUPPORTED.iter().filter(|r| r.0 == input).map(|r| r.1.name()).collect();
            return Err(Error::invalid(
                "accumulator",
                format!("{accumulator} cannot accumulate {input} inputs; allowed: {}", allowed.join(", ")),
            ));
        };
        if !row.2.contains(&output) {
            let allowed: Vec<_> = row.2.iter().map(|d| d.name()).collect();
            return Err(Error::invalid(
                "output",
                format!(
                    "{output} output is not supported for {input} inputs with {accumulator} accumulation; allowed: {}",
                    allowed.join(", ")
                ),
            ));
        }
        Ok(Types { input, accumulator, output })
    }

    fn key(&self) -> String {
        format!("{},{},{}", self.input, self.accumulator, self.output)
    }

    fn parse_key(s: &str) -> Result<Types> {
        let parts: Vec<_> = s.split(',').collect();
        let [i, a, o] = parts.as_slice() else {
            return Err(Error::invalid("key", format!("types {s:?} must be input,accumulator,output")));
        };
        Types::new(i.parse()?, a.parse()?, Some(o.parse()?))
    }
}

/// D = act(alpha * sa * sb * scale[m] * op(A) * op(B) + beta * C + bias[m]), C and D
/// column-major M x N (see [`crate::epilogue`]; a plain matmul is alpha * op(A) op(B) + beta C).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Matmul {
    /// Rows of op(A), C and D.
    pub m: u64,
    /// Columns of op(B), C and D.
    pub n: u64,
    /// Reduction length.
    pub k: u64,
    /// Operand layouts.
    pub layout: Layout,
    /// Element types.
    pub types: Types,
    /// Scale of the product.
    pub alpha: f64,
    /// Scale of C; 0 means C is not read.
    pub beta: f64,
    /// What is fused after the product besides alpha and beta.
    #[serde(default)]
    pub epilogue: Epilogue,
    /// Per-tensor scales of FP8 inputs.
    #[serde(default)]
    pub input_scale: InputScale,
    /// Problems of this shape run by one launch, each operand's one after another (strides
    /// M*K, K*N, M*N); 1 is a plain matmul. See [`crate::grouped`].
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub batch: u64,
    /// A grouped matmul's M per group (`m` is their sum; A and D packed along M, B one K x N
    /// matrix per group); empty for any other matmul.
    #[serde(default, skip_serializing_if = "Groups::is_empty")]
    pub groups: Groups,
}

fn one() -> u64 {
    1
}

fn is_one(v: &u64) -> bool {
    *v == 1
}

impl Matmul {
    /// A validated matmul with alpha = 1, beta = 0 and no other epilogue.
    pub fn new(m: u64, n: u64, k: u64, layout: Layout, types: Types) -> Result<Matmul> {
        let w = Matmul {
            m,
            n,
            k,
            layout,
            types,
            alpha: 1.0,
            beta: 0.0,
            epilogue: Epilogue::NONE,
            input_scale: InputScale::None,
            batch: 1,
            groups: Groups::NONE,
        };
        w.validate()?;
        Ok(w)
    }

    /// Problems one launch runs: the batch, or the groups.
    pub fn problems(&self) -> u64 {
        if self.groups.is_empty() { self.batch } else { self.groups.len() as u64 }
    }

    /// Whether one launch runs several problems (batched or grouped).
    pub fn multi(&self) -> bool {
        self.problems() > 1
    }

    /// Checks the batch and the groups: batch 1 ..= 65535, groups summing to M, not both, and
    /// every problem's operands under 2^31 elements together.
    fn validate_problems(&self) -> Result<()> {
        check_range("batch", self.batch, 1, MAX_BATCH)?;
        if self.groups.is_empty() {
            for (what, v) in [("m*k", self.m * self.k), ("k*n", self.k * self.n), ("m*n", self.m * self.n)] {
                if v * self.batch > MAX_ELEMENTS {
                    return Err(Error::invalid(
                        "batch",
                        format!(
                            "{} problems of {what} = {v} elements exceed the limit of {MAX_ELEMENTS} per operand",
                            self.batch
                        ),
                    ));
                }
            }
            return Ok(());
        }
        if self.batch != 1 {
            return Err(Error::invalid(
                "batch",
                format!("batch={} with groups; a grouped matmul runs one problem per group (batch 1)", self.batch),
            ));
        }
        if self.groups.total() != self.m {
            return Err(Error::invalid(
                "groups",
                format!("the groups' M sum to {}, not m = {}", self.groups.total(), self.m),
            ));
        }
        let b = self.groups.len() as u64 * self.k * self.n;
        if b > MAX_ELEMENTS {
            return Err(Error::invalid(
                "groups",
                format!("{} groups of k*n make B {b} elements, over the limit of {MAX_ELEMENTS}", self.groups.len()),
            ));
        }
        Ok(())
    }

    /// Checks ranges: every dimension 1 ..= 2^20, every operand under 2^31 elements, finite
    /// epilogue scales (integral for integer outputs).
    pub fn validate(&self) -> Result<()> {
        for (field, v) in [("m", self.m), ("n", self.n), ("k", self.k)] {
            check_range(field, v, 1, MAX_DIM)?;
        }
        for (field, what, a, b) in
            [("k", "m*k", self.m, self.k), ("k", "k*n", self.k, self.n), ("n", "m*n", self.m, self.n)]
        {
            if a * b > MAX_ELEMENTS {
                return Err(Error::invalid(
                    field,
                    format!("{what} = {} elements exceeds the limit of {MAX_ELEMENTS} per operand", a * b),
                ));
            }
        }
        Types::new(self.types.input, self.types.accumulator, Some(self.types.output))?;
        let input = self.types.input;
        if input.is_packed() {
            // Packed operands are stored K-contiguous (TN) and cut into whole sub-byte MMA steps.
            if self.layout != Layout::Tn {
                return Err(Error::invalid(
                    "layout",
                    format!(
                        "{} for {input} inputs; packed sub-byte operands are K-contiguous, so the layout must be tn",
                        self.layout
                    ),
                ));
            }
            let multiple = input.k_multiple();
            if !self.k.is_multiple_of(multiple) {
                return Err(Error::invalid(
                    "k",
                    format!("{} must be a multiple of {multiple} for {input} inputs (one sub-byte MMA step)", self.k),
                ));
            }
        }
        if input.is_fp8() && self.layout != Layout::Tn {
            return Err(Error::invalid(
                "layout",
                format!(
                    "{} for {input} inputs; 8-bit float operands must be K-contiguous (layout tn): wgmma reads them K-major only, and cuBLASLt's FP8 matmul takes TN only",
                    self.layout
                ),
            ));
        }
        if self.input_scale != InputScale::None && !input.is_fp8() {
            return Err(Error::invalid(
                "scale",
                format!("scale={} is for e4m3 and e5m2 inputs, not {input}", self.input_scale.name()),
            ));
        }
        if !self.epilogue.is_none() && self.types.output.is_int() {
            return Err(Error::invalid(
                "epilogue",
                format!(
                    "{} needs a float output; {} outputs take alpha and beta only",
                    self.epilogue, self.types.output
                ),
            ));
        }
        self.validate_problems()?;
        for (field, v) in [("alpha", self.alpha), ("beta", self.beta)] {
            if !v.is_finite() {
                return Err(Error::invalid(field, format!("{v} is not finite")));
            }
            if self.types.output.is_int() && (v.fract() != 0.0 || v.abs() > i32::MAX as f64) {
                return Err(Error::invalid(field, format!("{v} must be an integer for {} outputs", self.types.output)));
            }
        }
        Ok(())
    }

    /// Floating-point (or integer) operations of the product: 2 M N K (times the batch; a
    /// grouped matmul's M is its groups' sum).
    pub fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.n as f64 * self.k as f64 * self.batch as f64
    }

    /// Whether the epilogue reads C.
    pub fn reads_c(&self) -> bool {
        self.beta != 0.0
    }

    /// Whether the epilogue or input scales go beyond alpha and beta (a template without them
    /// must refuse the workload).
    pub fn fused(&self) -> bool {
        !self.epilogue.is_none() || self.input_scale != InputScale::None
    }

    /// `Unsupported` naming `template` when the workload fuses more than alpha and beta, or runs
    /// several problems (batched, grouped).
    pub fn require_plain(&self, template: &'static str) -> Result<()> {
        if self.multi() {
            let (field, what) = if self.groups.is_empty() { ("batch", "batched") } else { ("groups", "grouped") };
            return Err(Error::invalid(
                field,
                format!(
                    "{template} runs one problem per launch, not a {what} matmul; wgmma_gemm (sm_90) runs batched and grouped ones"
                ),
            ));
        }
        if self.fused() {
            return Err(Error::invalid(
                "epilogue",
                format!(
                    "{template} fuses alpha and beta only, not epi={} scale={}; wgmma_gemm fuses them",
                    self.epilogue,
                    self.input_scale.name()
                ),
            ));
        }
        Ok(())
    }

    /// The GEMM view of this matmul (identity).
    pub fn gemm(&self) -> Matmul {
        *self
    }

    /// The key's dimensions: `m<M>n<N>k<K>`, with `b<B>` before them when batched, and the
    /// groups' M joined by `+` for M when grouped (a plain matmul's as before either existed).
    fn dims_key(&self) -> String {
        let batch = if self.batch == 1 { String::new() } else { format!("b{}", self.batch) };
        let m = if self.groups.is_empty() { self.m.to_string() } else { self.groups.spelling() };
        format!("{batch}m{m}n{}k{}", self.n, self.k)
    }

    /// Parses [`Matmul::dims_key`]'s spelling: (batch, m, groups, n, k).
    fn parse_dims(key: &str, dims: &str) -> Result<(u64, u64, Groups, u64, u64)> {
        let bad = || {
            Error::invalid(
                "key",
                format!(
                    "{key:?} is not a workload key: dims must read [b<B>]m<M>n<N>k<K>, M one number or the groups' M joined by '+'"
                ),
            )
        };
        let (batch, rest) = match dims.strip_prefix('b') {
            Some(r) => {
                let at = r.find('m').ok_or_else(bad)?;
                let b = r[..at].parse::<u64>().map_err(|_| bad())?;
                (b, &r[at..])
            }
            None => (1, dims),
        };
        let rest = rest.strip_prefix('m').ok_or_else(bad)?;
        let at = rest.find('n').ok_or_else(bad)?;
        let (m_text, nk) = (&rest[..at], &rest[at..]);
        let d = parse_fields(nk, &['n', 'k']).ok_or_else(bad)?;
        if m_text.contains('+') {
            let groups = Groups::parse(m_text, MAX_DIM)?;
            return Ok((batch, groups.total(), groups, d[0], d[1]));
        }
        Ok((batch, m_text.parse().map_err(|_| bad())?, Groups::NONE, d[0], d[1]))
    }

    fn key(&self) -> String {
        let mut key = format!(
            "matmul/{}/{}/{}/alpha={},beta={}",
            self.dims_key(),
            self.layout,
            self.types.key(),
            fmt_scale(self.alpha),
            fmt_scale(self.beta)
        );
        // Left out when plain, so that keys from before epilogues existed stay as they were.
        if self.input_scale != InputScale::None {
            key.push_str(&format!(",scale={}", self.input_scale.name()));
        }
        if !self.epilogue.is_none() {
            key.push_str(&format!(",epi={}", self.epilogue));
        }
        key
    }

    /// Parses the last part of key `key`: `alpha=<a>,beta=<b>`, then optionally `scale=<s>` and
    /// `epi=<parts>` in that order. A bad scale or epilogue names its own field.
    fn parse_epilogue(key: &str, text: &str) -> Result<(f64, f64, InputScale, Epilogue)> {
        let bad = |why: String| Error::invalid("key", format!("{key:?} is not a workload key: {why}"));
        let mut parts = text.split(',');
        let mut number = |name: &str| {
            parts
                .next()
                .and_then(|p| p.strip_prefix(name)?.strip_prefix('=')?.parse::<f64>().ok())
                .ok_or_else(|| bad("epilogue must read alpha=<a>,beta=<b>[,scale=tensor][,epi=<parts>]".into()))
        };
        let (alpha, beta) = (number("alpha")?, number("beta")?);
        let (mut scale, mut epi, mut seen_epi) = (InputScale::None, Epilogue::NONE, false);
        for part in parts {
            match part.split_once('=') {
                Some(("scale", v)) if !seen_epi && scale == InputScale::None => scale = v.parse()?,
                Some(("epi", v)) if !seen_epi => {
                    epi = v.parse()?;
                    seen_epi = true;
                }
                _ => {
                    return Err(bad(format!(
                        "unexpected {part:?} after beta; allowed: scale=tensor, then epi=<parts>"
                    )));
                }
            }
        }
        Ok((alpha, beta, scale, epi))
    }
}

/// Forward 2-D convolution: NHWC input, KRSC filter, NPQK output. Its types are those of
/// [`Types::SUPPORTED`] but the packed ones: f16, bf16, i8, exact f32 (`f32,f32,f32`) and TF32
/// (`tf32,f32,f32`: f32 tensors, TF32 products), two different workloads.
///
/// A fused epilogue acts per output channel k, as a framework's conv + batch norm (folded into a
/// per-channel bias) + residual add + ReLU does:
/// `Y[n, p, q, k] = act(scale[k] * conv + C[n, p, q, k] + bias[k])`, C (of the output's shape)
/// read only with `residual`. The key adds `/beta=1,epi=<parts>` (either part alone) after the
/// types; a plain convolution's key is as it was before epilogues existed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Conv2d {
    /// Batch.
    pub n: u64,
    /// Input height.
    pub h: u64,
    /// Input width.
    pub w: u64,
    /// Input channels.
    pub c: u64,
    /// Output channels.
    pub k: u64,
    /// Filter height.
    pub r: u64,
    /// Filter width.
    pub s: u64,
    /// Padding (height, width).
    pub pad: (u64, u64),
    /// Stride (height, width).
    pub stride: (u64, u64),
    /// Dilation (height, width).
    pub dilation: (u64, u64),
    /// Element types.
    pub types: Types,
    /// What is fused after the convolution, per output channel (see [`crate::epilogue`]).
    #[serde(default)]
    pub epilogue: Epilogue,
    /// Adds C (the output's shape, e.g. a residual block's identity) before the bias and the
    /// activation: beta = 1 of the implicit GEMM.
    #[serde(default)]
    pub residual: bool,
}

impl Conv2d {
    /// Whether anything is fused after the convolution (an epilogue or the residual).
    pub fn fused(&self) -> bool {
        !self.epilogue.is_none() || self.residual
    }

    /// `epilogue` error naming `template` when the layer fuses an epilogue or a residual.
    pub fn require_plain(&self, template: &'static str) -> Result<()> {
        if self.fused() {
            return Err(Error::invalid(
                "epilogue",
                format!(
                    "{template} fuses no conv2d epilogue, not {}; wgmma_conv2d (sm_90) fuses bias, relu, gelu, scale and the residual",
                    self.epilogue_spelling()
                ),
            ));
        }
        Ok(())
    }

    /// The key's epilogue segment without its slash (`beta=1,epi=bias+relu`); empty when plain.
    fn epilogue_spelling(&self) -> String {
        let mut parts = Vec::new();
        if self.residual {
            parts.push("beta=1".to_string());
        }
        if !self.epilogue.is_none() {
            parts.push(format!("epi={}", self.epilogue));
        }
        parts.join(",")
    }

    /// Parses the epilogue segment of key `key` (`beta=1`, then `epi=<parts>`, either alone).
    fn parse_epilogue(key: &str, text: &str) -> Result<(bool, Epilogue)> {
        let (mut residual, mut epi, mut seen_epi) = (false, Epilogue::NONE, false);
        for part in text.split(',') {
            match part.split_once('=') {
                Some(("beta", v)) if !seen_epi && !residual => match v.parse::<f64>() {
                    Ok(1.0) => residual = true,
                    Ok(0.0) => {}
                    _ => {
                        return Err(Error::invalid(
                            "beta",
                            format!("{v:?} in {key:?}; a conv2d's residual is added whole: beta is 0 or 1"),
                        ));
                    }
                },
                Some(("epi", v)) if !seen_epi => {
                    epi = v.parse()?;
                    seen_epi = true;
                }
                _ => {
                    return Err(Error::invalid(
                        "key",
                        format!(
                            "{key:?} is not a workload key: unexpected {part:?} after the types; allowed: beta=1, then epi=<parts>"
                        ),
                    ));
                }
            }
        }
        Ok((residual, epi))
    }

    /// Output height P.
    pub fn p(&self) -> u64 {
        out_extent(self.h, self.r, self.pad.0, self.stride.0, self.dilation.0)
    }

    /// Output width Q.
    pub fn q(&self) -> u64 {
        out_extent(self.w, self.s, self.pad.1, self.stride.1, self.dilation.1)
    }

    /// Checks ranges and that the output is not empty.
    pub fn validate(&self) -> Result<()> {
        check_range("n", self.n, 1, 65536)?;
        check_range("h", self.h, 1, 65536)?;
        check_range("w", self.w, 1, 65536)?;
        check_range("c", self.c, 1, 65536)?;
        check_range("k", self.k, 1, 65536)?;
        check_range("r", self.r, 1, 31)?;
        check_range("s", self.s, 1, 31)?;
        check_range("stride_h", self.stride.0, 1, 16)?;
        check_range("stride_w", self.stride.1, 1, 16)?;
        check_range("dilation_h", self.dilation.0, 1, 16)?;
        check_range("dilation_w", self.dilation.1, 1, 16)?;
        let eff_r = (self.r - 1) * self.dilation.0 + 1;
        let eff_s = (self.s - 1) * self.dilation.1 + 1;
        if self.pad.0 >= eff_r {
            return Err(Error::invalid(
                "pad_h",
                format!("{} must be smaller than the dilated filter height {eff_r}", self.pad.0),
            ));
        }
        if self.pad.1 >= eff_s {
            return Err(Error::invalid(
                "pad_w",
                format!("{} must be smaller than the dilated filter width {eff_s}", self.pad.1),
            ));
        }
        if self.h + 2 * self.pad.0 < eff_r {
            return Err(Error::invalid(
                "h",
                format!(
                    "padded height {} is smaller than the dilated filter height {eff_r}: the output would be empty",
                    self.h + 2 * self.pad.0
                ),
            ));
        }
        if self.w + 2 * self.pad.1 < eff_s {
            return Err(Error::invalid(
                "w",
                format!(
                    "padded width {} is smaller than the dilated filter width {eff_s}: the output would be empty",
                    self.w + 2 * self.pad.1
                ),
            ));
        }
        let (m, n, k) = self.gemm_dims();
        for (field, what, v) in [
            ("n", "n*h*w*c (input)", self.n * self.h * self.w * self.c),
            ("k", "k*r*s*c (filter)", self.k * self.r * self.s * self.c),
            ("k", "n*p*q*k (output)", m * n),
        ] {
            if v > MAX_ELEMENTS {
                return Err(Error::invalid(
                    field,
                    format!("{what} = {v} elements exceeds the limit of {MAX_ELEMENTS} per tensor"),
                ));
            }
        }
        let _ = k;
        Types::new(self.types.input, self.types.accumulator, Some(self.types.output))?;
        if self.types.input.is_fp8() {
            return Err(Error::invalid(
                "input",
                format!("{} convolutions are not supported; 8-bit floats are for tn matmul only", self.types.input),
            ));
        }
        if self.types.input.is_packed() {
            return Err(Error::invalid(
                "input",
                format!(
                    "{} convolutions are not supported; packed sub-byte types are for tn matmul only",
                    self.types.input
                ),
            ));
        }
        if self.fused() && self.types.output.is_int() {
            return Err(Error::invalid(
                "epilogue",
                format!(
                    "{} needs a float output; {} convolutions fuse nothing",
                    self.epilogue_spelling(),
                    self.types.output
                ),
            ));
        }
        Ok(())
    }

    /// Implicit GEMM dimensions (M = N*P*Q, N = K, K = C*R*S).
    pub fn gemm_dims(&self) -> (u64, u64, u64) {
        (self.n * self.p() * self.q(), self.k, self.c * self.r * self.s)
    }

    /// Multiply-add operations counted as 2 each: 2 * N*P*Q * K * C*R*S.
    pub fn flops(&self) -> f64 {
        let (m, n, k) = self.gemm_dims();
        2.0 * m as f64 * n as f64 * k as f64
    }

    fn key(&self) -> String {
        let key = format!(
            "conv2d/n{}h{}w{}c{}/k{}r{}s{}/pad{}x{},stride{}x{},dil{}x{}/nhwc/{}",
            self.n,
            self.h,
            self.w,
            self.c,
            self.k,
            self.r,
            self.s,
            self.pad.0,
            self.pad.1,
            self.stride.0,
            self.stride.1,
            self.dilation.0,
            self.dilation.1,
            self.types.key()
        );
        // Left out when plain, so that keys from before conv epilogues existed stay as they were.
        match self.epilogue_spelling() {
            e if e.is_empty() => key,
            e => format!("{key}/{e}"),
        }
    }
}

fn out_extent(x: u64, f: u64, pad: u64, stride: u64, dil: u64) -> u64 {
    let eff = (f.saturating_sub(1)) * dil + 1;
    let padded = x + 2 * pad;
    if padded < eff || stride == 0 { 0 } else { (padded - eff) / stride + 1 }
}

fn check_range(field: &'static str, v: u64, lo: u64, hi: u64) -> Result<()> {
    if v < lo || v > hi {
        return Err(Error::invalid(field, format!("{v} is out of range; allowed {lo} ..= {hi}")));
    }
    Ok(())
}

fn fmt_scale(v: f64) -> String {
    // `{}` prints the shortest string that parses back to the same f64, so keys are stable.
    let v = if v == 0.0 { 0.0 } else { v };
    format!("{v}")
}

/// The operation a workload performs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    /// General matrix multiply.
    Matmul,
    /// 2-D convolution.
    Conv2d,
}

impl Op {
    /// Lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            Op::Matmul => "matmul",
            Op::Conv2d => "conv2d",
        }
    }
}

/// One operation to tune.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum Workload {
    /// A matmul.
    Matmul(Matmul),
    /// A convolution.
    Conv2d(Conv2d),
}

impl Workload {
    /// The canonical key: stable across versions, unique per meaning.
    pub fn key(&self) -> String {
        match self {
            Workload::Matmul(m) => m.key(),
            Workload::Conv2d(c) => c.key(),
        }
    }

    /// The operation.
    pub fn op(&self) -> Op {
        match self {
            Workload::Matmul(_) => Op::Matmul,
            Workload::Conv2d(_) => Op::Conv2d,
        }
    }

    /// The matmul, or `Unsupported` naming `template` (a matmul template given another op).
    pub fn matmul_for(&self, template: &'static str) -> Result<&Matmul> {
        match self {
            Workload::Matmul(m) => Ok(m),
            other => Err(Error::Unsupported { template, what: format!("{} workloads", other.op().name()) }),
        }
    }

    /// Checks every field.
    pub fn validate(&self) -> Result<()> {
        match self {
            Workload::Matmul(m) => m.validate(),
            Workload::Conv2d(c) => c.validate(),
        }
    }

    /// Operations of one run.
    pub fn flops(&self) -> f64 {
        match self {
            Workload::Matmul(m) => m.flops(),
            Workload::Conv2d(c) => c.flops(),
        }
    }

    /// Element types.
    pub fn types(&self) -> Types {
        match self {
            Workload::Matmul(m) => m.types,
            Workload::Conv2d(c) => c.types,
        }
    }

    /// How far `other`'s shape is from this one, when both are the same kind of problem: the same
    /// operation and types, for matmul the same layout, for conv2d the same filter size, padding,
    /// stride and dilation. The distance is the sum over the free dimensions (M, N, K; or N, H, W,
    /// C, K) of |ln(a / b)|, plus 0.001 when the epilogues differ (a tie-break toward the same
    /// epilogue). `None` when the two are not comparable. A kernel is generated for one
    /// exact shape: the nearest tuned shape is a suggestion (its config), never a kernel to run on
    /// this one.
    pub fn shape_distance(&self, other: &Workload) -> Option<f64> {
        let ln = |a: u64, b: u64| ((a as f64) / (b as f64)).ln().abs();
        match (self, other) {
            (Workload::Matmul(a), Workload::Matmul(b))
                if a.layout == b.layout && a.types == b.types && a.groups.is_empty() == b.groups.is_empty() =>
            {
                let same = (a.alpha, a.beta, a.epilogue, a.input_scale, a.groups)
                    == (b.alpha, b.beta, b.epilogue, b.input_scale, b.groups);
                let epilogue = if same { 0.0 } else { 1e-3 };
                Some(ln(a.m, b.m) + ln(a.n, b.n) + ln(a.k, b.k) + ln(a.batch, b.batch) + epilogue)
            }
            (Workload::Conv2d(a), Workload::Conv2d(b))
                if a.types == b.types
                    && (a.r, a.s, a.pad, a.stride, a.dilation) == (b.r, b.s, b.pad, b.stride, b.dilation) =>
            {
                let epilogue = if (a.epilogue, a.residual) == (b.epilogue, b.residual) { 0.0 } else { 1e-3 };
                Some(ln(a.n, b.n) + ln(a.h, b.h) + ln(a.w, b.w) + ln(a.c, b.c) + ln(a.k, b.k) + epilogue)
            }
            _ => None,
        }
    }

    /// A SQL `LIKE` pattern that matches the key of every workload [`Workload::shape_distance`]
    /// can compare with this one (and perhaps a few more, which the distance then rules out).
    pub fn comparable_key_pattern(&self) -> String {
        match self {
            Workload::Matmul(m) => format!("matmul/%/{}/{}/%", m.layout, m.types.key()),
            Workload::Conv2d(c) => format!("conv2d/%/nhwc/{}", c.types.key()),
        }
    }

    /// Parses a key made by [`Workload::key`] and validates the result.
    pub fn from_key(key: &str) -> Result<Workload> {
        let bad = |why: &str| Error::invalid("key", format!("{key:?} is not a workload key: {why}"));
        let parts: Vec<&str> = key.split('/').collect();
        let w = match parts.as_slice() {
            ["matmul", dims, layout, types, epi] => {
                let (batch, m, groups, n, k) = Matmul::parse_dims(key, dims)?;
                let (alpha, beta, input_scale, epilogue) = Matmul::parse_epilogue(key, epi)?;
                Workload::Matmul(Matmul {
                    m,
                    n,
                    k,
                    batch,
                    groups,
                    layout: layout.parse()?,
                    types: Types::parse_key(types)?,
                    alpha,
                    beta,
                    epilogue,
                    input_scale,
                })
            }
            ["conv2d", input, filter, geo, "nhwc", types, epi @ ..] if epi.len() <= 1 => {
                let (residual, epilogue) = match epi {
                    [e] => Conv2d::parse_epilogue(key, e)?,
                    _ => (false, Epilogue::NONE),
                };
                let i = parse_fields(input, &['n', 'h', 'w', 'c'])
                    .ok_or_else(|| bad("input must read n<N>h<H>w<W>c<C>"))?;
                let f = parse_fields(filter, &['k', 'r', 's']).ok_or_else(|| bad("filter must read k<K>r<R>s<S>"))?;
                let g: Vec<(u64, u64)> = geo
                    .split(',')
                    .zip(["pad", "stride", "dil"])
                    .filter_map(|(part, name)| {
                        let (a, b) = part.strip_prefix(name)?.split_once('x')?;
                        Some((a.parse().ok()?, b.parse().ok()?))
                    })
                    .collect();
                let [pad, stride, dilation] = g.as_slice() else {
                    return Err(bad("geometry must read pad<h>x<w>,stride<h>x<w>,dil<h>x<w>"));
                };
                Workload::Conv2d(Conv2d {
                    n: i[0],
                    h: i[1],
                    w: i[2],
                    c: i[3],
                    k: f[0],
                    r: f[1],
                    s: f[2],
                    pad: *pad,
                    stride: *stride,
                    dilation: *dilation,
                    types: Types::parse_key(types)?,
                    epilogue,
                    residual,
                })
            }
            _ => return Err(bad("expected matmul/... or conv2d/...")),
        };
        w.validate()?;
        Ok(w)
    }
}

/// Parses `m512n64k512` against the letters `mnk`.
fn parse_fields(s: &str, letters: &[char]) -> Option<Vec<u64>> {
    let mut out = Vec::with_capacity(letters.len());
    let mut rest = s;
    for (i, l) in letters.iter().enumerate() {
        rest = rest.strip_prefix(*l)?;
        let end = match letters.get(i + 1) {
            Some(next) => rest.find(*next)?,
            None => rest.len(),
        };
        out.push(rest[..end].parse().ok()?);
        rest = &rest[end..];
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16() -> Types {
        Types::new(DType::F16, DType::F32, None).unwrap()
    }

    #[test]
    fn shape_distance_compares_like_with_like() {
        let mm = |m, n, k, layout| Workload::Matmul(Matmul::new(m, n, k, layout, f16()).unwrap());
        let asked = mm(1000, 1000, 1000, Layout::Nn);
        let near = mm(1024, 1024, 1024, Layout::Nn);
        let far = mm(4096, 1024, 1024, Layout::Nn);
        let (dn, df) = (asked.shape_distance(&near).unwrap(), asked.shape_distance(&far).unwrap());
        assert!(dn < df, "{dn} {df}");
        assert!((dn - 3.0 * (1.024f64).ln()).abs() < 1e-12, "{dn}");
        assert_eq!(asked.shape_distance(&asked), Some(0.0));
        assert_eq!(asked.shape_distance(&mm(1000, 1000, 1000, Layout::Tn)), None);
        let bf16 = Types::new(DType::Bf16, DType::F32, None).unwrap();
        assert_eq!(
            asked.shape_distance(&Workload::Matmul(Matmul::new(1000, 1000, 1000, Layout::Nn, bf16).unwrap())),
            None
        );
        let mut scaled = Matmul::new(1000, 1000, 1000, Layout::Nn, f16()).unwrap();
        scaled.beta = 1.0;
        assert!(asked.shape_distance(&Workload::Matmul(scaled)).unwrap() > 0.0);
        for key in [near.key(), far.key()] {
            let pattern = asked.comparable_key_pattern();
            let (head, tail) = pattern.split_once("/%/").unwrap();
            assert!(key.starts_with(head) && key.contains(tail.trim_end_matches('%')), "{pattern} {key}");
        }
    }

    #[test]
    fn matmul_key_round_trips() {
        let w = Workload::Matmul(Matmul::new(512, 64, 512, Layout::Nn, f16()).unwrap());
        assert_eq!(w.key(), "matmul/m512n64k512/nn/f16,f32,f32/alpha=1,beta=0");
        assert_eq!(Workload::from_key(&w.key()).unwrap(), w);
        let mut m =
            Matmul::new(1000, 1001, 64, Layout::Tt, Types::new(DType::Bf16, DType::F32, Some(DType::Bf16)).unwrap())
                .unwrap();
        m.alpha = 0.5;
        m.beta = -1.25;
        let w = Workload::Matmul(m);
        assert_eq!(Workload::from_key(&w.key()).unwrap(), w);
    }

    #[test]
    fn fp8_and_epilogue_keys_round_trip_and_old_keys_stay() {
        let e4m3 = Types::new(DType::E4m3, DType::F32, Some(DType::Bf16)).unwrap();
        let mut m = Matmul::new(4096, 4096, 4096, Layout::Tn, e4m3).unwrap();
        m.input_scale = InputScale::Tensor;
        let w = Workload::Matmul(m);
        assert_eq!(w.key(), "matmul/m4096n4096k4096/tn/e4m3,f32,bf16/alpha=1,beta=0,scale=tensor");
        assert_eq!(Workload::from_key(&w.key()).unwrap(), w);
        m.epilogue = "gelu+bias".parse().unwrap();
        m.beta = 1.0;
        let w = Workload::Matmul(m);
        assert_eq!(w.key(), "matmul/m4096n4096k4096/tn/e4m3,f32,bf16/alpha=1,beta=1,scale=tensor,epi=bias+gelu");
        assert_eq!(Workload::from_key(&w.key()).unwrap(), w);
        let mut bf =
            Matmul::new(512, 64, 512, Layout::Nn, Types::new(DType::Bf16, DType::F32, Some(DType::Bf16)).unwrap())
                .unwrap();
        bf.epilogue = "scale+relu".parse().unwrap();
        let w = Workload::Matmul(bf);
        assert_eq!(w.key(), "matmul/m512n64k512/nn/bf16,f32,bf16/alpha=1,beta=0,epi=scale+relu");
        assert_eq!(Workload::from_key(&w.key()).unwrap(), w);
        // A different epilogue is the same shape with a tie-break, never the same key.
        let plain = Workload::Matmul(Matmul { epilogue: Epilogue::NONE, ..bf });
        assert_eq!(plain.key(), "matmul/m512n64k512/nn/bf16,f32,bf16/alpha=1,beta=0");
        assert!(plain.shape_distance(&w).unwrap() > 0.0);
        // JSON written before the fields existed still reads.
        let old = r#"{"op":"matmul","m":8,"n":8,"k":16,"layout":"nn","types":{"input":"f16","accumulator":"f32","output":"f32"},"alpha":1.0,"beta":0.0}"#;
        let read: Workload = serde_json::from_str(old).unwrap();
        assert!(matches!(read, Workload::Matmul(m) if !m.fused()));
    }

    #[test]
    fn batched_and_grouped_keys_round_trip_and_name_their_errors() {
        let bert = "matmul/b96m384n384k64/tn/f16,f32,f16/alpha=1,beta=0";
        let Workload::Matmul(b) = Workload::from_key(bert).unwrap() else { unreachable!() };
        assert_eq!((b.batch, b.m, b.problems(), b.flops()), (96, 384, 96, 2.0 * 384.0 * 384.0 * 64.0 * 96.0));
        assert_eq!(Workload::Matmul(b).key(), bert);
        let moe = "matmul/m128+256+4096n4096k4096/tn/bf16,f32,bf16/alpha=1,beta=0";
        let Workload::Matmul(g) = Workload::from_key(moe).unwrap() else { unreachable!() };
        assert_eq!((g.m, g.groups.len(), g.batch), (4480, 3, 1));
        assert_eq!(Workload::Matmul(g).key(), moe);
        // The JSON of a plain matmul has neither field; a batched one reads back.
        let plain = Matmul::new(64, 64, 64, Layout::Tn, f16()).unwrap();
        assert!(!serde_json::to_string(&plain).unwrap().contains("batch"));
        for w in [b, g] {
            let json = serde_json::to_string(&Workload::Matmul(w)).unwrap();
            assert_eq!(serde_json::from_str::<Workload>(&json).unwrap(), Workload::Matmul(w));
        }
        // Batched and plain shapes compare (batch is one more dimension); grouped only with grouped.
        assert!(Workload::Matmul(b).shape_distance(&Workload::Matmul(Matmul { batch: 1, ..b })).unwrap() > 4.0);
        assert_eq!(Workload::Matmul(g).shape_distance(&Workload::Matmul(Matmul { groups: Groups::NONE, ..g })), None);
        for (key, field, says) in [
            ("matmul/b0m64n64k64/tn/f16,f32,f32/alpha=1,beta=0", "batch", "allowed 1 ..= 65535"),
            ("matmul/b65536m64n64k64/tn/f16,f32,f32/alpha=1,beta=0", "batch", "allowed 1 ..= 65535"),
            ("matmul/b4096m1024n1024k1024/tn/f16,f32,f32/alpha=1,beta=0", "batch", "exceed the limit"),
            ("matmul/b2m64+64n64k64/tn/f16,f32,f32/alpha=1,beta=0", "batch", "with groups"),
            ("matmul/m64+0n64k64/tn/f16,f32,f32/alpha=1,beta=0", "groups", "group 1 has m = 0"),
            ("matmul/bxm64n64k64/tn/f16,f32,f32/alpha=1,beta=0", "key", "[b<B>]m<M>n<N>k<K>"),
        ] {
            let e = Workload::from_key(key).unwrap_err();
            assert_eq!(e.field(), Some(field), "{key}: {e}");
            assert!(e.to_string().contains(says), "{key}: {e}");
        }
        let e = b.require_plain("wmma_gemm").unwrap_err();
        assert!(e.field() == Some("batch") && e.to_string().contains("wmma_gemm runs one problem"), "{e}");
        assert_eq!(g.require_plain("simt_gemm").unwrap_err().field(), Some("groups"));
    }

    #[test]
    fn fp8_and_epilogue_errors_name_the_field_and_the_allowed_values() {
        let base = "matmul/m64n64k64/tn/e4m3,f32,bf16/alpha=1,beta=0";
        for (key, field, says) in [
            ("matmul/m64n64k64/nn/e4m3,f32,bf16/alpha=1,beta=0", "layout", "layout tn"),
            ("matmul/m64n64k64/tn/e5m2,f32,i32/alpha=1,beta=0", "output", "allowed: bf16, f16, f32"),
            ("matmul/m64n64k64/tn/e4m3,f16,f16/alpha=1,beta=0", "accumulator", "allowed: f32"),
            ("matmul/m64n64k64/tn/f16,f32,f32/alpha=1,beta=0,scale=tensor", "scale", "e4m3 and e5m2"),
            ("matmul/m64n64k64/tn/e4m3,f32,bf16/alpha=1,beta=0,scale=row", "scale", "allowed: none, tensor"),
            ("matmul/m64n64k64/tn/e4m3,f32,bf16/alpha=1,beta=0,epi=bias+swish", "epilogue", "allowed: scale, bias"),
            ("matmul/m64n64k64/tn/i8,i32,i32/alpha=1,beta=0,epi=relu", "epilogue", "float output"),
            ("matmul/m64n64k64/tn/e4m3,f32,bf16/alpha=1,beta=0,epi=relu,scale=tensor", "key", "then epi"),
        ] {
            let e = Workload::from_key(key).unwrap_err();
            assert_eq!(e.field(), Some(field), "{key}: {e}");
            assert!(e.to_string().contains(says), "{key}: {e}");
        }
        Workload::from_key(base).unwrap();
        let conv = "conv2d/n1h8w8c16/k16r1s1/pad0x0,stride1x1,dil1x1/nhwc/e4m3,f32,bf16";
        assert_eq!(Workload::from_key(conv).unwrap_err().field(), Some("input"));
    }

    #[test]
    fn conv_epilogue_keys_round_trip_and_plain_keys_stay() {
        let plain = "conv2d/n32h56w56c64/k256r1s1/pad0x0,stride1x1,dil1x1/nhwc/f16,f32,f16";
        let Workload::Conv2d(c) = Workload::from_key(plain).unwrap() else { unreachable!() };
        assert!(!c.fused() && Workload::Conv2d(c).key() == plain);
        for (tail, epi, residual) in [
            ("/epi=bias+relu", "bias+relu", false),
            ("/beta=1,epi=bias+relu", "bias+relu", true),
            ("/beta=1", "none", true),
            ("/epi=scale+bias+gelu", "scale+bias+gelu", false),
        ] {
            let w = Workload::from_key(&format!("{plain}{tail}")).unwrap();
            let Workload::Conv2d(f) = w else { unreachable!() };
            assert_eq!((f.epilogue.name(), f.residual), (epi.to_string(), residual), "{tail}");
            assert_eq!(w.key(), format!("{plain}{tail}"));
            assert!(f.fused() && Conv2d { epilogue: Epilogue::NONE, residual: false, ..f } == c);
        }
        // Another epilogue of the same layer is near, never the same.
        let fused = Workload::from_key(&format!("{plain}/epi=bias+relu")).unwrap();
        assert_eq!(fused.shape_distance(&Workload::Conv2d(c)), Some(1e-3));
        // beta=0 is the plain layer, spelled as such.
        assert_eq!(Workload::from_key(&format!("{plain}/beta=0")).unwrap().key(), plain);
        for (tail, field, says) in [
            ("/beta=2", "beta", "beta is 0 or 1"),
            ("/epi=bias+swish", "epilogue", "allowed: scale, bias"),
            ("/epi=relu,beta=1", "key", "then epi"),
            ("/epi=relu/x", "key", "expected matmul"),
        ] {
            let e = Workload::from_key(&format!("{plain}{tail}")).unwrap_err();
            assert_eq!(e.field(), Some(field), "{tail}: {e}");
            assert!(e.to_string().contains(says), "{tail}: {e}");
        }
        let i8 = "conv2d/n1h8w8c16/k16r1s1/pad0x0,stride1x1,dil1x1/nhwc/i8,i32,i32/beta=1";
        let e = Workload::from_key(i8).unwrap_err();
        assert!(e.field() == Some("epilogue") && e.to_string().contains("float output"), "{e}");
        c.require_plain("wmma_conv2d").unwrap();
        let e = Conv2d { residual: true, ..c }.require_plain("wmma_conv2d").unwrap_err();
        assert!(e.field() == Some("epilogue") && e.to_string().contains("wmma_conv2d fuses no"), "{e}");
    }

    #[test]
    fn conv_key_round_trips_and_sizes() {
        let c = Conv2d {
            n: 32,
            h: 56,
            w: 56,
            c: 64,
            k: 128,
            r: 3,
            s: 3,
            pad: (1, 1),
            stride: (2, 2),
            dilation: (1, 1),
            types: f16(),
            epilogue: Default::default(),
            residual: false,
        };
        c.validate().unwrap();
        assert_eq!((c.p(), c.q()), (28, 28));
        assert_eq!(c.gemm_dims(), (32 * 28 * 28, 128, 64 * 9));
        let w = Workload::Conv2d(c);
        assert_eq!(Workload::from_key(&w.key()).unwrap(), w);
    }

    #[test]
    fn f32_and_tf32_conv_keys_round_trip_and_never_compare() {
        let layer = |types| Conv2d {
            n: 8,
            h: 56,
            w: 56,
            c: 64,
            k: 64,
            r: 3,
            s: 3,
            pad: (1, 1),
            stride: (1, 1),
            dilation: (1, 1),
            types,
            epilogue: Default::default(),
            residual: false,
        };
        let exact = Workload::Conv2d(layer(Types::default_for(DType::F32).unwrap()));
        let tf32 = Workload::Conv2d(layer(Types::default_for(DType::Tf32).unwrap()));
        exact.validate().unwrap();
        tf32.validate().unwrap();
        assert_eq!(exact.key(), "conv2d/n8h56w56c64/k64r3s3/pad1x1,stride1x1,dil1x1/nhwc/f32,f32,f32");
        assert_eq!(tf32.key(), "conv2d/n8h56w56c64/k64r3s3/pad1x1,stride1x1,dil1x1/nhwc/tf32,f32,f32");
        for w in [exact, tf32] {
            assert_eq!(Workload::from_key(&w.key()).unwrap(), w);
        }
        // Different numbers, so different problems: never each other's nearest shape.
        assert_eq!(exact.shape_distance(&tf32), None);
        assert!(exact.comparable_key_pattern().ends_with("/nhwc/f32,f32,f32"));
        // Both accumulate and write f32 only; the errors name the field and what is allowed.
        for (key, field, allowed) in [
            ("conv2d/n1h8w8c4/k4r1s1/pad0x0,stride1x1,dil1x1/nhwc/tf32,f32,f16", "output", "allowed: f32"),
            ("conv2d/n1h8w8c4/k4r1s1/pad0x0,stride1x1,dil1x1/nhwc/f32,f16,f16", "accumulator", "allowed: f32"),
        ] {
            let e = Workload::from_key(key).unwrap_err();
            assert_eq!(e.field(), Some(field), "{e}");
            assert!(e.to_string().contains(allowed), "{e}");
        }
    }

    #[test]
    fn bad_shapes_name_the_field() {
        let e = Matmul::new(0, 64, 512, Layout::Nn, f16()).unwrap_err();
        assert_eq!(e.field(), Some("m"));
        assert!(e.to_string().contains("1 ..= 1048576"), "{e}");
        let e = Matmul::new(64, 64, MAX_DIM + 1, Layout::Nn, f16()).unwrap_err();
        assert_eq!(e.field(), Some("k"));
        let e = Matmul::new(1 << 20, 1 << 20, 64, Layout::Nn, f16()).unwrap_err();
        assert_eq!(e.field(), Some("n"));
        let mut m = Matmul::new(64, 64, 64, Layout::Nn, Types::default_for(DType::I8).unwrap()).unwrap();
        m.alpha = 0.5;
        assert_eq!(m.validate().unwrap_err().field(), Some("alpha"));
    }

    #[test]
    fn new_type_keys_round_trip() {
        for (input, layout, k) in [
            (DType::F32, Layout::Nn, 1000),
            (DType::Tf32, Layout::Nt, 1000),
            (DType::S4, Layout::Tn, 4096),
            (DType::U4, Layout::Tn, 32),
            (DType::B1Xor, Layout::Tn, 128),
            (DType::B1And, Layout::Tn, 4096),
        ] {
            let w = Workload::Matmul(Matmul::new(512, 64, k, layout, Types::default_for(input).unwrap()).unwrap());
            assert_eq!(Workload::from_key(&w.key()).unwrap(), w, "{}", w.key());
        }
        let tf32 =
            Workload::Matmul(Matmul::new(64, 64, 64, Layout::Nn, Types::default_for(DType::Tf32).unwrap()).unwrap());
        assert_eq!(tf32.key(), "matmul/m64n64k64/nn/tf32,f32,f32/alpha=1,beta=0");
        let exact =
            Workload::Matmul(Matmul::new(64, 64, 64, Layout::Nn, Types::default_for(DType::F32).unwrap()).unwrap());
        assert_eq!(exact.key(), "matmul/m64n64k64/nn/f32,f32,f32/alpha=1,beta=0");
        // TF32 and exact f32 are different problems: never comparable, never the same key.
        assert_eq!(tf32.shape_distance(&exact), None);
        let b1 =
            Workload::Matmul(Matmul::new(64, 64, 128, Layout::Tn, Types::default_for(DType::B1Xor).unwrap()).unwrap());
        assert_eq!(b1.key(), "matmul/m64n64k128/tn/b1xor,i32,i32/alpha=1,beta=0");
    }

    #[test]
    fn packed_types_name_k_and_layout() {
        let s4 = Types::default_for(DType::S4).unwrap();
        let e = Matmul::new(64, 64, 48, Layout::Tn, s4).unwrap_err();
        assert_eq!(e.field(), Some("k"));
        assert!(e.to_string().contains("multiple of 32"), "{e}");
        let e = Matmul::new(64, 64, 64, Layout::Tn, Types::default_for(DType::B1And).unwrap()).unwrap_err();
        assert_eq!(e.field(), Some("k"));
        assert!(e.to_string().contains("multiple of 128"), "{e}");
        let e = Matmul::new(64, 64, 64, Layout::Nn, s4).unwrap_err();
        assert_eq!(e.field(), Some("layout"));
        assert!(e.to_string().contains("must be tn"), "{e}");
        assert_eq!(Types::new(DType::S4, DType::F32, None).unwrap_err().field(), Some("accumulator"));
        assert_eq!(Types::new(DType::Tf32, DType::F32, Some(DType::F16)).unwrap_err().field(), Some("output"));
        let e = Workload::from_key("matmul/m64n64k64/nn/u4,i32,i32/alpha=1,beta=0").unwrap_err();
        assert_eq!(e.field(), Some("layout"));
    }

    #[test]
    fn type_combinations() {
        assert!(Types::new(DType::I8, DType::F32, None).unwrap_err().to_string().contains("allowed: i32"));
        assert_eq!(Types::new(DType::F16, DType::F32, Some(DType::I32)).unwrap_err().field(), Some("output"));
        assert_eq!(Types::new(DType::I32, DType::I32, None).unwrap_err().field(), Some("input"));
        assert_eq!(Types::default_for(DType::F32).unwrap().accumulator, DType::F32);
        assert_eq!(Types::default_for(DType::Bf16).unwrap().output, DType::F32);
    }

    #[test]
    fn conv_geometry_errors() {
        let ok = Conv2d {
            n: 1,
            h: 7,
            w: 7,
            c: 16,
            k: 16,
            r: 3,
            s: 3,
            pad: (1, 1),
            stride: (1, 1),
            dilation: (1, 1),
            types: f16(),
            epilogue: Default::default(),
            residual: false,
        };
        ok.validate().unwrap();
        let e = Conv2d { pad: (3, 1), ..ok }.validate().unwrap_err();
        assert_eq!(e.field(), Some("pad_h"));
        let e = Conv2d { h: 1, pad: (0, 0), ..ok }.validate().unwrap_err();
        assert_eq!(e.field(), Some("h"));
        assert!(e.to_string().contains("empty"));
        let e = Conv2d { stride: (0, 1), ..ok }.validate().unwrap_err();
        assert_eq!(e.field(), Some("stride_h"));
        assert!(Workload::from_key("matmul/m1n2/nn").is_err());
    }

    #[test]
    fn conv_validation_names_the_field_and_the_allowed_values() {
        let ok = Conv2d {
            n: 2,
            h: 9,
            w: 7,
            c: 16,
            k: 24,
            r: 3,
            s: 1,
            pad: (1, 0),
            stride: (2, 1),
            dilation: (1, 2),
            types: f16(),
            epilogue: Default::default(),
            residual: false,
        };
        ok.validate().unwrap();
        assert_eq!((ok.p(), ok.q()), (5, 7));
        let err = |c: Conv2d| c.validate().unwrap_err();
        // Padding as large as the (dilated) filter only adds output that sees no input.
        let e = err(Conv2d { pad: (1, 1), ..ok });
        assert_eq!(e.field(), Some("pad_w"));
        assert!(e.to_string().contains("smaller than the dilated filter width 1"), "{e}");
        let e = err(Conv2d { r: 2, pad: (2, 0), ..ok });
        assert_eq!(e.field(), Some("pad_h"));
        // Dilation widens the filter, so it widens the padding allowed too.
        Conv2d { s: 3, pad: (1, 4), dilation: (1, 2), ..ok }.validate().unwrap();
        // Output size 0: the (dilated) filter is larger than the padded input.
        let e = err(Conv2d { w: 2, s: 2, dilation: (1, 2), pad: (1, 0), ..ok });
        assert_eq!(e.field(), Some("w"));
        assert!(e.to_string().contains("the output would be empty"), "{e}");
        let e = err(Conv2d { h: 1, r: 5, pad: (1, 0), ..ok });
        assert_eq!(e.field(), Some("h"));
        // Zero or out-of-range sizes name their field and the range.
        for (field, c) in [
            ("n", Conv2d { n: 0, ..ok }),
            ("c", Conv2d { c: 0, ..ok }),
            ("k", Conv2d { k: 0, ..ok }),
            ("h", Conv2d { h: 0, ..ok }),
            ("r", Conv2d { r: 32, ..ok }),
            ("s", Conv2d { s: 0, ..ok }),
            ("stride_w", Conv2d { stride: (1, 17), ..ok }),
            ("dilation_h", Conv2d { dilation: (0, 1), ..ok }),
        ] {
            let e = err(c);
            assert_eq!(e.field(), Some(field), "{e}");
            assert!(e.to_string().contains("out of range; allowed"), "{e}");
        }
        // Tensors past 32-bit indexing.
        let e = err(Conv2d { n: 4096, h: 512, w: 512, c: 16, pad: (0, 0), ..ok });
        assert_eq!(e.field(), Some("n"));
        assert!(e.to_string().contains("exceeds the limit"), "{e}");
        // Types: i8 accumulates in i32 only.
        let bad_types = Types { input: DType::I8, accumulator: DType::F32, output: DType::F32 };
        assert_eq!(err(Conv2d { types: bad_types, ..ok }).field(), Some("accumulator"));
    }
}
