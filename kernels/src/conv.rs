//! `wmma_conv2d`: forward 2-D convolution as an implicit GEMM on the WMMA core that `wmma_gemm`
//! uses. NHWC input, KRSC filter, NPQK output; GEMM M = N*P*Q output pixels, GEMM N = K output
//! channels, GEMM K = R*S*C in (r, s, c) order, so the K slices of one filter tap are contiguous
//! channels of the input. Knobs, validity rules, code generation, features and the analytic model
//! all derive from one [`Plan`], so what is checked is what is generated.
//!
//! - A (activations) is gathered: A(m, kk) = in[n][p*sh - ph + r*dh][q*sw - pw + s*dw][c], zero
//!   outside the input. C must be a multiple of the 16-byte vector (8 channels of f16/bf16, 16 of
//!   i8), so a vector never straddles two taps. A K tile may straddle taps (C need not be a multiple
//!   of block_k): every thread decomposes its own column into (r, s, c) each stage.
//! - B (filter) is the dense K-contiguous matrix filter[n * R*S*C + kk].
//! - D(m, n) lives at m * K + n (NPQK). The kernel (`cuda/wmma_core.cu`, whose epilogue writes a
//!   column-major D) computes the transposed GEMM D^T = B^T A^T: its M is the output channels, its
//!   N the pixels, its A the filter. The knobs keep this module's view (block_m tiles pixels);
//!   [`Tiling::header`] swaps the sides.
//! - Knob `path`: `implicit` (the gather, any conv) or `pointwise` (1x1, stride 1, no padding only:
//!   A is the dense [N*H*W][C] matrix and loads like wmma_gemm's, with no geometry at all).
//! - Knob `gather` (implicit path): where each A row's receptive-field origin lives once the block
//!   has computed it: `regs` (each thread keeps its rows' in registers, 3 per row) or `smem` (a
//!   16-byte-per-row table in shared memory after the ring, read every stage).
//! - TF32 (`tf32,f32,f32`, sm_80 and newer): f32 tensors, staged as f32, read into WMMA's one TF32
//!   fragment shape, m16n16k8, and rounded to TF32 before the MMAs. The `frag` knob's m16n16k16
//!   stands for it (a 16x16 warp fragment, K steps of 8); m32n8k16 and m8n32k16 have no TF32 form.
//!   Channels come in 16-byte vectors of 4. Exact f32 is refused: the tensor cores would round it.
//!   The TF32 code is behind `TT_TF32`, defined for tf32 kernels only, so the kernels of the other
//!   types preprocess to what they were and the version stays.
//! - Blocks run along output channels first, so the blocks that share a tile of activations (the
//!   large operand) run together and read it from DRAM about once: no swizzle knob.

use crate::cuda::{Scalar, ident};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::space::{Config, Knob, KnobValue, Space};
use crate::target::Target;
use crate::template::{KernelSpec, Resources, Template};
use crate::tiling::{Core, FRAGS, GemmView, LAUNCH_US, Tiling, check_tensor_cores, widest_vec};
use crate::workload::{Conv2d, Op, Workload};

/// wmma_conv2d's fills of `wmma_core.cu`'s holes: its title, its loaders, the gather's setup.
const FILLS: &str = include_str!("cuda/wmma_conv2d.cu");

/// The kernel body: `wmma_core.cu` with wmma_conv2d's fills, once.
fn body() -> &'static str {
    static BODY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BODY.get_or_init(|| crate::cuda::fill_holes(crate::cuda::WMMA_CORE, FILLS))
}

/// A knob's domain.
enum Domain {
    Ints(&'static [u32]),
    Names(&'static [&'static str]),
}

use Domain::{Ints, Names};

/// The knobs in index order (the last varies fastest). The first [`TILE_KNOBS`] shape the tile
/// alone; valid-config enumeration prunes on them.
const KNOBS: [(&str, Domain); 14] = [
    ("block_m", Ints(&[16, 32, 64, 128, 256])),
    ("block_n", Ints(&[16, 32, 64, 128, 256])),
    ("block_k", Ints(&[32, 64])),
    ("warps_m", Ints(&[1, 2, 4])),
    ("warps_n", Ints(&[1, 2, 4])),
    ("warps_k", Ints(&[1, 2, 4])),
    ("frag", Names(&["m16n16k16", "m32n8k16", "m8n32k16"])),
    ("stages", Ints(&[1, 2, 3, 4, 8])),
    ("skew", Ints(&[0, 1])),
    ("split_k", Ints(&[1, 2, 4, 8, 16])),
    ("split_reduce", Names(&["workspace", "cluster"])),
    ("min_blocks", Ints(&[1, 2])),
    ("path", Names(&["implicit", "pointwise"])),
    ("gather", Names(&["regs", "smem"])),
];
const TILE_KNOBS: usize = 7;

/// Rows of the A tile one thread may keep the origins of in registers (3 registers each).
const MAX_GATHER_REG_ROWS: u32 = 8;
/// Rows per thread from which the shared-memory row table may pay for its reads.
const MIN_GATHER_SMEM_ROWS: u32 = 4;
/// Bytes of the shared-memory row table per A row (origin offset, h0, w0, padding: one int4).
const TABLE_ROW_BYTES: u32 = 16;
/// WMMA's one TF32 fragment shape, which the `frag` knob's m16n16k16 stands for on tf32 layers.
const TF32_FRAG: (&str, u32, u32, u32) = ("m16n16k8", 16, 16, 8);

fn domain_len(k: usize) -> usize {
    match KNOBS[k].1 {
        Ints(v) => v.len(),
        Names(v) => v.len(),
    }
}

fn int_at(pos: &[usize], k: usize) -> u32 {
    match KNOBS[k].1 {
        Ints(v) => v[pos[k]],
        Names(_) => unreachable!("knob {} is named", KNOBS[k].0),
    }
}

fn name_at(pos: &[usize], k: usize) -> &'static str {
    match KNOBS[k].1 {
        Names(v) => v[pos[k]],
        Ints(_) => unreachable!("knob {} is an integer", KNOBS[k].0),
    }
}

/// The implicit-GEMM WMMA convolution template.
pub struct WmmaConv2d;

/// Every quantity a config implies for a workload, computed once: the shared [`Tiling`] (which
/// the plan dereferences to) and what only wmma_conv2d has.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The workload.
    pub w: Conv2d,
    /// Tiles, warps, pipeline and split-K of the GEMM view.
    pub t: Tiling,
    /// Whether A is read as the dense [N*H*W][C] matrix (1x1, stride 1, no padding).
    pub pointwise: bool,
    /// Whether the rows' receptive-field origins live in shared memory rather than registers.
    pub gather_smem: bool,
    /// Bytes per store of D.
    pub vec_d: u32,
    /// Bytes per global load of the activations and the filter (16: the channels rule allows it).
    pub vec_in: u32,
}

impl Plan {
    /// The plan of the config at `index` of the space, without building the config.
    pub fn at(w: &Conv2d, index: u64, target: &Target) -> Plan {
        let mut positions = [0usize; KNOBS.len()];
        let mut below = 1u64;
        for (k, at) in positions.iter_mut().enumerate().rev() {
            let radix = domain_len(k) as u64;
            *at = (index / below % radix) as usize;
            below *= radix;
        }
        Plan::from_positions(w, &positions, target)
    }

    /// Reads the knobs of `config` (domains are checked by the space).
    pub fn new(w: &Conv2d, config: &Config, target: &Target) -> Result<Plan> {
        Ok(Plan::from_positions(w, &WmmaConv2d.space().positions(config)?, target))
    }

    fn from_positions(w: &Conv2d, pos: &[usize], target: &Target) -> Plan {
        let (m, n, k) = w.gemm_dims();
        let e = w.types.input.bytes();
        let out = w.types.output.bytes();
        let (bm, bn, bk) = (int_at(pos, 0), int_at(pos, 1), int_at(pos, 2));
        let pointwise = name_at(pos, 12) == "pointwise";
        let gather_smem = name_at(pos, 13) == "smem";
        let mut frag = FRAGS.iter().find(|f| f.0 == name_at(pos, 6)).copied().expect("frag names come from FRAGS");
        if w.types.input == DType::Tf32 && frag.0 == "m16n16k16" {
            frag = TF32_FRAG;
        }
        Plan {
            w: *w,
            t: Tiling {
                g: GemmView {
                    m,
                    n,
                    k,
                    types: w.types,
                    a_k_contig: true,
                    b_k_contig: true,
                    transposed: true,
                    axes: ["N*P*Q", "K", "C*R*S"],
                },
                bm,
                bn,
                bk,
                warps_m: int_at(pos, 3),
                warps_n: int_at(pos, 4),
                warps_k: int_at(pos, 5),
                frag,
                stages: int_at(pos, 7),
                skew: if int_at(pos, 8) == 1 { 16 / e } else { 0 },
                split_k: int_at(pos, 9),
                cluster_reduce: name_at(pos, 10) == "cluster",
                min_blocks: int_at(pos, 11),
                cp_async: target.has_cp_async(),
                extra_smem: if !pointwise && gather_smem { bm * TABLE_ROW_BYTES } else { 0 },
            },
            pointwise,
            gather_smem,
            vec_in: widest_vec(e, &[w.c * e as u64, (bk * e) as u64]),
            vec_d: widest_vec(out, &[n * out as u64, (bn * out) as u64]),
        }
    }

    /// Rows of the A tile each thread loads per stage (each thread loads one vector column).
    pub fn a_rows_per_thread(&self) -> u32 {
        let per_row = self.bk * self.w.types.input.bytes() / self.vec_in;
        self.bm.div_ceil(self.threads() / per_row)
    }

    /// Whether the workload is a 1x1, stride-1, unpadded conv (A is then a plain matrix).
    pub fn is_pointwise_shape(w: &Conv2d) -> bool {
        w.r == 1 && w.s == 1 && w.stride == (1, 1) && w.pad == (0, 0)
    }

    /// The rules that depend on the workload and the tile knobs alone (the first
    /// [`TILE_KNOBS`]): a config failing them fails whatever its other knobs are.
    pub fn check_tile(&self, target: &Target) -> Result<()> {
        channels(&self.w)?;
        if self.w.types.input == DType::Tf32 && self.frag != TF32_FRAG {
            return Err(Error::Rejected(reason!(format!(
                "frag {} on a tf32 layer: TF32 WMMA has one fragment shape, m16n16k8, which frag m16n16k16 stands for",
                self.frag.0
            ))));
        }
        self.t.check_tile(target)
    }

    /// The validity rules, in the order a user would want to hear them.
    pub fn check(&self, target: &Target) -> Result<Resources> {
        let reject = |why: String| Err(Error::Rejected(why));
        let w = &self.w;
        if self.pointwise && !Plan::is_pointwise_shape(w) {
            return reject(reason!(format!(
                "path pointwise needs a 1x1 filter with stride 1 and no padding; this conv is {}x{}, stride {}x{}, pad {}x{}",
                w.r, w.s, w.stride.0, w.stride.1, w.pad.0, w.pad.1
            )));
        }
        if self.pointwise && self.gather_smem {
            return reject(
                "gather smem on path pointwise: the pointwise path reads activations as a plain matrix, with no row origins to keep"
                    .to_string(),
            );
        }
        self.check_tile(target)?;
        self.t.check_sliced_k(target)?;
        self.t.check_resources(target)?;
        if self.warps_k > 1 && self.split_k > 1 {
            return reject(reason!(format!(
                "warps_k {} with split_k {}: sliced K and split-K both cut the K loop to fill a small grid; this template takes one at a time",
                self.warps_k, self.split_k
            )));
        }
        if self.min_blocks > 1 && self.blocks() < 2 * target.sm_count as u64 {
            return reject(reason!(format!(
                "min_blocks {} on a grid of {} blocks: a second block per SM only pays when the grid gives each of the {} SMs two",
                self.min_blocks,
                self.blocks(),
                target.sm_count
            )));
        }
        let rows = self.a_rows_per_thread();
        if !self.pointwise && !self.gather_smem && rows > MAX_GATHER_REG_ROWS {
            return reject(reason!(format!(
                "gather regs keeps 3 registers for each of the {rows} A rows a thread loads; beyond {MAX_GATHER_REG_ROWS} rows use gather smem"
            )));
        }
        if !self.pointwise && self.gather_smem && rows < MIN_GATHER_SMEM_ROWS {
            return reject(reason!(format!(
                "gather smem with {rows} A rows per thread: {} registers cost less than a shared-memory read per row and stage (the table pays from {MIN_GATHER_SMEM_ROWS} rows)",
                3 * rows
            )));
        }
        self.t.check_layout(target)?;
        Ok(self.t.resources())
    }

    /// The kernel's identity: template, version, knobs and a digest of the workload key.
    pub fn name(&self) -> String {
        let t = &self.w.types;
        let key_digest = crate::short_digest(&Workload::Conv2d(self.w).key());
        let path = if self.pointwise {
            "pointwise"
        } else if self.gather_smem {
            "gsmem"
        } else {
            "gregs"
        };
        ident(&format!(
            "tt_wmma_conv2d_v{}_{}{}{}_{path}_{}_{}_{key_digest}",
            WmmaConv2d.version(),
            t.input,
            t.accumulator,
            t.output,
            self.t.name_tiles(),
            self.t.name_tail(),
        ))
    }

    /// The generated source.
    pub fn source(&self) -> String {
        let w = &self.w;
        let t = &w.types;
        let name = self.name();
        let (one, zero) =
            if t.output.is_int() { (Scalar::Int(1), Scalar::Int(0)) } else { (Scalar::Float(1.0), Scalar::Float(0.0)) };
        // The kernel's view (transposed): its A is the filter, its B the activations.
        let core = Core {
            swizzle: 1,
            vec_a: self.vec_in,
            vec_b: self.vec_in,
            vec_d: self.vec_d,
            read_c: false,
            alpha: one,
            beta: zero,
        };
        let title = format!("wmma_conv2d v{}", WmmaConv2d.version());
        let mut h = self.t.header(&title, &Workload::Conv2d(*w).key(), &name, &core);
        for (name, v) in crate::support::conv_geometry(w) {
            h.int(name, v as i64);
        }
        if t.input == DType::Tf32 {
            // Only tf32 kernels define it: the others' sources preprocess to what they were.
            h.define("TT_TF32", 1);
        }
        h.flag("PATH_POINTWISE", self.pointwise)
            .flag("GATHER_SMEM", self.gather_smem)
            .int("SMEM_BYTES", self.smem_bytes() as i64);
        h.source(&format!("ns_{name}"), &[crate::cuda::COMMON, body()])
    }
}

// The plan is a tiling with two more knobs: its rules and model read the tiling's fields directly.
impl std::ops::Deref for Plan {
    type Target = Tiling;

    fn deref(&self) -> &Tiling {
        &self.t
    }
}

/// The channel rule: 16-byte vectors of channels never straddle two filter taps.
fn channels(w: &Conv2d) -> Result<()> {
    let per_vec = 16 / w.types.input.bytes() as u64;
    if !w.c.is_multiple_of(per_vec) {
        return Err(Error::invalid(
            "c",
            format!(
                "{} must be a multiple of {per_vec} for {} inputs (wmma_conv2d loads channels in 16-byte vectors); allowed: {per_vec}, {}, {}, ...",
                w.c,
                w.types.input,
                2 * per_vec,
                3 * per_vec
            ),
        ));
    }
    Ok(())
}

impl Template for WmmaConv2d {
    fn op(&self) -> Op {
        Op::Conv2d
    }

    fn name(&self) -> &'static str {
        "wmma_conv2d"
    }

    fn version(&self) -> u32 {
        crate::version::WMMA_CONV2D
    }

    fn supports(&self, workload: &Workload, target: &Target) -> Result<()> {
        self.check_workload(workload)?;
        match conv(workload)?.types.input {
            DType::Tf32 if target.arch < 80 => Err(Error::Unsupported {
                template: "wmma_conv2d",
                what: format!("tf32 tensor cores on sm_{} (needs sm_80 or newer)", target.arch),
            }),
            DType::Tf32 => Ok(()),
            input => check_tensor_cores("wmma_conv2d", input, target),
        }
    }

    fn check_workload(&self, workload: &Workload) -> Result<()> {
        let w = conv(workload)?;
        w.validate()?;
        w.require_plain("wmma_conv2d")?;
        if w.types.input == DType::F32 {
            return Err(Error::invalid(
                "input",
                "wmma_conv2d multiplies f32 data as tf32 (--allow-tf32), never exactly: exact f32 convolutions are for the CUDA-core templates".to_string(),
            ));
        }
        channels(w)
    }

    fn space(&self) -> Space {
        let knobs = KNOBS
            .iter()
            .map(|(name, domain)| Knob {
                name,
                values: match domain {
                    Ints(v) => v.iter().map(|x| KnobValue::Int(*x as i64)).collect(),
                    Names(v) => v.iter().map(|x| KnobValue::from(*x)).collect(),
                },
                default: None,
            })
            .collect();
        Space { knobs }
    }

    fn valid_indices(&self, workload: &Workload, target: &Target) -> Result<Vec<u64>> {
        self.supports(workload, target)?;
        let w = conv(workload)?;
        let tiles: u64 = (0..TILE_KNOBS).map(|k| domain_len(k) as u64).product();
        let rest: u64 = (TILE_KNOBS..KNOBS.len()).map(|k| domain_len(k) as u64).product();
        Ok(crate::error::without_reasons(|| {
            let mut out = Vec::new();
            for tile in 0..tiles {
                let first = tile * rest;
                if Plan::at(w, first, target).check_tile(target).is_err() {
                    continue;
                }
                out.extend((first..first + rest).filter(|i| Plan::at(w, *i, target).check(target).is_ok()));
            }
            out
        }))
    }

    fn check(&self, workload: &Workload, config: &Config, target: &Target) -> Result<Resources> {
        self.space().index_of(config)?;
        Plan::new(conv(workload)?, config, target)?.check(target)
    }

    fn generate(&self, workload: &Workload, config: &Config, target: &Target) -> Result<KernelSpec> {
        self.supports(workload, target)?;
        // `check` rejects unknown or missing knobs (through the space's index) and invalid configs
        // before anything is generated.
        let res = self.check(workload, config, target)?;
        let plan = Plan::new(conv(workload)?, config, target)?;
        Ok(plan.t.spec(plan.name(), plan.source(), &res))
    }

    fn features(&self, workload: &Workload, config: &Config, target: &Target) -> Result<Vec<(&'static str, f64)>> {
        let p = Plan::new(conv(workload)?, config, target)?;
        let mut f = p.t.features(target);
        f.extend([
            ("pointwise", p.pointwise as u8 as f64),
            ("gather_smem", (p.gather_smem && !p.pointwise) as u8 as f64),
            ("a_rows_per_thread", p.a_rows_per_thread() as f64),
            ("log2_taps", ((p.w.r * p.w.s) as f64).log2()),
            ("model_log_us", model(&p, target).ln()),
        ]);
        Ok(f)
    }

    fn model_us(&self, workload: &Workload, config: &Config, target: &Target) -> Result<f64> {
        let p = Plan::new(conv(workload)?, config, target)?;
        p.check(target)?;
        Ok(model(&p, target))
    }
}

/// The conv of a workload, or why this template cannot take it.
fn conv(workload: &Workload) -> Result<&Conv2d> {
    match workload {
        Workload::Conv2d(c) => Ok(c),
        other => Err(Error::Unsupported { template: "wmma_conv2d", what: format!("{} workloads", other.op().name()) }),
    }
}

/// Analytic time of a plan in microseconds ([`Tiling::bound_us`] of): the tiling's tensor-core
/// time, less efficient by the gather's address arithmetic and predicates on the implicit path;
/// memory traffic (the
/// activations read about once since the blocks sharing them run together, the L2-resident filter
/// once per row of tiles, the output) and the tiling's load-latency floor, plus launch and split-K
/// costs.
fn model(p: &Plan, target: &Target) -> f64 {
    let efficiency = match (p.pointwise, p.gather_smem) {
        (true, _) => 1.0,
        (false, false) => 0.92,
        (false, true) => 0.9,
    };
    let compute = p.t.compute_us(target, efficiency);
    let w = &p.w;
    let e = w.types.input.bytes() as f64;
    let (tm, tn) = p.tiles();
    let halo = if tn > 1 || w.r * w.s > 1 { 1.2 } else { 1.0 };
    let input = (w.n * w.h * w.w * w.c) as f64 * e * halo;
    let filter = (w.k * w.r * w.s * w.c) as f64 * e * tm as f64 / 4.0;
    let memory = (input + filter + p.t.output_traffic()) / 3.0e6;
    Tiling::bound_us(compute, memory, p.t.latency_us(target)) + LAUNCH_US + p.t.split_us()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::template::{Arg, valid_configs};
    use crate::workload::Types;
    use std::collections::HashSet;

    fn conv2d(n: u64, hw: (u64, u64), c: u64, k: u64, rs: (u64, u64), pad: (u64, u64), stride: (u64, u64)) -> Conv2d {
        Conv2d {
            n,
            h: hw.0,
            w: hw.1,
            c,
            k,
            r: rs.0,
            s: rs.1,
            pad,
            stride,
            dilation: (1, 1),
            types: Types::default_for(DType::F16).unwrap(),
            epilogue: Default::default(),
            residual: false,
        }
    }

    fn square(n: u64, hw: u64, c: u64, k: u64, r: u64, pad: u64, stride: u64) -> Workload {
        Workload::Conv2d(conv2d(n, (hw, hw), c, k, (r, r), (pad, pad), (stride, stride)))
    }

    /// A config of the space with the given knobs changed from the first point.
    fn cfg(pairs: &[(&str, KnobValue)]) -> Config {
        let mut c = WmmaConv2d.space().config(0).unwrap();
        for (k, v) in pairs {
            c.0.insert((*k).into(), v.clone());
        }
        c
    }

    fn i(v: i64) -> KnobValue {
        KnobValue::Int(v)
    }

    fn s(v: &str) -> KnobValue {
        KnobValue::from(v)
    }

    /// The layers the template is for, with the fewest valid configs each must have on sm_90.
    fn layers() -> Vec<(&'static str, Workload, usize)> {
        vec![
            ("1x1 n1 56x56 64->128", square(1, 56, 64, 128, 1, 0, 1), 500),
            ("1x1 n1 28x28 128->256", square(1, 28, 128, 256, 1, 0, 1), 1000),
            ("1x1 n1 28x28 256->256", square(1, 28, 256, 256, 1, 0, 1), 2000),
            // Many waves: tiles of at least 64x64, one k-tile or two, no split-K: little to tune.
            ("1x1 n32 56x56 64->128", square(32, 56, 64, 128, 1, 0, 1), 150),
            ("3x3 n32 56x56 64->64", square(32, 56, 64, 64, 3, 1, 1), 200),
            ("3x3 n1 14x14 256->256", square(1, 14, 256, 256, 3, 1, 1), 2000),
            ("3x3 s2 n1 56x56 64->128", square(1, 56, 64, 128, 3, 1, 2), 1000),
        ]
    }

    #[test]
    fn typical_layers_have_large_affordable_spaces() {
        for (label, w, least) in layers() {
            for t in [Target::sm90(), Target::sm80()] {
                let valid = valid_configs(&WmmaConv2d, &w, &t).unwrap();
                let n = valid.len();
                let least = if t.arch == 90 { least } else { least * 3 / 5 };
                assert!(n >= least && n <= 4000, "{label} on sm_{}: {n} valid configs", t.arch);
                for (index, c) in valid.iter().step_by(97) {
                    assert_eq!(WmmaConv2d.space().index_of(c).unwrap(), *index);
                    WmmaConv2d.check(&w, c, &t).unwrap();
                }
            }
        }
    }

    #[test]
    fn tf32_layers_use_m16n16k8_fragments_rounded_to_tf32() {
        let tf32 = |c: Conv2d| Workload::Conv2d(Conv2d { types: Types::default_for(DType::Tf32).unwrap(), ..c });
        let layer = tf32(conv2d(8, (56, 56), 64, 64, (3, 3), (1, 1), (1, 1)));
        for t in [Target::sm90(), Target::sm80()] {
            let valid = valid_configs(&WmmaConv2d, &layer, &t).unwrap();
            assert!(valid.len() >= 50, "sm_{}: {} valid tf32 configs", t.arch, valid.len());
            for (_, c) in valid.iter().step_by(23) {
                assert_eq!(c.name("frag").unwrap(), "m16n16k16", "the only frag value with a tf32 form");
                let spec = WmmaConv2d.generate(&layer, c, &t).unwrap();
                assert!(spec.name.contains("m16n16k8") && spec.name.contains("tf32f32f32"), "{}", spec.name);
                for line in ["#define TT_TF32 1", "constexpr int FK = 8;", "typedef float T_IN;", "constexpr int SKEW"]
                {
                    assert!(spec.source.contains(line), "{line} missing from {}", spec.name);
                }
                assert!(spec.source.contains("wmma::__float_to_tf32(af[i].x[t])"));
            }
        }
        // The other fragment shapes have no TF32 form; the rule says which one stands for it.
        let c = cfg(&[
            ("block_m", i(64)),
            ("block_n", i(64)),
            ("warps_m", i(2)),
            ("warps_n", i(2)),
            ("frag", s("m32n8k16")),
        ]);
        let e = WmmaConv2d.check(&layer, &c, &Target::sm90()).unwrap_err().to_string();
        assert!(e.contains("m16n16k8") && e.contains("m32n8k16"), "{e}");
        // An f16 layer's kernel does not define TT_TF32, so it preprocesses to what it was.
        let f16 = square(8, 56, 64, 64, 3, 1, 1);
        let (_, c) = valid_configs(&WmmaConv2d, &f16, &Target::sm90()).unwrap().swap_remove(0);
        assert!(!WmmaConv2d.generate(&f16, &c, &Target::sm90()).unwrap().source.contains("#define TT_TF32"));
        // Channels come in 16-byte vectors: 4 floats.
        let e = WmmaConv2d.check_workload(&tf32(conv2d(1, (9, 9), 6, 16, (3, 3), (1, 1), (1, 1)))).unwrap_err();
        assert!(e.field() == Some("c") && e.to_string().contains("multiple of 4"), "{e}");
        WmmaConv2d.check_workload(&tf32(conv2d(1, (9, 9), 4, 16, (3, 3), (1, 1), (1, 1)))).unwrap();
        // Exact f32 is refused with the reason; tf32 needs sm_80.
        let exact = Workload::Conv2d(Conv2d {
            types: Types::default_for(DType::F32).unwrap(),
            ..conv2d(8, (56, 56), 64, 64, (3, 3), (1, 1), (1, 1))
        });
        let e = WmmaConv2d.supports(&exact, &Target::sm90()).unwrap_err();
        assert!(e.field() == Some("input") && e.to_string().contains("exact"), "{e}");
        let volta = Target { arch: 70, ..Target::sm80() };
        let e = WmmaConv2d.supports(&layer, &volta).unwrap_err().to_string();
        assert!(e.contains("sm_80"), "{e}");
    }

    #[test]
    fn fast_enumeration_matches_the_checked_walk() {
        let w = square(2, 9, 24, 40, 3, 1, 2);
        let t = Target::sm90();
        let space = WmmaConv2d.space();
        let fast: HashSet<u64> = WmmaConv2d.valid_indices(&w, &t).unwrap().into_iter().collect();
        assert!(fast.len() > 100, "{}", fast.len());
        // Every 7th point (coprime with every domain size) through the checked path.
        for i in (0..space.len()).step_by(7) {
            let checked = WmmaConv2d.check(&w, &space.config(i).unwrap(), &t).is_ok();
            assert_eq!(checked, fast.contains(&i), "index {i}");
        }
    }

    #[test]
    fn channels_must_fill_16_byte_vectors() {
        let t = Target::sm90();
        let mut w = conv2d(1, (14, 14), 12, 32, (3, 3), (1, 1), (1, 1));
        let e = WmmaConv2d.supports(&Workload::Conv2d(w), &t).unwrap_err();
        assert_eq!(e.field(), Some("c"), "{e}");
        assert!(e.to_string().contains("multiple of 8") && e.to_string().contains("f16"), "{e}");
        w.types = Types::default_for(DType::I8).unwrap();
        w.c = 24;
        let e = WmmaConv2d.supports(&Workload::Conv2d(w), &t).unwrap_err();
        assert_eq!(e.field(), Some("c"));
        assert!(e.to_string().contains("multiple of 16") && e.to_string().contains("i8"), "{e}");
        w.c = 32;
        WmmaConv2d.supports(&Workload::Conv2d(w), &t).unwrap();
        w.types = Types::default_for(DType::Bf16).unwrap();
        w.c = 8;
        WmmaConv2d.supports(&Workload::Conv2d(w), &t).unwrap();
        let mut turing = Target::sm80();
        turing.arch = 75;
        assert!(WmmaConv2d.supports(&Workload::Conv2d(w), &turing).unwrap_err().to_string().contains("sm_80"));
        let m = Workload::Matmul(
            crate::Matmul::new(64, 64, 64, crate::Layout::Tn, Types::default_for(DType::F16).unwrap()).unwrap(),
        );
        assert!(WmmaConv2d.supports(&m, &t).unwrap_err().to_string().contains("matmul"));
    }

    #[test]
    fn the_pointwise_path_is_only_for_1x1_stride_1_unpadded_convs() {
        let t = Target::sm90();
        let pointwise = |w: &Workload| {
            valid_configs(&WmmaConv2d, w, &t)
                .unwrap()
                .iter()
                .filter(|(_, c)| c.name("path").unwrap() == "pointwise")
                .count()
        };
        assert!(pointwise(&square(1, 56, 64, 128, 1, 0, 1)) > 100);
        for (what, w) in [
            ("3x3", square(1, 56, 64, 128, 3, 1, 1)),
            ("stride 2", square(1, 56, 64, 128, 1, 0, 2)),
            ("1x3", Workload::Conv2d(conv2d(1, (56, 56), 64, 128, (1, 3), (0, 1), (1, 1)))),
        ] {
            assert_eq!(pointwise(&w), 0, "{what}");
            let c = cfg(&[("block_m", i(64)), ("block_n", i(64)), ("warps_m", i(2)), ("path", s("pointwise"))]);
            let e = WmmaConv2d.check(&w, &c, &t).unwrap_err().to_string();
            assert!(e.contains("path pointwise needs a 1x1 filter"), "{what}: {e}");
        }
        // Both paths stay open on a pointwise conv: the tuner measures which is faster.
        let w = square(1, 28, 128, 256, 1, 0, 1);
        let paths: HashSet<String> = valid_configs(&WmmaConv2d, &w, &t)
            .unwrap()
            .iter()
            .map(|(_, c)| c.name("path").unwrap().to_owned())
            .collect();
        assert_eq!(paths.len(), 2);
        let c = cfg(&[("path", s("pointwise")), ("gather", s("smem"))]);
        let e = WmmaConv2d.check(&w, &c, &t).unwrap_err().to_string();
        assert!(e.contains("gather smem on path pointwise"), "{e}");
    }

    #[test]
    fn validity_rules_give_their_reasons() {
        let t = Target::sm90();
        let small = square(1, 14, 256, 256, 3, 1, 1);
        let big = square(32, 56, 64, 64, 3, 1, 1);
        let reason =
            |w: &Workload, pairs: &[(&str, KnobValue)]| WmmaConv2d.check(w, &cfg(pairs), &t).unwrap_err().to_string();
        let e = reason(&small, &[("block_m", i(16)), ("warps_m", i(2))]);
        assert!(e.contains("not a multiple of warps_m"), "{e}");
        let e = reason(&big, &[("block_n", i(128)), ("block_m", i(128))]);
        assert!(e.contains("block_n 128 covers K = 64 no better than block_n 64"), "{e}");
        let e = reason(&big, &[("block_m", i(32)), ("block_n", i(64))]);
        assert!(e.contains("many waves"), "{e}");
        let e = reason(&small, &[("block_m", i(256)), ("block_n", i(256))]);
        assert!(e.contains("accumulator registers"), "{e}");
        let base = [("block_m", i(64)), ("block_n", i(64)), ("warps_m", i(2)), ("warps_n", i(2)), ("skew", i(1))];
        let with = |extra: &[(&'static str, KnobValue)]| [&base[..], extra].concat();
        let e = reason(&small, &with(&[("stages", i(1))]));
        assert!(e.contains("stages 2 overlaps"), "{e}");
        let e = reason(&small, &with(&[("stages", i(2)), ("warps_k", i(2)), ("split_k", i(2))]));
        assert!(e.contains("sliced K and split-K"), "{e}");
        let e = reason(&small, &with(&[("stages", i(2)), ("min_blocks", i(2))]));
        assert!(e.contains("min_blocks 2"), "{e}");
        WmmaConv2d
            .check(&small, &cfg(&with(&[("stages", i(2)), ("split_k", i(2)), ("split_reduce", s("cluster"))])), &t)
            .unwrap();
        let e = WmmaConv2d
            .check(
                &small,
                &cfg(&with(&[("stages", i(2)), ("split_k", i(2)), ("split_reduce", s("cluster"))])),
                &Target::sm80(),
            )
            .unwrap_err()
            .to_string();
        assert!(e.contains("clusters (sm_90+)"), "{e}");
        let e = reason(&small, &with(&[("stages", i(2)), ("block_k", i(64)), ("split_k", i(16))]));
        assert!(e.contains("split_k 16"), "{e}");
        // 64x64 tiles, 2x2 warps (128 threads), block_k 32: 4 vectors per A row, 32 rows per pass,
        // 2 rows per thread. 256x64, 4x1 warps, block_k 64: 8 vectors per row, 16 rows per thread.
        let e = reason(&small, &with(&[("stages", i(2)), ("gather", s("smem")), ("block_k", i(32))]));
        assert!(e.contains("gather smem with 2 A rows per thread"), "{e}");
        let e = reason(
            &big,
            &[
                ("block_m", i(256)),
                ("block_n", i(64)),
                ("block_k", i(64)),
                ("warps_m", i(4)),
                ("warps_n", i(1)),
                ("stages", i(3)),
                ("skew", i(1)),
            ],
        );
        assert!(e.contains("gather regs keeps 3 registers for each of the 16 A rows"), "{e}");
    }

    #[test]
    fn names_are_unique_and_sources_carry_the_geometry() {
        let t = Target::sm90();
        let mut names = HashSet::new();
        for (_, w, _) in layers() {
            let valid = valid_configs(&WmmaConv2d, &w, &t).unwrap();
            for (_, c) in valid.iter().step_by(13) {
                let spec = WmmaConv2d.generate(&w, c, &t).unwrap();
                assert!(names.insert(spec.name.clone()), "duplicate name {}", spec.name);
                assert_eq!(spec.entry, spec.name);
                assert_eq!(spec.grid[2] as i64, c.int("split_k").unwrap());
                assert_eq!(spec.args, [Arg::B, Arg::A, Arg::C, Arg::D, Arg::Workspace]);
            }
        }
        assert!(names.len() > 500, "{}", names.len());
        let w = square(2, 9, 24, 40, 3, 1, 2);
        let (_, c) = &valid_configs(&WmmaConv2d, &w, &t).unwrap()[0];
        let src = WmmaConv2d.generate(&w, c, &t).unwrap().source;
        for want in [
            // The kernel's view: M = output channels, N = output pixels.
            "constexpr int M = 40;",
            "constexpr int N = 50;",
            "constexpr int K = 216;",
            "constexpr int P = 5;",
            "constexpr int STRIDE_H = 2;",
        ] {
            assert!(src.contains(want), "missing {want:?}");
        }
    }

    #[test]
    fn model_and_features_are_finite_and_prefer_sensible_configs() {
        let t = Target::sim();
        let w = square(32, 56, 64, 64, 3, 1, 1);
        let valid = valid_configs(&WmmaConv2d, &w, &t).unwrap();
        let mut timed: Vec<(f64, &Config)> =
            valid.iter().map(|(_, c)| (WmmaConv2d.model_us(&w, c, &t).unwrap(), c)).collect();
        timed.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (best, config) = timed[0];
        assert!(best * 1.5 < timed[timed.len() - 1].0);
        assert!(config.int("block_m").unwrap() >= 64, "{config}");
        // cuDNN-class time for this layer is tens of microseconds; the model should be within 10x.
        assert!(best > 5.0 && best < 2000.0, "{best}");
        let w1 = square(1, 56, 64, 128, 1, 0, 1);
        for (_, c) in valid_configs(&WmmaConv2d, &w1, &t).unwrap().iter().step_by(11) {
            let f = WmmaConv2d.features(&w1, c, &t).unwrap();
            assert!(f.iter().all(|(_, v)| v.is_finite()), "{f:?}");
            assert_eq!(f.len(), 27);
        }
    }

    /// An element of a staged tile, written exactly once per stage.
    fn put(tile: &mut [Option<i64>], at: i64, v: i64) {
        let slot = &mut tile[at as usize];
        assert!(slot.is_none(), "tile element {at} written twice");
        *slot = Some(v);
    }

    /// `load_tile` of common.cuh on the CPU: a ROWS x COLS tile at (row0, col0) of a matrix with
    /// leading dimension `ld`, zero outside (row_lim, col_lim); every address it forms is checked
    /// to lie inside `g`, as the clamped addresses of the kernel must.
    #[allow(clippy::too_many_arguments)]
    fn load_tile(
        tile: &mut [Option<i64>],
        (rows, cols): (i64, i64),
        g: &[i64],
        ld: i64,
        (row0, col0): (i64, i64),
        (row_lim, col_lim): (i64, i64),
        (ve, threads): (i64, i64),
        (even_rows, even_cols): (bool, bool),
    ) {
        let per_row = cols / ve;
        let total = rows * per_row;
        for it in 0..(total + threads - 1) / threads {
            for tid in 0..threads {
                let v = it * threads + tid;
                if total % threads == 0 || v < total {
                    let (r, c) = (v / per_row, (v % per_row) * ve);
                    let (gr, gc) = (row0 + r, col0 + c);
                    let pred = (even_rows || gr < row_lim) && (even_cols || gc < col_lim);
                    let off = (if even_rows { gr } else { gr.min(row_lim - 1) }) * ld
                        + (if even_cols { gc } else { gc.min(col_lim - ve) });
                    assert!(off >= 0 && off + ve <= g.len() as i64, "address {off} outside the operand");
                    for e in 0..ve {
                        put(tile, r * cols + c + e, if pred { g[(off + e) as usize] } else { 0 });
                    }
                }
            }
        }
    }

    /// What a generated kernel computes, replayed on the CPU with the index arithmetic of
    /// wmma_conv2d.cu (row_origin, ConvLoader), common.cuh (load_tile) and wmma_core.cu (the
    /// raster, the split-K ranges, the epilogue's vectors into a column-major D), in the kernel's
    /// transposed view (M = output channels, N = pixels, A = filter, B = activations); WMMA is
    /// replaced by a plain product of the staged tiles. Returns the output, `None` where nothing
    /// was written.
    fn emulate(p: &Plan, x: &[i64], f: &[i64]) -> Vec<Option<i64>> {
        let w = &p.w;
        // The kernel's GEMM: M x N = (K out channels) x (N*P*Q pixels); its tiles are the plan's
        // swapped.
        let (m, n, k) = (p.g.n as i64, p.g.m as i64, p.g.k as i64);
        let (bm, bn, bk) = (p.bn as i64, p.bm as i64, p.bk as i64);
        let threads = p.threads() as i64;
        let ve = (p.vec_in / w.types.input.bytes()) as i64;
        let (tiles_m, tiles_n) = ((m + bm - 1) / bm, (n + bn - 1) / bn);
        let ktiles = (k + bk - 1) / bk;
        let split_k = p.split_k as i64;
        let kt_per_split = (ktiles + split_k - 1) / split_k;
        let (even_m, even_n, even_k) = (m % bm == 0, n % bn == 0, k % bk == 0);
        let (ih, iw, ic) = (w.h as i64, w.w as i64, w.c as i64);
        let (oq, fs) = (w.q() as i64, w.s as i64);
        let pq = w.p() as i64 * oq;
        let hwc = (ih * iw * ic) as u32;
        let (ph, pw) = (w.pad.0 as i64, w.pad.1 as i64);
        let check_h = ph > 0 || !even_n;
        let check_w = pw > 0 || !even_n;
        let outside = -(1i64 << 24);
        // row_origin: (offset of in[b][h0][w0][0] as the kernel's wrapping unsigned, h0, w0).
        let row_origin = |gn: i64| -> (u32, i64, i64) {
            if !even_n && gn >= n {
                return (0, outside, outside);
            }
            let b = gn / pq;
            let rest = gn - b * pq;
            let pp = rest / oq;
            let q = rest - pp * oq;
            let h0 = pp * w.stride.0 as i64 - ph;
            let w0 = q * w.stride.1 as i64 - pw;
            let base =
                (b as u32).wrapping_mul(hwc).wrapping_add(((h0 * iw + w0) as i32 as u32).wrapping_mul(ic as u32));
            (base, h0, w0)
        };
        let b_per_row = bk / ve;
        assert_eq!(threads % b_per_row, 0);
        let row_step = threads / b_per_row;
        let b_iters = (bn + row_step - 1) / row_step;
        let vd = (p.vec_d / w.types.output.bytes()) as i64;
        let per_col = bm / vd;
        let mut out = vec![None; (m * n) as usize];
        for pid in 0..tiles_m * tiles_n {
            // SWIZZLE 1: down the kernel's M (output channels) first.
            let (tm, tn) = (pid % tiles_m, pid / tiles_m);
            let (m0, n0) = (tm * bm, tn * bn);
            let mut acc = vec![0i64; (bm * bn) as usize];
            for split in 0..split_k {
                let kt0 = split * kt_per_split;
                let nk = (ktiles - kt0).min(kt_per_split);
                assert!(nk > 0, "split {split} has no k-tiles");
                for kt in kt0..kt0 + nk {
                    let k0 = kt * bk;
                    let mut a = vec![None; (bm * bk) as usize];
                    let mut b = vec![None; (bn * bk) as usize];
                    load_tile(&mut a, (bm, bk), f, k, (m0, k0), (m, k), (ve, threads), (even_m, even_k));
                    if p.pointwise {
                        load_tile(&mut b, (bn, bk), x, k, (n0, k0), (n, k), (ve, threads), (even_n, even_k));
                    } else {
                        for tid in 0..threads {
                            let row0 = tid / b_per_row;
                            let col = (tid % b_per_row) * ve;
                            let kk = k0 + col;
                            let rs = kk / ic;
                            let c = kk - rs * ic;
                            let r = rs / fs;
                            let s = rs - r * fs;
                            let dh = r * w.dilation.0 as i64;
                            let dw = s * w.dilation.1 as i64;
                            let tap = ((dh * iw + dw) as u32).wrapping_mul(ic as u32).wrapping_add(c as u32);
                            let k_inside = even_k || kk < k;
                            for it in 0..b_iters {
                                let row = row0 + it * row_step;
                                if bn % row_step == 0 || row < bn {
                                    let (base, h0, w0) = row_origin(n0 + row);
                                    let (h, ww) = (h0 + dh, w0 + dw);
                                    let pred = k_inside
                                        && (!check_h || (h as i32 as u32) < ih as u32)
                                        && (!check_w || (ww as i32 as u32) < iw as u32);
                                    let off = if pred { base.wrapping_add(tap) as i64 } else { 0 };
                                    assert!(off + ve <= x.len() as i64, "gathered address {off} outside the input");
                                    for e in 0..ve {
                                        put(&mut b, row * bk + col + e, if pred { x[(off + e) as usize] } else { 0 });
                                    }
                                }
                            }
                        }
                    }
                    let a: Vec<i64> = a.into_iter().map(|v| v.expect("every A element staged")).collect();
                    let b: Vec<i64> = b.into_iter().map(|v| v.expect("every B element staged")).collect();
                    for r in 0..bm {
                        for c in 0..bn {
                            let dot: i64 =
                                (0..bk).map(|kk| a[(r * bk + kk) as usize] * b[(c * bk + kk) as usize]).sum();
                            acc[(c * bm + r) as usize] += dot;
                        }
                    }
                }
            }
            // The epilogue: vectors of VD output channels down each staged column (one pixel).
            for v in 0..bn * per_col {
                let (col, pos) = (v / per_col, (v % per_col) * vd);
                let (gm, gn) = (m0 + pos, n0 + col);
                if gm < m && gn < n {
                    for e in 0..vd {
                        assert!(gm + e < m, "vector past the last output channel");
                        let slot = &mut out[(gn * m + gm + e) as usize];
                        assert!(slot.is_none(), "output written twice");
                        *slot = Some(acc[(col * bm + pos + e) as usize]);
                    }
                }
            }
        }
        out
    }

    /// Direct convolution, indexed as support.cu's reference is: NPQK output.
    fn direct(w: &Conv2d, x: &[i64], f: &[i64]) -> Vec<i64> {
        let (p, q) = (w.p() as i64, w.q() as i64);
        let (h, ww, c, k, r, s) = (w.h as i64, w.w as i64, w.c as i64, w.k as i64, w.r as i64, w.s as i64);
        let mut out = vec![0; (w.n as i64 * p * q * k) as usize];
        for (o, slot) in out.iter_mut().enumerate() {
            let o = o as i64;
            let (ko, qq, pp, b) = (o % k, (o / k) % q, (o / k / q) % p, o / k / q / p);
            for rr in 0..r {
                let hi = pp * w.stride.0 as i64 - w.pad.0 as i64 + rr * w.dilation.0 as i64;
                for ss in 0..s {
                    let wi = qq * w.stride.1 as i64 - w.pad.1 as i64 + ss * w.dilation.1 as i64;
                    if hi < 0 || hi >= h || wi < 0 || wi >= ww {
                        continue;
                    }
                    for cc in 0..c {
                        *slot += x[(((b * h + hi) * ww + wi) * c + cc) as usize]
                            * f[(((ko * r + rr) * s + ss) * c + cc) as usize];
                    }
                }
            }
        }
        out
    }

    #[test]
    fn the_generated_schedule_computes_the_convolution() {
        let f16 = Types::default_for(DType::F16).unwrap();
        let half_out = Types::new(DType::F16, DType::F16, None).unwrap();
        let i8 = Types::default_for(DType::I8).unwrap();
        let conv = |n, hw, c, k, rs, pad, stride, dilation, types| Conv2d {
            dilation,
            types,
            ..conv2d(n, hw, c, k, rs, pad, stride)
        };
        let shapes = [
            ("3x3 pad 1, ragged M", conv(2, (7, 5), 16, 24, (3, 3), (1, 1), (1, 1), (1, 1), f16)),
            (
                "3x3 stride 2, C = 8 (k-tiles straddle taps, partial last k-tile)",
                conv(1, (9, 9), 8, 16, (3, 3), (1, 1), (2, 2), (1, 1), f16),
            ),
            ("3x3 dilation 2", conv(1, (10, 11), 16, 40, (3, 3), (2, 2), (1, 1), (2, 2), half_out)),
            ("5x1 pad 2x0", conv(2, (6, 4), 24, 8, (5, 1), (2, 0), (1, 1), (1, 1), f16)),
            ("1x1 pointwise, ragged M", conv(3, (5, 7), 32, 48, (1, 1), (0, 0), (1, 1), (1, 1), f16)),
            ("1x1 stride 2", conv(1, (8, 8), 16, 32, (1, 1), (0, 0), (2, 2), (1, 1), f16)),
            ("i8 3x3", conv(1, (6, 6), 32, 32, (3, 3), (1, 1), (1, 1), (1, 1), i8)),
            ("7x7 stride 2 pad 3", conv(1, (12, 12), 8, 16, (7, 7), (3, 3), (2, 2), (1, 1), f16)),
        ];
        let t = Target::sm90();
        let mut kinds = HashSet::new();
        for (label, w) in shapes {
            w.validate().unwrap();
            let (a_len, b_len, _) = crate::support::operand_elements(&Workload::Conv2d(w));
            let mut seed = 0x2545_f491_u64;
            let mut draw = || {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((seed >> 33) % 7) as i64 - 3
            };
            let x: Vec<i64> = (0..a_len).map(|_| draw()).collect();
            let f: Vec<i64> = (0..b_len).map(|_| draw()).collect();
            let want = direct(&w, &x, &f);
            let valid = valid_configs(&WmmaConv2d, &Workload::Conv2d(w), &t).unwrap();
            assert!(valid.len() > 10, "{label}: {}", valid.len());
            for (_, c) in valid.iter().step_by((valid.len() / 24).max(1)) {
                let p = Plan::new(&w, c, &t).unwrap();
                kinds.insert((p.pointwise, p.gather_smem, p.split_k > 1, p.bk));
                let got = emulate(&p, &x, &f);
                for (o, (g, want)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(*g, Some(*want), "{label}, {c}: output {o}");
                }
            }
        }
        // The sample covered both paths, both gathers, split-K and both k-tile widths.
        assert!(kinds.len() >= 8, "{kinds:?}");
    }
}
