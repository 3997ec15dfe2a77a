//! Host conversion of cuDNN's output when its type differs from ours (exact; see the notes of
//! [`super`]).

use cudarc::driver::sys::CUresult;
use cudarc::driver::{CudaStream, result};
use tensortune_kernels::DType;

use crate::cuda::device::{Context, CudaFailure};

/// Elements converted per host round trip when cuDNN's output type differs from ours.
pub(super) const CONVERT_CHUNK: u64 = 1 << 22;
/// `poison_value<int>()` of the support module: what an unwritten i32 output holds.
pub(super) const I32_POISON: i32 = 0x8000_0001_u32 as i32;

/// Converts `src` (elements of `from`, little-endian) into `to`, appending to `out` after
/// clearing it. Only the conversions [`ConvPlan`] needs exist; all are exact (f32 -> i32 holds
/// for integral values, which int32 accumulation converted to float is). Unwritten elements
/// (NaN) stay unwritten: NaN, or the i32 poison.
pub(crate) fn convert_host(src: &[u8], from: DType, to: DType, out: &mut Vec<u8>) -> Result<(), String> {
    out.clear();
    match (from, to) {
        (DType::F16, DType::F32) => {
            for b in src.chunks_exact(2) {
                out.extend_from_slice(&half::f16::from_le_bytes([b[0], b[1]]).to_f32().to_le_bytes());
            }
        }
        (DType::Bf16, DType::F32) => {
            for b in src.chunks_exact(2) {
                out.extend_from_slice(&half::bf16::from_le_bytes([b[0], b[1]]).to_f32().to_le_bytes());
            }
        }
        (DType::F32, DType::I32) => {
            for b in src.chunks_exact(4) {
                let v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                // `as` saturates out-of-range values; the comparison then flags them.
                let i = if v.is_nan() { I32_POISON } else { v.round() as i32 };
                out.extend_from_slice(&i.to_le_bytes());
            }
        }
        _ => return Err(format!("no conversion from cuDNN's {from} output to {to}")),
    }
    Ok(())
}

/// Copies `elems` elements of `from` at `src` into `dst` as `to`, through the host.
pub(super) fn copy_converted(
    stream: &CudaStream,
    src: u64,
    from: DType,
    dst: u64,
    to: DType,
    elems: u64,
) -> Result<(), CudaFailure> {
    stream.synchronize().when(|| "waiting for cuDNN's output".into())?;
    let (fb, tb) = (from.bytes() as u64, to.bytes() as u64);
    let mut raw = vec![0u8; (elems.min(CONVERT_CHUNK) * fb) as usize];
    let mut converted = Vec::with_capacity((elems.min(CONVERT_CHUNK) * tb) as usize);
    let mut done = 0;
    while done < elems {
        let n = (elems - done).min(CONVERT_CHUNK);
        let chunk = &mut raw[..(n * fb) as usize];
        // SAFETY: `src` holds `elems` elements of `from`, `dst` of `to`; the chunk is in bounds.
        unsafe { result::memcpy_dtoh_sync(chunk, src + done * fb) }.when(|| "reading cuDNN's output".into())?;
        convert_host(chunk, from, to, &mut converted)
            .map_err(|context| CudaFailure { code: CUresult::CUDA_ERROR_NOT_SUPPORTED, context })?;
        // SAFETY: as above.
        unsafe { result::memcpy_htod_sync(dst + done * tb, &converted) }
            .when(|| "writing cuDNN's converted output".into())?;
        done += n;
    }
    Ok(())
}
