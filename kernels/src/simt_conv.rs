//! `simt_conv2d`: exact f32 forward convolution on the CUDA cores, as the implicit GEMM
//! D^T = filter x im2col(input) on `simt_gemm`'s body (NHWC input, KRSC filter, NPQK output; any
//! R, S, padding, stride and dilation). The GEMM's M is the output channels, its N the output
//! pixels N*P*Q, its K the taps R*S*C in (r, s, c) order: the filter is a dense K-contiguous A,
//! and B's loader (`src/cuda/simt_conv2d.cu`) gathers the input a tap at a time, zeros in the
//! padding. Knobs, rules, features and the model are `simt_gemm`'s ([`Plan::for_conv`]), plus one
//! rule: the channels C must be a multiple of `vec`, so a vector never straddles two taps.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::simt::{Plan, SimtGemm};
use crate::space::{Config, Space};
use crate::target::Target;
use crate::template::{KernelSpec, Resources, Template};
use crate::workload::{Conv2d, Op, Workload};

/// The exact-f32 SIMT convolution template.
pub struct SimtConv2d;

fn conv(workload: &Workload) -> Result<&Conv2d> {
    match workload {
        Workload::Conv2d(c) => Ok(c),
        other => Err(Error::Unsupported { template: "simt_conv2d", what: format!("{} workloads", other.op().name()) }),
    }
}

impl Template for SimtConv2d {
    fn name(&self) -> &'static str {
        "simt_conv2d"
    }

    fn version(&self) -> u32 {
        crate::version::SIMT_CONV2D
    }

    fn op(&self) -> Op {
        Op::Conv2d
    }

    fn supports(&self, workload: &Workload, target: &Target) -> Result<()> {
        self.check_workload(workload)?;
        if target.arch < 70 {
            return Err(Error::Unsupported {
                template: "simt_conv2d",
                what: format!("sm_{} (it is tuned for sm_70 or newer)", target.arch),
            });
        }
        Ok(())
    }

    fn check_workload(&self, workload: &Workload) -> Result<()> {
        let c = conv(workload)?;
        c.validate()?;
        c.require_plain("simt_conv2d")?;
        if c.types.input != DType::F32 {
            return Err(Error::invalid(
                "input",
                format!(
                    "simt_conv2d computes exact f32 (f32,f32,f32), not {} inputs; the tensor-core conv templates take the rest",
                    c.types.input
                ),
            ));
        }
        Ok(())
    }

    fn space(&self) -> Space {
        SimtGemm.space()
    }

    fn valid_indices(&self, workload: &Workload, target: &Target) -> Result<Vec<u64>> {
        self.supports(workload, target)?;
        let c = conv(workload)?;
        Ok(crate::error::without_reasons(|| {
            (0..self.space().len()).filter(|i| Plan::conv_at(c, *i).check(target).is_ok()).collect()
        }))
    }

    fn check(&self, workload: &Workload, config: &Config, target: &Target) -> Result<Resources> {
        self.check_workload(workload)?;
        self.space().index_of(config)?;
        Plan::for_conv(conv(workload)?, config)?.check(target)
    }

    fn generate(&self, workload: &Workload, config: &Config, target: &Target) -> Result<KernelSpec> {
        self.supports(workload, target)?;
        self.space().index_of(config)?;
        let plan = Plan::for_conv(conv(workload)?, config)?;
        let res = plan.check(target)?;
        Ok(plan.spec(&res))
    }

    fn features(&self, workload: &Workload, config: &Config, target: &Target) -> Result<Vec<(&'static str, f64)>> {
        Ok(Plan::for_conv(conv(workload)?, config)?.features(target))
    }

    fn model_us(&self, workload: &Workload, config: &Config, target: &Target) -> Result<f64> {
        self.check_workload(workload)?;
        let p = Plan::for_conv(conv(workload)?, config)?;
        p.check(target)?;
        Ok(p.model_us(target))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::templates_for;
    use crate::template::{Arg, valid_configs};
    use crate::workload::Types;

    fn layer(c: u64, r: u64, pad: u64, stride: u64, dilation: u64, input: DType) -> Workload {
        Workload::Conv2d(Conv2d {
            n: 2,
            h: 14,
            w: 14,
            c,
            k: 64,
            r,
            s: r,
            pad: (pad, pad),
            stride: (stride, stride),
            dilation: (dilation, dilation),
            types: Types::default_for(input).unwrap(),
            epilogue: Default::default(),
            residual: false,
        })
    }

    fn cfg(pairs: &[(&str, i64)]) -> Config {
        let mut c = SimtConv2d.space().config(0).unwrap();
        for (k, v) in pairs {
            c.0.insert((*k).into(), (*v).into());
        }
        c
    }

    #[test]
    fn only_exact_f32_convolutions_are_taken() {
        let t = Target::sm90();
        assert!(SimtConv2d.supports(&layer(64, 3, 1, 1, 1, DType::F32), &t).is_ok());
        for input in [DType::F16, DType::Tf32, DType::I8] {
            let e = SimtConv2d.supports(&layer(64, 3, 1, 1, 1, input), &t).unwrap_err();
            assert_eq!(e.field(), Some("input"), "{e}");
        }
        let mm = Workload::Matmul(
            crate::workload::Matmul::new(64, 64, 64, crate::Layout::Nn, Types::default_for(DType::F32).unwrap())
                .unwrap(),
        );
        assert!(SimtConv2d.supports(&mm, &t).unwrap_err().to_string().contains("matmul"));
        // An f32 conv job that names no template searches simt_conv2d, the one conv template
        // that takes f32.
        let f32 = layer(64, 3, 1, 1, 1, DType::F32);
        let takers: Vec<_> =
            templates_for(Op::Conv2d).into_iter().filter(|tpl| tpl.supports(&f32, &t).is_ok()).collect();
        assert_eq!(takers.iter().map(|t| t.name()).collect::<Vec<_>>(), ["simt_conv2d"]);
    }

    #[test]
    fn layers_have_large_valid_spaces_and_channels_bound_the_vector() {
        let t = Target::sm90();
        for w in [layer(64, 3, 1, 1, 1, DType::F32), layer(3, 7, 3, 2, 1, DType::F32), layer(6, 3, 2, 1, 2, DType::F32)]
        {
            let valid = valid_configs(&SimtConv2d, &w, &t).unwrap();
            assert!(valid.len() >= 200, "{}: {} valid configs", w.key(), valid.len());
            let Workload::Conv2d(c) = &w else { unreachable!() };
            assert!(valid.iter().all(|(_, cfg)| c.c % cfg.int("vec").unwrap() as u64 == 0));
            for (_, cfg) in valid.iter().step_by(97) {
                assert!(SimtConv2d.model_us(&w, cfg, &t).unwrap().is_finite());
                assert!(SimtConv2d.features(&w, cfg, &t).unwrap().iter().all(|(_, v)| v.is_finite()));
            }
        }
        let rgb = layer(3, 7, 3, 2, 1, DType::F32);
        let e = SimtConv2d.check(&rgb, &cfg(&[("vec", 4)]), &t).unwrap_err().to_string();
        assert!(e.contains("vec 4 needs c = 3 to be a multiple of 4"), "{e}");
        // The implicit GEMM's axes are named as the convolution's.
        let e = SimtConv2d
            .check(&layer(64, 1, 0, 1, 1, DType::F32), &cfg(&[("block_m", 256), ("block_n", 64)]), &t)
            .unwrap_err()
            .to_string();
        assert!(e.contains("block_m 256 covers K (output channels) = 64"), "{e}");
    }

    #[test]
    fn generated_source_is_the_gemm_body_with_the_im2col_loader() {
        let t = Target::sm90();
        let w = layer(8, 3, 2, 2, 2, DType::F32);
        let c = cfg(&[
            ("block_m", 64),
            ("block_n", 64),
            ("block_k", 8),
            ("thread_m", 4),
            ("thread_n", 4),
            ("vec", 4),
            ("double_buffer", 1),
        ]);
        let spec = SimtConv2d.generate(&w, &c, &t).unwrap();
        assert!(spec.name.starts_with("tt_simt_conv2d_v1_b64x64x8_t4x4_v4"), "{}", spec.name);
        // P = Q = (14 + 4 - 5) / 2 + 1 = 7: the GEMM is 64 channels x 98 pixels x 72 taps.
        for want in [
            "constexpr int M = 64;",
            "constexpr int N = 98;",
            "constexpr int K = 72;",
            "constexpr bool A_K_CONTIG = true;",
            "constexpr bool B_K_CONTIG = true;",
            "constexpr int CI = 8;",
            "constexpr int P = 7;",
            "constexpr int DIL_W = 2;",
            "const int h = p * STRIDE_H - PAD_H + r * DIL_H;",
        ] {
            assert!(spec.source.contains(want), "missing {want}");
        }
        assert!(!spec.source.contains("@hole") && !spec.source.contains("gn * K + gk : (size_t)gk * N"));
        assert_eq!(spec.args, [Arg::B, Arg::A, Arg::C, Arg::D, Arg::Workspace]);
        assert_eq!((spec.grid, spec.block), ([2, 1, 1], [256, 1, 1]));
        // The same config on simt_gemm gets the dense loader.
        let mm = Workload::Matmul(
            crate::workload::Matmul::new(64, 98, 72, crate::Layout::Tn, Types::default_for(DType::F32).unwrap())
                .unwrap(),
        );
        let dense = SimtGemm.generate(&mm, &c, &t).unwrap();
        assert!(dense.source.contains("gn * K + gk : (size_t)gk * N") && !dense.source.contains("STRIDE_H"));
    }
}
