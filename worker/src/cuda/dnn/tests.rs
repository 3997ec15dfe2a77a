use std::ffi::OsStr;

use cudarc::cudnn::sys::{cudnnConvolutionFwdAlgo_t as Algo, cudnnDataType_t, cudnnMathType_t as MathType};
use tensortune_kernels::support::Tolerance;
use tensortune_kernels::{DType, Types};

use super::api::*;
use super::convert::*;
use super::types::*;
use super::*;

fn conv(input: DType, acc: DType, out: DType, c: u64, k: u64) -> Conv2d {
    let w = Conv2d {
        n: 1,
        h: 56,
        w: 56,
        c,
        k,
        r: 3,
        s: 3,
        pad: (1, 1),
        stride: (2, 2),
        dilation: (1, 1),
        types: Types::new(input, acc, Some(out)).unwrap(),
        epilogue: Default::default(),
        residual: false,
    };
    w.validate().unwrap();
    w
}

#[test]
fn f16_to_f32_runs_as_pseudo_half_with_a_half_output() {
    let c = conv(DType::F16, DType::F32, DType::F32, 64, 128);
    let p = ConvPlan::new(&c).unwrap();
    assert_eq!((p.config, p.input, p.compute, p.output), (TypeConfig::PseudoHalf, DType::F16, DType::F32, DType::F16));
    assert!(p.output_differs());
    assert_eq!(p.describe(), "PSEUDO_HALF_CONFIG f16->f16 (our output f32)");
    assert_eq!(p.x_dims, [1, 64, 56, 56]);
    assert_eq!(p.w_dims, [128, 64, 3, 3]);
    assert_eq!(p.y_dims, [1, 128, 28, 28]);
    assert_eq!((p.pad, p.stride, p.dilation), ([1, 1], [2, 2], [1, 1]));
    // cuDNN's half output is checked with half rounding, not our f32's.
    let ours = Tolerance::for_workload(&Workload::Conv2d(c));
    let t = p.tolerance(&c);
    assert_eq!(t.acc, ours.acc);
    assert!(t.out > 100.0 * ours.out, "{t:?} vs {ours:?}");
}

#[test]
fn f16_to_f16_matches_our_output() {
    let p = ConvPlan::new(&conv(DType::F16, DType::F32, DType::F16, 64, 128)).unwrap();
    assert_eq!((p.config, p.output), (TypeConfig::PseudoHalf, DType::F16));
    assert!(!p.output_differs());
    assert_eq!(p.describe(), "PSEUDO_HALF_CONFIG f16->f16");
    let p = ConvPlan::new(&conv(DType::F16, DType::F16, DType::F16, 64, 128)).unwrap();
    assert_eq!((p.compute, p.output_differs()), (DType::F32, false));
    assert_eq!(p.describe(), "PSEUDO_HALF_CONFIG f16->f16 (f32 accumulation, ours f16)");
    let p = ConvPlan::new(&conv(DType::Bf16, DType::F32, DType::F32, 64, 128)).unwrap();
    assert_eq!((p.config, p.output), (TypeConfig::PseudoBf16, DType::Bf16));
}

#[test]
fn i8_runs_as_int8_ext_with_a_float_output() {
    let c = conv(DType::I8, DType::I32, DType::I32, 64, 128);
    let p = ConvPlan::new(&c).unwrap();
    assert_eq!((p.config, p.input, p.compute, p.output), (TypeConfig::Int8Ext, DType::I8, DType::I32, DType::F32));
    assert!(p.output_differs());
    assert_eq!(p.describe(), "INT8_EXT_CONFIG i8->f32 (our output i32)");
    let t = p.tolerance(&c);
    assert_eq!(t.acc, 0.0, "int32 accumulation is exact");
    assert!(t.out > 0.0 && t.out < 1e-6, "float output rounding only: {t:?}");
    assert_eq!(data_type(p.compute), cudnnDataType_t::CUDNN_DATA_INT32 as u32);
    assert_eq!(data_type(p.output), cudnnDataType_t::CUDNN_DATA_FLOAT as u32);
}

#[test]
fn i8_with_channels_not_a_multiple_of_4_is_unsupported() {
    let e = ConvPlan::new(&conv(DType::I8, DType::I32, DType::I32, 3, 64)).unwrap_err();
    assert!(e.contains("INT8_EXT_CONFIG") && e.contains("C = 3"), "{e}");
}

#[test]
fn f32_runs_as_float_config_with_fma_math_and_tf32_with_tensor_ops() {
    let exact = conv(DType::F32, DType::F32, DType::F32, 64, 128);
    let p = ConvPlan::new(&exact).unwrap();
    assert_eq!((p.config, p.input, p.compute, p.output), (TypeConfig::Float, DType::F32, DType::F32, DType::F32));
    assert_eq!(p.math, Math::FmaOnly);
    assert!(!p.output_differs());
    assert_eq!(p.describe(), "FLOAT_CONFIG f32->f32 (FMA math only: exact f32)");
    assert_eq!(p.math.descriptor(), MathType::CUDNN_FMA_MATH as u32);
    assert_eq!(p.tolerance(&exact), Tolerance::for_workload(&Workload::Conv2d(exact)));

    let tf32 = conv(DType::Tf32, DType::F32, DType::F32, 64, 128);
    let p = ConvPlan::new(&tf32).unwrap();
    // TF32 data is f32 in memory: the same descriptors, another math type.
    assert_eq!((p.config, p.input, p.compute, p.output), (TypeConfig::Float, DType::F32, DType::F32, DType::F32));
    assert_eq!(p.math, Math::TensorOps);
    assert_eq!(p.describe(), "FLOAT_CONFIG f32->f32 (tensor-op math: TF32)");
    assert_eq!(p.math.descriptor(), MathType::CUDNN_TENSOR_OP_MATH as u32);
    assert_eq!(data_type(p.input), cudnnDataType_t::CUDNN_DATA_FLOAT as u32);
    // TF32's cross-check is looser than exact f32's.
    assert!(p.tolerance(&tf32).acc > 100.0 * ConvPlan::new(&exact).unwrap().tolerance(&exact).acc);
}

#[test]
fn fma_only_times_each_algorithm_once_with_fma_math() {
    let row =
        |algo: Algo, math: MathType| AlgoPerf { algo: algo as u32, math_type: math as u32, ..AlgoPerf::default() };
    let found = [
        row(Algo::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, MathType::CUDNN_TENSOR_OP_MATH),
        row(Algo::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, MathType::CUDNN_DEFAULT_MATH),
        row(Algo::CUDNN_CONVOLUTION_FWD_ALGO_GEMM, MathType::CUDNN_FMA_MATH),
    ];
    let fma = Math::FmaOnly.candidates(&found);
    assert_eq!(fma.len(), 2, "{fma:?}");
    assert!(fma.iter().all(|p| p.math_type == MathType::CUDNN_FMA_MATH as u32), "{fma:?}");
    assert_eq!(fma[0].algo, Algo::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM as u32, "the order is kept");
    let ops = Math::TensorOps.candidates(&found);
    assert_eq!(ops.iter().map(|p| p.math_type).collect::<Vec<_>>(), found.map(|p| p.math_type));
    assert_eq!(math_name(MathType::CUDNN_FMA_MATH as u32), "FMA only");
}

#[test]
fn conversions_are_exact_and_keep_poison() {
    let mut out = Vec::new();
    let src: Vec<u8> = [1.5f32, -0.125, f32::NAN].iter().flat_map(|v| half::f16::from_f32(*v).to_le_bytes()).collect();
    convert_host(&src, DType::F16, DType::F32, &mut out).unwrap();
    let got: Vec<f32> = out.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    assert_eq!(&got[..2], &[1.5, -0.125]);
    assert!(got[2].is_nan());

    let src: Vec<u8> = [12345.0f32, -7.0, f32::NAN].iter().flat_map(|v| v.to_le_bytes()).collect();
    convert_host(&src, DType::F32, DType::I32, &mut out).unwrap();
    let got: Vec<i32> = out.chunks_exact(4).map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    assert_eq!(got, [12345, -7, I32_POISON]);

    assert!(convert_host(&[0; 4], DType::F32, DType::F16, &mut out).is_err());
}

#[test]
fn a_missing_library_is_a_clear_message_not_a_panic() {
    let e = Api::open(Some(OsStr::new("/nonexistent/libcudnn.so.9"))).err().expect("no such file");
    assert!(e.starts_with("cuDNN not found") && e.contains(LIB_ENV) && e.contains("/nonexistent"), "{e}");
    // A library that is not cuDNN: refused by name, not called.
    let e = Api::open(Some(OsStr::new("libm.so.6"))).err().expect("libm is not cuDNN");
    assert!(e.contains("has no cudnnGetVersion"), "{e}");
    // Without the setting: found on this machine or not, never a panic.
    if let Err(e) = Api::open(None) {
        assert!(e.starts_with("cuDNN not found") && e.contains("LD_LIBRARY_PATH"), "{e}");
    }
}

#[test]
fn names() {
    assert_eq!(version_text(91400), "9.14.0");
    assert_eq!(version_text(90100), "9.1.0");
    assert_eq!(version_text(8907), "8.9.7");
    assert_eq!(algo_name(Algo::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM as u32), "IMPLICIT_PRECOMP_GEMM");
    assert_eq!(algo_name(42), "algo 42");
    assert_eq!(math_name(1), "tensor ops");
}

#[test]
fn cudnns_fused_call_takes_bias_then_relu_or_nothing_and_the_residual() {
    let half = conv(DType::F16, DType::F32, DType::F16, 64, 128);
    let plan = ConvPlan::new(&half).unwrap();
    let with = |epi: &str, residual| Conv2d { epilogue: epi.parse().unwrap(), residual, ..half };
    for (epi, residual) in [("bias+relu", false), ("bias", true), ("bias+relu", true), ("bias", false)] {
        assert_eq!(cudnn_fusable(&with(epi, residual), &plan), Ok(()), "{epi} {residual}");
    }
    for (epi, residual, says) in [
        ("relu", true, "has none"),
        ("bias+gelu", false, "no GELU"),
        ("bias+gelu_erf", true, "no GELU"),
        ("scale+bias", false, "per-channel scale"),
    ] {
        assert!(cudnn_fusable(&with(epi, residual), &plan).unwrap_err().contains(says), "{epi}");
    }
    // cuDNN writes half where ours is f32: its fused output would not be ours.
    let wide = conv(DType::F16, DType::F32, DType::F32, 64, 128);
    let fused = Conv2d { epilogue: "bias+relu".parse().unwrap(), ..wide };
    assert!(cudnn_fusable(&fused, &ConvPlan::new(&wide).unwrap()).unwrap_err().contains("output type"));
    assert_eq!(conv_epilogue_name(&with("bias+relu", true)), "residual+bias+relu");
    assert_eq!(conv_epilogue_name(&with("none", true)), "residual");
}
