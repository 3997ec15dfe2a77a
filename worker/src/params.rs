//! A generated kernel's arguments as bundle parameters: one description of every tensor map, which
//! the worker encodes for the kernels it measures (through `tensortune_bundle::encode_map`, the
//! same function a bundle's loader calls) and `tensortune export` writes into manifests.

use tensortune_bundle::{Im2colRecipe, MapRecipe, Operand, Param};
use tensortune_kernels::{Arg, TensorOperand};

/// A generated kernel's argument as a bundle parameter.
pub fn param(arg: &Arg) -> Param {
    match arg {
        Arg::A => Param::Pointer { operand: Operand::A },
        Arg::B => Param::Pointer { operand: Operand::B },
        Arg::C => Param::Pointer { operand: Operand::C },
        Arg::D => Param::Pointer { operand: Operand::D },
        Arg::Workspace => Param::Pointer { operand: Operand::Workspace },
        Arg::Bias => Param::Pointer { operand: Operand::Bias },
        Arg::Scale => Param::Pointer { operand: Operand::Scale },
        Arg::TensorScales => Param::Pointer { operand: Operand::TensorScales },
        Arg::Map(m) => {
            Param::TensorMap(MapRecipe::tiled(operand(m.operand), dtype(m.dtype), m.dims, m.row_bytes, m.box_dims))
        }
        Arg::Im2col(m) => Param::Im2colMap(Im2colRecipe {
            operand: operand(m.operand),
            dtype: dtype(m.dtype),
            dims: m.dims,
            strides_bytes: m.strides_bytes,
            lower_corner: m.lower,
            upper_corner: m.upper,
            channels_per_pixel: m.channels,
            pixels_per_column: m.pixels,
            element_strides: m.element_strides,
        }),
    }
}

/// The bundle's name for an element type a bundle can state (tf32 as `tf32`, never as exact
/// f32, whose results it would not give); `None` for the packed types.
pub fn bundle_dtype(d: tensortune_kernels::DType) -> Option<tensortune_bundle::DType> {
    use tensortune_bundle::DType as B;
    use tensortune_kernels::DType as K;
    match d {
        K::F16 => Some(B::F16),
        K::Bf16 => Some(B::Bf16),
        K::F32 => Some(B::F32),
        K::I8 => Some(B::I8),
        K::I32 => Some(B::I32),
        K::Tf32 => Some(B::Tf32),
        K::S4 | K::U4 | K::B1Xor | K::B1And => None,
        K::E4m3 => Some(B::E4m3),
        K::E5m2 => Some(B::E5m2),
    }
}

/// The bundle's name for the storage of an element type, as tensor maps see it: tf32 operands
/// are f32 in memory (wgmma_gemm's TF32 maps copy f32). No template makes a map over a packed
/// operand; one would read as bytes.
pub fn dtype(d: tensortune_kernels::DType) -> tensortune_bundle::DType {
    use tensortune_kernels::DType as K;
    match d {
        K::Tf32 => tensortune_bundle::DType::F32,
        _ => bundle_dtype(d).unwrap_or(tensortune_bundle::DType::I8),
    }
}

fn operand(o: TensorOperand) -> Operand {
    match o {
        TensorOperand::A => Operand::A,
        TensorOperand::B => Operand::B,
        TensorOperand::C => Operand::C,
        TensorOperand::D => Operand::D,
    }
}
