//! `wmma_gemm`: the WMMA matmul template. Knobs, validity rules, code generation, features and
//! the analytic model all derive from one [`Plan`], so what is checked is what is generated.

use crate::cuda::{Scalar, ident};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::space::{Config, Knob, Space, positions_at};
use crate::target::Target;
use crate::template::{KernelSpec, Resources, Template};
use crate::tiling::{Core, GemmView, LAUNCH_US, Tiling, check_tensor_cores, widest_vec};
use crate::workload::{Matmul, Op, Workload};

/// wmma_gemm's fills of `wmma_core.cu`'s holes: its title and its loads of plain matrices.
const FILLS: &str = include_str!("cuda/wmma_gemm.cu");

/// The kernel body: `wmma_core.cu` with wmma_gemm's fills, once.
fn body() -> &'static str {
    static BODY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BODY.get_or_init(|| crate::cuda::fill_holes(crate::cuda::WMMA_CORE, FILLS))
}

pub use crate::tiling::FRAGS;

// The knob domains, in the order of the space (the last varies fastest in the index).
const BLOCK_M: &[u32] = &[16, 32, 64, 128, 256];
const BLOCK_N: &[u32] = &[16, 32, 64, 128, 256];
const BLOCK_K: &[u32] = &[32, 64];
const WARPS_M: &[u32] = &[1, 2, 4];
const WARPS_N: &[u32] = &[1, 2, 4];
const WARPS_K: &[u32] = &[1, 2, 4];
const STAGES: &[u32] = &[1, 2, 3, 4, 8];
const SKEW: &[u32] = &[0, 1];
const SPLIT_K: &[u32] = &[1, 2, 4, 8, 16];
const SPLIT_REDUCE: &[&str] = &["workspace", "cluster"];
const SWIZZLE: &[u32] = &[1, 8];
const MIN_BLOCKS: &[u32] = &[1, 2];
const KNOBS: usize = 13;
/// The knobs that make the block and warp tile (block_m .. frag), ahead of the rest in index order.
const TILE_KNOBS: usize = 7;
const DOMAIN_SIZES: [usize; KNOBS] = [
    BLOCK_M.len(),
    BLOCK_N.len(),
    BLOCK_K.len(),
    WARPS_M.len(),
    WARPS_N.len(),
    WARPS_K.len(),
    FRAGS.len(),
    STAGES.len(),
    SKEW.len(),
    SPLIT_K.len(),
    SPLIT_REDUCE.len(),
    SWIZZLE.len(),
    MIN_BLOCKS.len(),
];

/// The WMMA matmul template.
pub struct WmmaGemm;

/// Every quantity a config implies for a workload, computed once: the shared [`Tiling`] (which
/// the plan dereferences to) and what only wmma_gemm has.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The workload.
    pub w: Matmul,
    /// Tiles, warps, pipeline and split-K.
    pub t: Tiling,
    /// Row tiles per rasterisation group.
    pub swizzle: u32,
    /// Bytes per global load of A.
    pub vec_a: u32,
    /// Bytes per global load of B.
    pub vec_b: u32,
    /// Bytes per store of D (and load of C).
    pub vec_d: u32,
}

impl std::ops::Deref for Plan {
    type Target = Tiling;

    fn deref(&self) -> &Tiling {
        &self.t
    }
}

impl Plan {
    /// Reads the knobs of `config` (domains are checked by the space).
    pub fn new(w: &Matmul, config: &Config, target: &Target) -> Result<Plan> {
        let positions = WmmaGemm.space().positions(config)?;
        Ok(Plan::from_positions(w, &positions, target))
    }

    /// The plan of the config at `index` of the space, without building the config.
    pub fn at(w: &Matmul, index: u64, target: &Target) -> Plan {
        Plan::from_positions(w, &positions_at(index, &DOMAIN_SIZES), target)
    }

    /// The plan for each knob's position in its domain (knob order of [`WmmaGemm::space`]).
    fn from_positions(w: &Matmul, pos: &[usize], target: &Target) -> Plan {
        let esize = w.types.input.bytes();
        let (bm, bn, bk) = (BLOCK_M[pos[0]], BLOCK_N[pos[1]], BLOCK_K[pos[2]]);
        let a_cols = if w.layout.a_k_contiguous() { bk } else { bm };
        let a_extent = if w.layout.a_k_contiguous() { w.k } else { w.m };
        let b_cols = if w.layout.b_k_contiguous() { bk } else { bn };
        let b_extent = if w.layout.b_k_contiguous() { w.k } else { w.n };
        let out = w.types.output.bytes();
        Plan {
            w: *w,
            t: Tiling {
                g: GemmView {
                    m: w.m,
                    n: w.n,
                    k: w.k,
                    types: w.types,
                    a_k_contig: w.layout.a_k_contiguous(),
                    b_k_contig: w.layout.b_k_contiguous(),
                    transposed: false,
                    axes: ["M", "N", "K"],
                },
                bm,
                bn,
                bk,
                warps_m: WARPS_M[pos[3]],
                warps_n: WARPS_N[pos[4]],
                warps_k: WARPS_K[pos[5]],
                frag: FRAGS[pos[6]],
                stages: STAGES[pos[7]],
                skew: if SKEW[pos[8]] == 1 { 16 / esize } else { 0 },
                split_k: SPLIT_K[pos[9]],
                cluster_reduce: SPLIT_REDUCE[pos[10]] == "cluster",
                min_blocks: MIN_BLOCKS[pos[12]],
                cp_async: target.has_cp_async(),
                extra_smem: 0,
            },
            swizzle: SWIZZLE[pos[11]],
            vec_a: widest_vec(esize, &[a_extent * esize as u64, (a_cols * esize) as u64]),
            vec_b: widest_vec(esize, &[b_extent * esize as u64, (b_cols * esize) as u64]),
            vec_d: widest_vec(out, &[w.m * out as u64, (bm * out) as u64]),
        }
    }

    /// The validity rules, in the order a user would want to hear them.
    pub fn check(&self, target: &Target) -> Result<Resources> {
        let t = &self.t;
        t.check_shape()?;
        t.check_sliced_k(target)?;
        t.check_warp_tile(target)?;
        t.check_resources(target)?;
        let (tm, tn) = t.tiles();
        if self.swizzle > 1 && (tm <= self.swizzle as u64 || tn == 1 || tm * tn < 2 * target.sm_count as u64) {
            return Err(Error::Rejected(reason!(format!(
                "swizzle {} needs more than {} row tiles, more than one column tile and at least two waves (have {tm}x{tn} tiles)",
                self.swizzle, self.swizzle
            ))));
        }
        t.check_layout(target)?;
        Ok(t.resources())
    }

    /// The kernel's identity: template, version, knobs and a digest of the workload key.
    pub fn name(&self) -> String {
        let t = &self.w.types;
        let key_digest = crate::short_digest(&Workload::Matmul(self.w).key());
        ident(&format!(
            "tt_wmma_gemm_v{}_{}{}{}_{}_{}_sw{}_{}_{}",
            WmmaGemm.version(),
            t.input,
            t.accumulator,
            t.output,
            self.w.layout,
            self.t.name_tiles(),
            self.swizzle,
            self.t.name_tail(),
            key_digest
        ))
    }

    /// The generated source.
    pub fn source(&self) -> String {
        let w = &self.w;
        let t = &w.types;
        let name = self.name();
        let scalar = |v: f64| {
            if t.output.is_int() { Scalar::Int(v as i64) } else { Scalar::Float(v) }
        };
        let core = Core {
            swizzle: self.swizzle,
            vec_a: self.vec_a,
            vec_b: self.vec_b,
            vec_d: self.vec_d,
            read_c: w.reads_c(),
            alpha: scalar(w.alpha),
            beta: scalar(w.beta),
        };
        let title = format!("wmma_gemm v{}", WmmaGemm.version());
        let h = self.t.header(&title, &Workload::Matmul(*w).key(), &name, &core);
        h.source(&format!("ns_{name}"), &[crate::cuda::COMMON, body()])
    }
}

fn matmul(workload: &Workload) -> Result<&Matmul> {
    workload.matmul_for("wmma_gemm")
}

impl Template for WmmaGemm {
    fn name(&self) -> &'static str {
        "wmma_gemm"
    }

    fn version(&self) -> u32 {
        crate::version::WMMA_GEMM
    }

    fn op(&self) -> Op {
        Op::Matmul
    }

    fn supports(&self, workload: &Workload, target: &Target) -> Result<()> {
        self.check_workload(workload)?;
        check_tensor_cores("wmma_gemm", matmul(workload)?.types.input, target)
    }

    fn check_workload(&self, workload: &Workload) -> Result<()> {
        let w = matmul(workload)?;
        w.validate()?;
        w.require_plain("wmma_gemm")?;
        if w.types.input.is_fp8() {
            return Err(Error::invalid(
                "input",
                format!(
                    "wmma_gemm takes no {} inputs (WMMA has no 8-bit float fragments); wgmma_gemm takes them",
                    w.types.input
                ),
            ));
        }
        let k_align = 16 / w.types.input.bytes() as u64;
        if w.k % k_align != 0 {
            return Err(Error::invalid(
                "k",
                format!(
                    "{} must be a multiple of {k_align} for {} inputs (wmma_gemm moves K in 16-byte vectors)",
                    w.k, w.types.input
                ),
            ));
        }
        Ok(())
    }

    fn space(&self) -> Space {
        let ints = |name, v: &[u32]| Knob::ints(name, &v.iter().map(|x| *x as i64).collect::<Vec<_>>());
        Space {
            knobs: vec![
                ints("block_m", BLOCK_M),
                ints("block_n", BLOCK_N),
                ints("block_k", BLOCK_K),
                ints("warps_m", WARPS_M),
                ints("warps_n", WARPS_N),
                ints("warps_k", WARPS_K),
                Knob::names("frag", &FRAGS.iter().map(|f| f.0).collect::<Vec<_>>()),
                ints("stages", STAGES),
                ints("skew", SKEW),
                ints("split_k", SPLIT_K),
                Knob::names("split_reduce", SPLIT_REDUCE),
                ints("swizzle", SWIZZLE),
                ints("min_blocks", MIN_BLOCKS),
            ],
        }
    }

    fn valid_indices(&self, workload: &Workload, target: &Target) -> Result<Vec<u64>> {
        self.supports(workload, target)?;
        let w = matmul(workload)?;
        // The first TILE_KNOBS knobs vary slowest: a tile that fails the rules on the tile alone
        // (shape and warp tile) fails for every value of the rest, which are skipped whole.
        let tiles: u64 = DOMAIN_SIZES[..TILE_KNOBS].iter().map(|n| *n as u64).product();
        let rest: u64 = DOMAIN_SIZES[TILE_KNOBS..].iter().map(|n| *n as u64).product();
        Ok(crate::error::without_reasons(|| {
            let mut out = Vec::new();
            for tile in 0..tiles {
                let first = tile * rest;
                if Plan::at(w, first, target).t.check_tile(target).is_err() {
                    continue;
                }
                out.extend((first..first + rest).filter(|i| Plan::at(w, *i, target).check(target).is_ok()));
            }
            out
        }))
    }

    fn check(&self, workload: &Workload, config: &Config, target: &Target) -> Result<Resources> {
        self.space().index_of(config)?;
        Plan::new(matmul(workload)?, config, target)?.check(target)
    }

    fn generate(&self, workload: &Workload, config: &Config, target: &Target) -> Result<KernelSpec> {
        self.supports(workload, target)?;
        // The index check rejects unknown or missing knobs before anything is generated.
        self.space().index_of(config)?;
        let plan = Plan::new(matmul(workload)?, config, target)?;
        let res = plan.check(target)?;
        Ok(plan.t.spec(plan.name(), plan.source(), &res))
    }

    fn features(&self, workload: &Workload, config: &Config, target: &Target) -> Result<Vec<(&'static str, f64)>> {
        let p = Plan::new(matmul(workload)?, config, target)?;
        let mut f = p.t.features(target);
        // log2_swizzle sits before min_blocks, where it was before the tiling was shared.
        let at = f.iter().position(|(name, _)| *name == "min_blocks").unwrap_or(f.len());
        f.insert(at, ("log2_swizzle", (p.swizzle as f64).log2()));
        f.extend([("vec_a", p.vec_a as f64), ("vec_b", p.vec_b as f64), ("model_log_us", model(&p, target).ln())]);
        Ok(f)
    }

    fn model_us(&self, workload: &Workload, config: &Config, target: &Target) -> Result<f64> {
        let p = Plan::new(matmul(workload)?, config, target)?;
        p.check(target)?;
        Ok(model(&p, target))
    }
}

/// Analytic time of a plan in microseconds: tensor-core work (wave-quantised, scaled by how well
/// the warp tile, pipeline and padding keep the tensor cores fed), memory traffic and the load-
/// latency floor combined by [`Tiling::bound_us`], plus fixed launch and split-K costs. Crude on
/// purpose: it is the model tuner's cold start and `sim`'s timing.
fn model(p: &Plan, target: &Target) -> f64 {
    let compute = p.t.compute_us(target, 1.0);
    let e = p.w.types.input.bytes() as f64;
    let (tm, tn) = p.tiles();
    let l2_reuse = if p.swizzle > 1 { 1.6 } else { 1.0 };
    let bytes =
        (tn as f64 * (p.w.m * p.w.k) as f64 + tm as f64 * (p.w.k * p.w.n) as f64) * e / l2_reuse + p.t.output_traffic();
    let memory = bytes / 3.0e6;
    Tiling::bound_us(compute, memory, p.t.latency_us(target)) + LAUNCH_US + p.t.split_us()
}

/// Analytic time of the vendor library (the `sim` device's cuBLAS): 80% of the tensor-core peak
/// (of the CUDA cores' FMA peak for exact f32; half the 16-bit peak for TF32; for the packed
/// types, the i8 GEMM their baseline runs) or of memory bandwidth, whichever binds, plus launch
/// cost.
pub fn vendor_model_us(w: &Matmul) -> f64 {
    let per_gpu = match w.types.input {
        DType::F32 => 67e6,
        DType::Tf32 => 650e6 * 1.3 * 0.5,
        DType::I8 | DType::S4 | DType::U4 | DType::B1Xor | DType::B1And | DType::E4m3 | DType::E5m2 => {
            650e6 * 1.3 * 2.0
        }
        DType::F16 | DType::Bf16 | DType::I32 => 650e6 * 1.3,
    };
    // Packed inputs are timed on their i8 stand-in: a byte per element.
    let e = if w.types.input.is_packed() { 1.0 } else { w.types.input.bits() as f64 / 8.0 };
    let bytes = (w.m * w.k + w.k * w.n) as f64 * e + (w.m * w.n) as f64 * w.types.output.bytes() as f64;
    (w.flops() / (per_gpu * 0.8)).max(bytes / 3.0e6) + 2.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::template::valid_configs;
    use crate::workload::{Layout, Types};

    fn mm(m: u64, n: u64, k: u64, layout: Layout, input: DType) -> Workload {
        Workload::Matmul(Matmul::new(m, n, k, layout, Types::default_for(input).unwrap()).unwrap())
    }

    fn cfg(pairs: &[(&str, i64)], frag: &str) -> Config {
        let mut c = WmmaGemm.space().config(0).unwrap();
        for (k, v) in pairs {
            c.0.insert((*k).into(), (*v).into());
        }
        c.0.insert("frag".into(), frag.into());
        c
    }

    #[test]
    fn first_shape_has_a_large_valid_space() {
        let w = mm(512, 64, 512, Layout::Nn, DType::F16);
        let valid = valid_configs(&WmmaGemm, &w, &Target::sm90()).unwrap();
        assert!(valid.len() >= 100, "only {} valid configs", valid.len());
        for (i, c) in valid.iter().take(50) {
            assert_eq!(WmmaGemm.space().index_of(c).unwrap(), *i);
        }
    }

    #[test]
    fn the_drift_reference_is_valid_everywhere() {
        let (w, c) = crate::template::drift_reference();
        for t in [Target::sm80(), Target::sm90(), Target::sim()] {
            WmmaGemm.check(&w, &c, &t).unwrap();
        }
    }

    #[test]
    fn fast_enumeration_matches_the_checked_walk() {
        let w = mm(200, 48, 96, Layout::Tn, DType::I8);
        let t = Target::sm90();
        let space = WmmaGemm.space();
        let fast: std::collections::HashSet<u64> = WmmaGemm.valid_indices(&w, &t).unwrap().into_iter().collect();
        assert!(!fast.is_empty());
        // Every 7th point (coprime with every domain size) through the checked path.
        for i in (0..space.len()).step_by(7) {
            let checked = WmmaGemm.check(&w, &space.config(i).unwrap(), &t).is_ok();
            assert_eq!(checked, fast.contains(&i), "index {i}");
        }
    }

    #[test]
    fn shared_memory_limit_is_enforced_with_the_reason() {
        let w = mm(4096, 4096, 4096, Layout::Nn, DType::F16);
        let c = cfg(
            &[
                ("block_m", 256),
                ("block_n", 128),
                ("block_k", 64),
                ("warps_m", 4),
                ("warps_n", 2),
                ("stages", 4),
                ("skew", 1),
            ],
            "m16n16k16",
        );
        // 4 stages of (64 x 264 + 128 x 72) halves: 204 KiB, within an H100's 227 KiB, not an A100's 163 KiB.
        let r = WmmaGemm.check(&w, &c, &Target::sm90()).unwrap();
        assert_eq!(r.smem_bytes, 4 * (64 * 264 + 128 * 72) * 2);
        let e = WmmaGemm.check(&w, &c, &Target::sm80()).unwrap_err().to_string();
        assert!(e.contains("shared memory") && e.contains("163 KiB"), "{e}");
    }

    #[test]
    fn register_and_thread_rules() {
        let w = mm(4096, 4096, 4096, Layout::Nn, DType::F16);
        let c = cfg(&[("block_m", 256), ("block_n", 256), ("warps_m", 1), ("warps_n", 1)], "m16n16k16");
        let e = WmmaGemm.check(&w, &c, &Target::sm90()).unwrap_err().to_string();
        assert!(e.contains("accumulator registers"), "{e}");
        let c = cfg(&[("block_m", 128), ("block_n", 128), ("warps_m", 4), ("warps_n", 4)], "m16n16k16");
        let e = WmmaGemm.check(&w, &c, &Target::sm90()).unwrap_err().to_string();
        assert!(e.contains("16 warps per block"), "{e}");
        let mut small = Target::sm90();
        small.max_threads_per_block = 128;
        let c = cfg(
            &[("block_m", 128), ("block_n", 128), ("warps_m", 2), ("warps_n", 4), ("stages", 3), ("skew", 1)],
            "m16n16k16",
        );
        WmmaGemm.check(&w, &c, &Target::sm90()).unwrap();
        let e = WmmaGemm.check(&w, &c, &small).unwrap_err().to_string();
        assert!(e.contains("256 threads"), "{e}");
    }

    #[test]
    fn divisibility_and_pointless_knobs_are_rejected() {
        let w = mm(512, 64, 512, Layout::Nn, DType::F16);
        let t = Target::sm90();
        let e = WmmaGemm.check(&w, &cfg(&[("block_m", 16), ("warps_m", 2)], "m16n16k16"), &t).unwrap_err().to_string();
        assert!(e.contains("not a multiple of warps_m"), "{e}");
        let e = WmmaGemm.check(&w, &cfg(&[("block_n", 128)], "m16n16k16"), &t).unwrap_err().to_string();
        assert!(e.contains("wasted work"), "{e}");
        let e = WmmaGemm.check(&w, &cfg(&[("split_k", 16), ("block_k", 64)], "m16n16k16"), &t).unwrap_err().to_string();
        assert!(e.contains("split_k 16 exceeds"), "{e}");
        let e = WmmaGemm
            .check(&w, &cfg(&[("stages", 4), ("block_k", 64), ("split_k", 4)], "m16n16k16"), &t)
            .unwrap_err()
            .to_string();
        assert!(e.contains("stages 4 exceeds"), "{e}");
        let mut volta = Target::sm80();
        volta.arch = 70;
        let e = WmmaGemm.check(&w, &cfg(&[("stages", 2)], "m16n16k16"), &volta).unwrap_err().to_string();
        assert!(e.contains("cp.async"), "{e}");
    }

    #[test]
    fn unsupported_workloads_name_the_field() {
        let t = Target::sm90();
        let w = mm(64, 64, 20, Layout::Nn, DType::F16);
        let e = WmmaGemm.supports(&w, &t).unwrap_err();
        assert_eq!(e.field(), Some("k"));
        let w = mm(64, 64, 24, Layout::Tn, DType::I8);
        assert_eq!(WmmaGemm.supports(&w, &t).unwrap_err().field(), Some("k"));
        let mut turing = Target::sm80();
        turing.arch = 75;
        let w = mm(64, 64, 64, Layout::Nn, DType::Bf16);
        assert!(WmmaGemm.supports(&w, &turing).unwrap_err().to_string().contains("sm_80"));
    }

    #[test]
    fn vectors_follow_alignment() {
        let t = Target::sm90();
        let c = cfg(&[("block_m", 64), ("block_n", 64), ("block_k", 32)], "m16n16k16");
        let Workload::Matmul(w) = mm(1000, 1001, 64, Layout::Nn, DType::F16) else { unreachable!() };
        let p = Plan::new(&w, &c, &t).unwrap();
        // A is M-contiguous with M = 1000 halves = 2000 bytes: 16-byte vectors fit.
        assert_eq!((p.vec_a, p.vec_b, p.vec_d), (16, 16, 16));
        let Workload::Matmul(w) = mm(1001, 1000, 64, Layout::Nn, DType::F16) else { unreachable!() };
        let p = Plan::new(&w, &c, &t).unwrap();
        // M = 1001: columns of A and D start at odd element offsets.
        assert_eq!((p.vec_a, p.vec_d), (2, 4));
    }

    #[test]
    fn model_prefers_sensible_configs() {
        let w = mm(4096, 4096, 4096, Layout::Nn, DType::F16);
        let t = Target::sim();
        let valid = valid_configs(&WmmaGemm, &w, &t).unwrap();
        let mut timed: Vec<(f64, &Config)> =
            valid.iter().map(|(_, c)| (WmmaGemm.model_us(&w, c, &t).unwrap(), c)).collect();
        timed.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (best, config) = timed[0];
        let worst = timed[timed.len() - 1].0;
        assert!(best * 2.0 < worst, "{best} vs {worst}");
        assert!(config.int("block_m").unwrap() * config.int("block_n").unwrap() >= 128 * 128, "{config}");
        let feats = WmmaGemm.features(&w, config, &t).unwrap();
        assert!(feats.iter().all(|(_, v)| v.is_finite()));
    }
}
