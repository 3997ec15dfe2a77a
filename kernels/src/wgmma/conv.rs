//! `wgmma_conv2d`: forward 2-D convolution (NHWC input, KRSC filter, NPQK output) as an implicit
//! GEMM on the Hopper matmul body: GEMM M = K output channels, N = N*P*Q output pixels,
//! K = R*S*C in (r, s, c) order, layout tn; the filter is the GEMM's A (a K-major [K][R*S*C]
//! matrix, loaded by TMA and multicast in clusters like any A), the activations its B. The knobs,
//! rules, scheduler, epilogues and analytic model are `wgmma_gemm`'s on that GEMM.
//!
//! - A 1x1, stride-1, unpadded layer's activations are a plain [N*H*W][C] matrix: loaded by TMA
//!   like a matmul operand (a pointwise layer is a GEMM).
//! - A layer whose channel count is a multiple of a K tile (64 f16/bf16, 128 i8, 32 tf32 channels:
//!   a K tile lies within one filter tap), with strides up to 8 and small enough padding
//!   (`im2col_fits`), has its activations loaded by TMA in im2col mode: one copy per K tile brings
//!   BP output pixels' channels of one tap, zeros where the window leaves the input (version 2).
//! - Any other layer's activations are gathered: the producer warpgroup's 128 threads copy the
//!   im2col tile 16 bytes at a time with `cp.async` into the swizzled layout the TMA would have
//!   written, zero-filling what lies in the padding or past the edges (`gemm.cu`, `gather_x`). A
//!   16-byte unit is 8 channels (16 for i8, 4 for tf32) of one filter tap, so C must be a multiple
//!   of that; a K tile may straddle taps. These configs need the producer warpgroup.
//! - TF32 (`tf32,f32,f32`: f32 in memory, TF32 products): wgmma reads TF32 operands K-major only,
//!   and in NHWC/KRSC both the filter's rows and the im2col rows are channels, K-major, so every
//!   layer qualifies, as `wgmma_gemm` takes tf32 in layout tn. A 128-byte stage row is 32 floats,
//!   so a K tile is 32 channels; the wgmma is `m64nNk8.f32.tf32.tf32`, which reads an f32's
//!   leading 19 bits (truncation, within the TF32 tolerance). Exact f32 is refused: wgmma would
//!   round it. The f16/bf16/i8 kernels are generated as before, so the version stays.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::space::{Config, Space};
use crate::target::Target;
use crate::template::{KernelSpec, Resources, Template};
use crate::workload::{Conv2d, Op, Workload};

use super::gemm::WgmmaGemm;
use super::knobs::DOMAIN_SIZES;
use super::model::model;
use super::plan::{ConvGemm, Plan};

/// The Hopper convolution template.
pub struct WgmmaConv2d;

fn conv(workload: &Workload) -> Result<&Conv2d> {
    match workload {
        Workload::Conv2d(c) => Ok(c),
        other => Err(Error::Unsupported { template: "wgmma_conv2d", what: format!("{} workloads", other.op().name()) }),
    }
}

/// The plan of `config` for the layer.
pub(super) fn plan(workload: &Workload, config: &Config) -> Result<Plan> {
    let (cg, gemm) = ConvGemm::of(conv(workload)?);
    Ok(Plan { conv: Some(cg), ..Plan::new(&gemm, config)? })
}

impl Template for WgmmaConv2d {
    fn name(&self) -> &'static str {
        "wgmma_conv2d"
    }

    fn version(&self) -> u32 {
        crate::version::WGMMA_CONV2D
    }

    fn records_hold_since(&self) -> u32 {
        crate::version::WGMMA_RECORDS_HOLD_SINCE
    }

    fn space_since(&self) -> u32 {
        crate::version::WGMMA_SPACE_SINCE
    }

    fn op(&self) -> Op {
        Op::Conv2d
    }

    fn supports(&self, workload: &Workload, target: &Target) -> Result<()> {
        self.check_workload(workload)?;
        if target.arch != 90 {
            return Err(Error::invalid(
                "template",
                format!("wgmma_conv2d needs an sm_90 GPU (Hopper: wgmma, TMA); this one is sm_{}", target.arch),
            ));
        }
        Ok(())
    }

    fn check_workload(&self, workload: &Workload) -> Result<()> {
        let c = conv(workload)?;
        c.validate()?;
        let input = c.types.input;
        if input == DType::F32 {
            return Err(Error::invalid(
                "input",
                "wgmma_conv2d multiplies f32 data as tf32 (--allow-tf32), never exactly: exact f32 convolutions are for the CUDA-core templates".to_string(),
            ));
        }
        if !matches!(input, DType::F16 | DType::Bf16 | DType::I8 | DType::Tf32) {
            return Err(Error::invalid(
                "input",
                format!("wgmma_conv2d takes f16, bf16, i8 or tf32 inputs, not {input}"),
            ));
        }
        // A 16-byte copy (or a TMA row) never straddles two filter taps or two pixels.
        let unit = 16 / input.bytes() as u64;
        if !c.c.is_multiple_of(unit) {
            return Err(Error::invalid(
                "c",
                format!(
                    "{} must be a multiple of {unit} for {input}: wgmma_conv2d moves activations in 16-byte units of one pixel's channels; pad the channels to {}",
                    c.c,
                    c.c.next_multiple_of(unit)
                ),
            ));
        }
        // The implicit GEMM's extents are ints on the device.
        let (_, gemm) = ConvGemm::of(c);
        let elements = gemm.n.max(gemm.k).saturating_mul(gemm.m.max(gemm.k));
        if elements >= 1 << 31 || c.n * c.h * c.w * c.c >= 1 << 31 {
            return Err(Error::invalid("n", "the layer's tensors must each hold fewer than 2^31 elements".to_string()));
        }
        Ok(())
    }

    fn space(&self) -> Space {
        WgmmaGemm.space()
    }

    fn valid_indices(&self, workload: &Workload, target: &Target) -> Result<Vec<u64>> {
        self.supports(workload, target)?;
        let (cg, gemm) = ConvGemm::of(conv(workload)?);
        let len: u64 = DOMAIN_SIZES.iter().map(|n| *n as u64).product();
        Ok(crate::error::without_reasons(|| {
            (0..len).filter(|i| Plan::at_conv(cg, &gemm, *i).check(target).is_ok()).collect()
        }))
    }

    fn check(&self, workload: &Workload, config: &Config, target: &Target) -> Result<Resources> {
        self.supports(workload, target)?;
        self.space().index_of(config)?;
        plan(workload, config)?.check(target)
    }

    fn generate(&self, workload: &Workload, config: &Config, target: &Target) -> Result<KernelSpec> {
        self.supports(workload, target)?;
        self.space().index_of(config)?;
        let p = plan(workload, config)?;
        let res = p.check(target)?;
        Ok(p.spec(target, &res))
    }

    fn features(&self, workload: &Workload, config: &Config, target: &Target) -> Result<Vec<(&'static str, f64)>> {
        let p = plan(workload, config)?;
        let mut f = p.features(target);
        f.push(("gather", f64::from(u8::from(p.gather()))));
        Ok(f)
    }

    fn model_us(&self, workload: &Workload, config: &Config, target: &Target) -> Result<f64> {
        let p = plan(workload, config)?;
        p.check(target)?;
        Ok(model(&p, target))
    }
}

#[cfg(test)]
mod tests {
    use super::super::plan::ConvX;
    use super::*;
    use crate::template::{Arg, TensorOperand, valid_configs};
    use crate::version::WGMMA_CONV2D;
    use crate::{Layout, Types};

    #[allow(clippy::too_many_arguments)] // a layer is this many numbers; a struct would restate Conv2d
    fn layer(n: u64, hw: u64, c: u64, k: u64, rs: u64, pad: u64, stride: u64, input: DType) -> Workload {
        Workload::Conv2d(Conv2d {
            n,
            h: hw,
            w: hw,
            c,
            k,
            r: rs,
            s: rs,
            pad: (pad, pad),
            stride: (stride, stride),
            dilation: (1, 1),
            types: Types::default_for(input).unwrap(),
            epilogue: Default::default(),
            residual: false,
        })
    }

    fn config(w: &Workload, producer: &str) -> Config {
        let target = Target::sm90();
        let valid = valid_configs(&WgmmaConv2d, w, &target).unwrap();
        valid.into_iter().map(|(_, c)| c).find(|c| c.name("producer").ok() == Some(producer)).unwrap()
    }

    #[test]
    fn a_layer_is_the_gemm_of_its_output_channels_pixels_and_taps() {
        let Workload::Conv2d(c) = layer(32, 56, 64, 128, 3, 1, 2, DType::F16) else { unreachable!() };
        let (cg, gemm) = ConvGemm::of(&c);
        assert_eq!(cg.x, ConvX::Im2col, "64 channels: a K tile is one tap's");
        assert_eq!((gemm.m, gemm.n, gemm.k, gemm.layout), (128, 32 * 28 * 28, 9 * 64, Layout::Tn));
        let Workload::Conv2d(p) = layer(32, 56, 64, 128, 1, 0, 1, DType::F16) else { unreachable!() };
        assert_eq!(ConvGemm::of(&p).0.x, ConvX::Tiled, "a 1x1 stride-1 unpadded layer is a plain GEMM");
        let Workload::Conv2d(g) = layer(32, 56, 96, 128, 3, 1, 1, DType::F16) else { unreachable!() };
        assert_eq!(ConvGemm::of(&g).0.x, ConvX::Gather, "96 channels: a K tile of 64 straddles two taps");
        let Workload::Conv2d(i) = layer(8, 28, 128, 128, 3, 1, 1, DType::I8) else { unreachable!() };
        assert_eq!(ConvGemm::of(&i).0.x, ConvX::Im2col, "i8: a K tile is 128 channels");
        let Workload::Conv2d(wide) = layer(1, 300, 64, 64, 3, 200, 1, DType::F16) else { unreachable!() };
        assert_eq!(ConvGemm::of(&wide).0.x, ConvX::Gather, "padding past the bounding box's range");
    }

    #[test]
    fn pointwise_layers_load_the_input_by_tma_and_others_gather_it() {
        let target = Target::sm90();
        let pointwise = layer(32, 56, 64, 128, 1, 0, 1, DType::F16);
        let spec = WgmmaConv2d.generate(&pointwise, &config(&pointwise, "warpgroup"), &target).unwrap();
        let (Arg::Map(x), Arg::Map(y)) = (&spec.args[0], &spec.args[1]) else { panic!("{:?}", spec.args) };
        // X: the input as an [N*H*W][C] matrix; Y: the filter as [K][R*S*C]; both K-major.
        assert_eq!((x.operand, x.dims, x.row_bytes), (TensorOperand::A, [64, 32 * 56 * 56], 128));
        assert_eq!((y.operand, y.dims), (TensorOperand::B, [64, 128]));
        assert!(spec.source.contains("constexpr bool GATHER = false;"));
        // A pointwise layer runs with an inline producer too.
        WgmmaConv2d.generate(&pointwise, &config(&pointwise, "inline"), &target).unwrap();

        let padded = layer(2, 9, 16, 40, 3, 1, 2, DType::F16);
        let c = config(&padded, "warpgroup");
        let spec = WgmmaConv2d.generate(&padded, &c, &target).unwrap();
        assert_eq!(spec.args[0], Arg::A, "the gather reads the input through a plain pointer");
        let Arg::Map(y) = &spec.args[1] else { panic!("{:?}", spec.args) };
        assert_eq!((y.operand, y.dims), (TensorOperand::B, [9 * 16, 40]));
        for line in
            ["GATHER = true;", "CONV_C = 16;", "OUT_H = 5;", "STRIDE_W = 2;", "PAD_H = 1;", "PRODUCER_REGS = 64;"]
        {
            assert!(spec.source.contains(line), "{line} missing");
        }
        assert!(spec.name.starts_with(&format!("tt_wgmma_conv2d_gather_v{}_", WGMMA_CONV2D)), "{}", spec.name);
        let f = WgmmaConv2d.features(&padded, &c, &target).unwrap();
        assert_eq!(f.last(), Some(&("gather", 1.0)));
    }

    #[test]
    fn layers_with_whole_k_tiles_of_channels_load_by_tma_in_im2col_mode() {
        let target = Target::sm90();
        // 2x9x9x64, 3x3 pad 1 stride 2, dilation 1: output 5x5.
        let layer = layer(2, 9, 64, 40, 3, 1, 2, DType::F16);
        let c = config(&layer, "inline");
        let spec = WgmmaConv2d.generate(&layer, &c, &target).unwrap();
        let Arg::Im2col(x) = &spec.args[0] else { panic!("{:?}", spec.args) };
        assert_eq!((x.operand, x.dims, x.strides_bytes), (TensorOperand::A, [64, 9, 9, 2], [128, 9 * 128, 81 * 128]));
        // The first window starts a pad before the input; the last at pad - (3 - 1) past its end.
        assert_eq!((x.lower, x.upper, x.element_strides), ([-1, -1], [-1, -1], [1, 2, 2, 1]));
        assert_eq!(x.channels, 64);
        assert_eq!(x.pixels, c.int("block_n").unwrap() as u32);
        let Arg::Map(y) = &spec.args[1] else { panic!("{:?}", spec.args) };
        assert_eq!((y.operand, y.dims), (TensorOperand::B, [9 * 64, 40]));
        for line in ["IM2COL = true;", "GATHER = false;", "CONV_C = 64;", "OUT_W = 5;", "STRIDE_H = 2;"] {
            assert!(spec.source.contains(line), "{line} missing");
        }
        assert!(spec.name.starts_with(&format!("tt_wgmma_conv2d_im2col_v{}_", WGMMA_CONV2D)), "{}", spec.name);
        // The window's extent and dilation set the upper corner.
        let Workload::Conv2d(mut d) = layer else { unreachable!() };
        d.dilation = (2, 3);
        d.pad = (2, 3);
        let dilated = Workload::Conv2d(d);
        let spec = WgmmaConv2d.generate(&dilated, &config(&dilated, "inline"), &target).unwrap();
        let Arg::Im2col(x) = &spec.args[0] else { panic!("{:?}", spec.args) };
        assert_eq!((x.lower, x.upper), ([-3, -2], [3 - 2 * 3, 2 - 2 * 2]));
        // i8: a K tile is 128 channels, one copy's 128 bytes.
        let i8_layer = Workload::from_key("conv2d/n3h9w9c128/k48r3s3/pad1x1,stride2x2,dil1x1/nhwc/i8,i32,i32").unwrap();
        let c = Config::from_json(
            r#"{"block_m":64,"block_n":64,"cluster":1,"consumers":1,"persistent":0,"producer":"warpgroup","raster_group":1,"schedule":"cooperative","stages":4,"stream_k":0,"epilogue":"direct"}"#,
        )
        .unwrap();
        let spec = WgmmaConv2d.generate(&i8_layer, &c, &target).unwrap();
        let Arg::Im2col(x) = &spec.args[0] else { panic!("{:?}", spec.args) };
        assert_eq!((x.channels, x.pixels, x.dims), (128, 64, [128, 9, 9, 3]));
    }

    #[test]
    fn rules_name_the_field_or_the_knob() {
        let target = Target::sm90();
        let padded = layer(1, 14, 32, 64, 3, 1, 1, DType::F16);
        let mut inline = config(&padded, "warpgroup");
        inline.0.insert("producer".into(), crate::space::KnobValue::Str("inline".into()));
        let e = WgmmaConv2d.check(&padded, &inline, &target).unwrap_err().to_string();
        assert!(e.contains("gathered") && e.contains("producer warpgroup"), "{e}");
        let e = WgmmaConv2d.supports(&layer(1, 14, 12, 64, 3, 1, 1, DType::F16), &target).unwrap_err();
        assert_eq!(e.field(), Some("c"));
        assert!(e.to_string().contains("multiple of 8") && e.to_string().contains("16"), "{e}");
        let e = WgmmaConv2d.supports(&layer(1, 14, 24, 64, 1, 0, 1, DType::I8), &target).unwrap_err();
        assert!(e.field() == Some("c") && e.to_string().contains("multiple of 16"), "{e}");
        let e = WgmmaConv2d.supports(&padded, &Target::sm80()).unwrap_err();
        assert_eq!(e.field(), Some("template"));
        let matmul = Workload::Matmul(
            crate::Matmul::new(64, 64, 64, Layout::Tn, Types::default_for(DType::F16).unwrap()).unwrap(),
        );
        assert!(WgmmaConv2d.supports(&matmul, &target).is_err());
    }

    #[test]
    fn tf32_layers_take_k_tiles_of_32_channels_and_issue_k8_tf32_wgmmas() {
        let target = Target::sm90();
        // 64 channels: two K tiles of 32 per tap, loaded by TMA in im2col mode.
        let l = layer(2, 9, 64, 40, 3, 1, 2, DType::Tf32);
        let Workload::Conv2d(c) = l else { unreachable!() };
        assert_eq!(ConvGemm::of(&c).0.x, ConvX::Im2col);
        assert_eq!(l.key(), "conv2d/n2h9w9c64/k40r3s3/pad1x1,stride2x2,dil1x1/nhwc/tf32,f32,f32");
        let spec = WgmmaConv2d.generate(&l, &config(&l, "inline"), &target).unwrap();
        let Arg::Im2col(x) = &spec.args[0] else { panic!("{:?}", spec.args) };
        assert_eq!((x.dtype, x.channels), (DType::Tf32, 32));
        assert_eq!((x.dims, x.strides_bytes), ([64, 9, 9, 2], [256, 9 * 256, 81 * 256]));
        let Arg::Map(y) = &spec.args[1] else { panic!("{:?}", spec.args) };
        assert_eq!((y.dtype, y.dims, y.box_dims[0]), (DType::Tf32, [9 * 64, 40], 32));
        let line = spec.source.lines().find(|l| l.contains("wgmma.mma_async")).unwrap_or("");
        assert!(line.contains("k8.f32.tf32.tf32"), "no tf32 wgmma: {line}");
        assert!(spec.source.contains("constexpr int BK = 32;") && spec.source.contains("p, 1, 1;"));
        // 48 channels: a K tile of 32 straddles taps, so the activations are gathered 4 floats
        // (16 bytes) at a time; 4 channels is the fewest.
        let Workload::Conv2d(g) = layer(2, 9, 48, 40, 3, 1, 1, DType::Tf32) else { unreachable!() };
        assert_eq!(ConvGemm::of(&g).0.x, ConvX::Gather);
        let few = layer(2, 9, 4, 40, 3, 1, 1, DType::Tf32);
        let spec = WgmmaConv2d.generate(&few, &config(&few, "warpgroup"), &target).unwrap();
        assert!(
            spec.source.contains("CONV_C = 4;")
                && spec.name.starts_with(&format!("tt_wgmma_conv2d_gather_v{}_", WGMMA_CONV2D))
        );
        let e = WgmmaConv2d.supports(&layer(2, 9, 6, 40, 3, 1, 1, DType::Tf32), &target).unwrap_err();
        assert!(e.field() == Some("c") && e.to_string().contains("multiple of 4"), "{e}");
        // A pointwise layer: plain TMA tiles of floats.
        let p = layer(4, 14, 64, 128, 1, 0, 1, DType::Tf32);
        let valid = valid_configs(&WgmmaConv2d, &p, &target).unwrap();
        assert!(valid.len() >= 50, "{} valid configs", valid.len());
        let spec = WgmmaConv2d.generate(&p, &valid[valid.len() / 2].1, &target).unwrap();
        assert!(matches!(&spec.args[0], Arg::Map(x) if x.dtype == DType::Tf32 && x.box_dims[0] == 32));
        // Exact f32 is not wgmma's: it would round to TF32.
        let e = WgmmaConv2d.supports(&layer(2, 9, 64, 40, 3, 1, 1, DType::F32), &target).unwrap_err();
        assert_eq!(e.field(), Some("input"));
        assert!(e.to_string().contains("tf32") && e.to_string().contains("exact"), "{e}");
    }

    #[test]
    fn fused_layers_take_the_per_channel_epilogue_and_plain_ones_keep_their_source() {
        let target = Target::sm90();
        let plain = layer(4, 14, 64, 96, 3, 1, 1, DType::F16);
        let Workload::Conv2d(p) = plain else { unreachable!() };
        let block_end = Workload::Conv2d(Conv2d { epilogue: "bias+relu".parse().unwrap(), residual: true, ..p });
        let c = config(&plain, "inline");
        let (plain_spec, fused_spec) = (
            WgmmaConv2d.generate(&plain, &c, &target).unwrap(),
            WgmmaConv2d.generate(&block_end, &c, &target).unwrap(),
        );
        // The layer's output channels are the GEMM's rows: the per-row bias is per channel, and
        // C (the identity) is read as beta = 1.
        let (_, gemm) = ConvGemm::of(&Conv2d { epilogue: "bias+relu".parse().unwrap(), residual: true, ..p });
        assert_eq!((gemm.m, gemm.beta, gemm.epilogue.name().as_str()), (96, 1.0, "bias+relu"));
        for line in ["EPI_BIAS = true;", "EPI_ACT = 1;", "READ_C = true;", "FUSED = true;", "BETA = 1"] {
            assert!(fused_spec.source.contains(line), "{line} missing");
        }
        assert_eq!(fused_spec.args.last(), Some(&Arg::Bias));
        assert_ne!(fused_spec.name, plain_spec.name, "the key's digest tells the kernels apart");
        // A plain layer's source has no trace of the epilogue (records of it still hold).
        for line in ["EPI_BIAS = false;", "EPI_ACT = 0;", "READ_C = false;", "FUSED = false;"] {
            assert!(plain_spec.source.contains(line), "{line} missing");
        }
        assert!(!plain_spec.source.contains("per output channel") && !plain_spec.args.contains(&Arg::Bias));
        // The other conv templates refuse it, naming themselves and the one that fuses.
        for t in crate::registry::all().into_iter().filter(|t| t.op() == Op::Conv2d && t.name() != "wgmma_conv2d") {
            let e = t.check_workload(&block_end).unwrap_err();
            assert_eq!(e.field(), Some("epilogue"), "{}: {e}", t.name());
            assert!(e.to_string().contains(t.name()) && e.to_string().contains("wgmma_conv2d"), "{e}");
        }
    }

    #[test]
    fn a_clusters_padding_tile_is_never_stored() {
        // 56 x 56 pixels: 49 tiles of 64, so a cluster of 2 pads one tile past N.
        let target = Target::sm90();
        let l = layer(1, 56, 64, 64, 1, 0, 1, DType::F16);
        let valid = valid_configs(&WgmmaConv2d, &l, &target).unwrap();
        let pick = |cluster, store| {
            let (_, c) = valid
                .iter()
                .find(|(_, c)| {
                    c.int("block_n").ok() == Some(64)
                        && c.int("cluster").ok() == Some(cluster)
                        && c.name("epilogue").ok() == Some(store)
                })
                .unwrap();
            WgmmaConv2d.generate(&l, c, &target).unwrap().source
        };
        assert!(pick(2, "direct").contains("constexpr bool EVEN_P = false;"), "the padding tile's rows are guarded");
        assert!(pick(1, "direct").contains("constexpr bool EVEN_P = true;"));
        // A TMA store clips the padding tile: its source is as before.
        assert!(pick(2, "tma").contains("constexpr bool EVEN_P = true;"));
    }

    #[test]
    fn conv_layers_search_both_templates_on_hopper() {
        let w = layer(32, 56, 64, 64, 3, 1, 1, DType::F16);
        let names: Vec<_> = crate::registry::all()
            .into_iter()
            .filter(|t| t.op() == Op::Conv2d && t.supports(&w, &Target::sm90()).is_ok())
            .map(|t| t.name())
            .collect();
        assert_eq!(names, ["wmma_conv2d", "wgmma_conv2d"]);
        // TF32 too; exact f32 is neither's.
        for (input, want) in [(DType::Tf32, &["wmma_conv2d", "wgmma_conv2d"][..]), (DType::F32, &[][..])] {
            let w = layer(32, 56, 64, 64, 3, 1, 1, input);
            let names: Vec<_> = crate::registry::all()
                .into_iter()
                .filter(|t| t.op() == Op::Conv2d && t.supports(&w, &Target::sm90()).is_ok())
                .map(|t| t.name())
                .filter(|n| n.starts_with("wmma") || n.starts_with("wgmma"))
                .collect();
            assert_eq!(names, want, "{input}");
        }
    }
}
