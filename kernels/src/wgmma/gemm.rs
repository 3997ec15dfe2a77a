//! The `wgmma_gemm` template: the [`Template`] face of the plan.

use super::knobs::{DOMAIN_SIZES, space};
use super::model::model;
use super::plan::Plan;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::space::{Config, Space};
use crate::target::Target;
use crate::template::{KernelSpec, Resources, Template};
use crate::workload::{Matmul, Op, Workload};

/// The Hopper matmul template.
pub struct WgmmaGemm;

pub(super) fn matmul(workload: &Workload) -> Result<&Matmul> {
    workload.matmul_for("wgmma_gemm")
}

impl Template for WgmmaGemm {
    fn name(&self) -> &'static str {
        "wgmma_gemm"
    }

    fn version(&self) -> u32 {
        crate::version::WGMMA_GEMM
    }

    fn records_hold_since(&self) -> u32 {
        crate::version::WGMMA_RECORDS_HOLD_SINCE
    }

    fn space_since(&self) -> u32 {
        crate::version::WGMMA_SPACE_SINCE
    }

    fn op(&self) -> Op {
        Op::Matmul
    }

    fn supports(&self, workload: &Workload, target: &Target) -> Result<()> {
        self.check_workload(workload)?;
        if target.arch != 90 {
            return Err(Error::invalid(
                "template",
                format!("wgmma_gemm needs an sm_90 GPU (Hopper: wgmma, TMA); this one is sm_{}", target.arch),
            ));
        }
        Ok(())
    }

    fn check_workload(&self, workload: &Workload) -> Result<()> {
        let w = matmul(workload)?;
        w.validate()?;
        let input = w.types.input;
        if !matches!(input, DType::F16 | DType::Bf16 | DType::I8 | DType::Tf32 | DType::E4m3 | DType::E5m2) {
            return Err(Error::invalid(
                "input",
                format!("wgmma_gemm takes f16, bf16, i8, tf32, e4m3 or e5m2 inputs, not {input}"),
            ));
        }
        if matches!(input, DType::I8 | DType::Tf32) && w.layout != crate::Layout::Tn {
            let other = if input == DType::I8 { "wmma_gemm" } else { "mma_ext_gemm" };
            return Err(Error::invalid(
                "layout",
                format!(
                    "wgmma reads {input} operands K-major only, so wgmma_gemm takes {input} in layout tn, not {}; {other} takes it",
                    w.layout
                ),
            ));
        }
        super::problems::check_workload(w)?;
        // TMA: every row of an operand starts on a 16-byte boundary.
        let e = input.bytes() as u64;
        let rows = [
            ("k", w.k, w.layout.a_k_contiguous() || w.layout.b_k_contiguous()),
            ("m", w.m, !w.layout.a_k_contiguous()),
            ("n", w.n, !w.layout.b_k_contiguous()),
        ];
        for (field, extent, contiguous) in rows {
            if contiguous && !(extent * e).is_multiple_of(16) {
                return Err(Error::invalid(
                    field,
                    format!(
                        "{extent} must be a multiple of {} for {input} in layout {} (TMA needs rows of whole 16-byte units)",
                        16 / e,
                        w.layout
                    ),
                ));
            }
        }
        Ok(())
    }

    fn space(&self) -> Space {
        space()
    }

    fn valid_indices(&self, workload: &Workload, target: &Target) -> Result<Vec<u64>> {
        self.supports(workload, target)?;
        let w = matmul(workload)?;
        let len: u64 = DOMAIN_SIZES.iter().map(|n| *n as u64).product();
        Ok(crate::error::without_reasons(|| (0..len).filter(|i| Plan::at(w, *i).check(target).is_ok()).collect()))
    }

    fn check(&self, workload: &Workload, config: &Config, target: &Target) -> Result<Resources> {
        self.supports(workload, target)?;
        self.space().index_of(config)?;
        Plan::new(matmul(workload)?, config)?.check(target)
    }

    fn generate(&self, workload: &Workload, config: &Config, target: &Target) -> Result<KernelSpec> {
        self.supports(workload, target)?;
        self.space().index_of(config)?;
        let plan = Plan::new(matmul(workload)?, config)?;
        let res = plan.check(target)?;
        Ok(plan.spec(target, &res))
    }

    fn features(&self, workload: &Workload, config: &Config, target: &Target) -> Result<Vec<(&'static str, f64)>> {
        Ok(Plan::new(matmul(workload)?, config)?.features(target))
    }

    fn model_us(&self, workload: &Workload, config: &Config, target: &Target) -> Result<f64> {
        let p = Plan::new(matmul(workload)?, config)?;
        p.check(target)?;
        Ok(model(&p, target))
    }
}
