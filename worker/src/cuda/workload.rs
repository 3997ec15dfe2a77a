//! Everything a workload needs on the GPU, made once per child session: the support module, the
//! input sets (a check set whose products sum exactly, a full-precision timing set), C, the output,
//! the float64 reference with its error scales, and the comparison statistics.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, result};
use cudarc::nvrtc::Ptx;
use tensortune_kernels::support::{self, Tolerance};
use tensortune_kernels::{Arg, DType, Im2colMap, InputScale, TensorMap, TensorOperand, Workload, epilogue};

use super::device::{Context, CudaFailure, DevBuf, KArg, grid_for, launch};

/// Seeds of the generated inputs: fixed, so every worker checks against the same data.
const SEED_A_CHECK: u32 = 0x0a11;
const SEED_B_CHECK: u32 = 0x0b22;
const SEED_A_TIME: u32 = 0x1a33;
const SEED_B_TIME: u32 = 0x1b44;
const SEED_C: u32 = 0x0c55;

/// Bytes of canary after the output and after a kernel's workspace: a kernel that writes past
/// either end changes them, and its measurement becomes a failure instead of a corruption of
/// whatever buffer lies beyond (an H200 sweep once saw 2 MiB of the float64 reference zeroed by
/// some kernel, after which every config failed the check the same way).
pub(crate) const CANARY_BYTES: usize = 256 * 1024;
/// The canary's byte: neither zero nor a pattern of the poison, so an overrun of either shows.
const CANARY_BYTE: u8 = 0xa5;

/// Which input set a launch reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum InputSet {
    /// Multiples of 1/8 (or integers): exact products, exact f32 sums.
    Check,
    /// Full-precision uniform values: what timings run on.
    Timing,
}

/// Result of comparing the output with the reference.
#[derive(Clone, Debug)]
pub(crate) struct Comparison {
    pub(crate) max_abs: f64,
    pub(crate) max_rel: f64,
    pub(crate) failures: u64,
    pub(crate) first_bad: Option<u64>,
    pub(crate) unwritten: u64,
}

pub(crate) struct WorkloadState {
    pub(crate) workload: Workload,
    _module: Arc<CudaModule>,
    f_fill_in: CudaFunction,
    f_fill_out: CudaFunction,
    f_reference: CudaFunction,
    f_poison: CudaFunction,
    f_compare: CudaFunction,
    f_epilogue: CudaFunction,
    f_activate: CudaFunction,
    a_check: DevBuf,
    b_check: DevBuf,
    a_time: DevBuf,
    b_time: DevBuf,
    c: DevBuf,
    pub(crate) d: DevBuf,
    /// The epilogue's vectors (see `tensortune_kernels::epilogue`): bias (M of the output type),
    /// per-row scale (M f32) and the FP8 inputs' tensor scales (2 f32); 256-byte stand-ins for a
    /// workload without them, so every pointer is valid.
    pub(crate) vectors: Vectors,
    reference: DevBuf,
    sq: DevBuf,
    mag: DevBuf,
    stats: DevBuf,
    out_elems: u64,
    /// Bytes of the output (`d` holds [`CANARY_BYTES`] more, its canary).
    out_bytes: usize,
}

impl WorkloadState {
    /// Loads the support module, allocates and fills every buffer and computes the reference.
    pub(crate) fn new(
        ctx: &Arc<CudaContext>,
        stream: &Arc<CudaStream>,
        workload: &Workload,
        support_cubin: &[u8],
    ) -> Result<WorkloadState, CudaFailure> {
        let key = workload.key();
        let module = ctx
            .load_module(Ptx::from_binary(support_cubin.to_vec()))
            .when(|| format!("when loading the support module of {key}"))?;
        let func =
            |name: &str| module.load_function(name).when(|| format!("when looking up {name} in the support module"));
        let f_fill_in = func("tt_fill_in")?;
        let f_fill_out = func("tt_fill_out")?;
        let f_poison = func("tt_poison")?;
        let f_reference = func("tt_reference")?;
        let f_compare = func("tt_compare")?;
        let f_epilogue = func("tt_epilogue")?;
        let f_activate = func("tt_activate")?;

        let t = workload.types();
        let (a_elems, b_elems, out_elems) = support::operand_elements(workload);
        // Sizes in bits: packed inputs hold several elements per byte.
        let alloc = |elems: u64, ty: DType| DevBuf::new(ctx, ty.storage_bytes(elems) as usize);
        let out_bytes = t.output.storage_bytes(out_elems) as usize;
        let state = WorkloadState {
            workload: *workload,
            f_fill_in,
            f_fill_out,
            f_reference,
            f_poison,
            f_compare,
            f_epilogue,
            f_activate,
            a_check: alloc(a_elems, t.input)?,
            b_check: alloc(b_elems, t.input)?,
            a_time: alloc(a_elems, t.input)?,
            b_time: alloc(b_elems, t.input)?,
            c: alloc(out_elems, t.output)?,
            d: DevBuf::new(ctx, out_bytes + CANARY_BYTES)?,
            vectors: Vectors::new(ctx, workload)?,
            reference: DevBuf::new(ctx, out_elems as usize * 8)?,
            sq: DevBuf::new(ctx, out_elems as usize * 8)?,
            mag: DevBuf::new(ctx, out_elems as usize * 8)?,
            stats: DevBuf::new(ctx, 256)?,
            out_elems,
            out_bytes,
            _module: module.clone(),
        };
        state.restore(stream)?;
        Ok(state)
    }

    /// Generates the inputs and C, computes the reference and arms the output's canary: at the
    /// start, and again after a kernel may have written where it must not (a changed canary, a
    /// failed check), so that the next config is checked against data known to be right.
    pub(crate) fn restore(&self, stream: &Arc<CudaStream>) -> Result<(), CudaFailure> {
        let key = self.workload.key();
        let (a_elems, b_elems, out_elems) = support::operand_elements(&self.workload);
        let fill = |f: &CudaFunction, buf: &DevBuf, n: u64, seed: u32, check: bool| {
            launch(
                stream,
                f,
                grid_for(n),
                &[KArg::Ptr(buf.ptr), KArg::U64(n), KArg::U32(seed), KArg::I32(check as i32)],
            )
            .when(|| format!("when generating inputs for {key}"))
        };
        fill(&self.f_fill_in, &self.a_check, a_elems, SEED_A_CHECK, true)?;
        fill(&self.f_fill_in, &self.b_check, b_elems, SEED_B_CHECK, true)?;
        fill(&self.f_fill_in, &self.a_time, a_elems, SEED_A_TIME, false)?;
        fill(&self.f_fill_in, &self.b_time, b_elems, SEED_B_TIME, false)?;
        fill(&self.f_fill_out, &self.c, out_elems, SEED_C, true)?;
        launch(
            stream,
            &self.f_reference,
            grid_for(out_elems),
            &[
                KArg::Ptr(self.a_check.ptr),
                KArg::Ptr(self.b_check.ptr),
                KArg::Ptr(self.c.ptr),
                KArg::Ptr(self.reference.ptr),
                KArg::Ptr(self.sq.ptr),
                KArg::Ptr(self.mag.ptr),
                KArg::Ptr(self.vectors.bias.ptr),
                KArg::Ptr(self.vectors.scale.ptr),
                KArg::Ptr(self.vectors.tensor.ptr),
            ],
        )
        .when(|| format!("when computing the reference of {key}"))?;
        arm_canary(stream, self.d.ptr + self.out_bytes as u64).when(|| format!("when arming the canary of {key}"))?;
        stream.synchronize().when(|| format!("when computing the reference of {key}"))
    }

    /// What changed in the canary after the output (see [`canary_damage`]), `None` when intact.
    pub(crate) fn output_overrun(&self, stream: &CudaStream) -> Result<Option<Damage>, CudaFailure> {
        read_canary(stream, self.d.ptr + self.out_bytes as u64)
    }

    /// A generated kernel's arguments: device pointers, and tensor maps encoded over them.
    pub(crate) fn args(
        &self,
        args: &[Arg],
        set: InputSet,
        workspace: Option<&DevBuf>,
    ) -> Result<Vec<KArg>, CudaFailure> {
        let (a, b) = self.inputs(set);
        args.iter()
            .map(|arg| {
                Ok(KArg::Ptr(match arg {
                    Arg::A => a,
                    Arg::B => b,
                    Arg::C => self.c.ptr,
                    Arg::D => self.d.ptr,
                    // A kernel that needs no workspace still gets a valid pointer.
                    Arg::Workspace => workspace.map_or(self.stats.ptr, |w| w.ptr),
                    Arg::Bias => self.vectors.bias.ptr,
                    Arg::Scale => self.vectors.scale.ptr,
                    Arg::TensorScales => self.vectors.tensor.ptr,
                    Arg::Map(TensorMap { operand, .. }) | Arg::Im2col(Im2colMap { operand, .. }) => {
                        let ptr = match operand {
                            TensorOperand::A => a,
                            TensorOperand::B => b,
                            TensorOperand::C => self.c.ptr,
                            TensorOperand::D => self.d.ptr,
                        };
                        return encode(arg, ptr);
                    }
                }))
            })
            .collect()
    }

    /// The A/B pointers of an input set (for the vendor baseline).
    /// C on the device (the output's shape and type).
    pub(crate) fn c_ptr(&self) -> u64 {
        self.c.ptr
    }

    pub(crate) fn inputs(&self, set: InputSet) -> (u64, u64) {
        match set {
            InputSet::Check => (self.a_check.ptr, self.b_check.ptr),
            InputSet::Timing => (self.a_time.ptr, self.b_time.ptr),
        }
    }

    /// Fills the output with poison (NaN, or a sentinel for integers) so unwritten elements show.
    pub(crate) fn poison(&self, stream: &CudaStream) -> Result<(), CudaFailure> {
        launch(stream, &self.f_poison, grid_for(self.out_elems), &[KArg::Ptr(self.d.ptr), KArg::U64(self.out_elems)])
            .when(|| "when poisoning the output".into())
    }

    /// Copies C into the output buffer (for vendor calls whose C is in place).
    pub(crate) fn load_c_into_output(&self, stream: &CudaStream) -> Result<(), CudaFailure> {
        // SAFETY: C and D have the same size (out_elems of the output type).
        unsafe { result::memcpy_dtod_async(self.d.ptr, self.c.ptr, self.out_bytes, stream.cu_stream()) }
            .when(|| "when copying C into the output".into())
    }

    /// Applies the workload's epilogue in place to a plain product in the output (alpha 1, beta
    /// 0, unscaled inputs), with the support module's elementwise kernel: the second kernel of
    /// an unfused vendor baseline.
    pub(crate) fn apply_epilogue(&self, stream: &CudaStream) -> Result<(), CudaFailure> {
        launch(
            stream,
            &self.f_epilogue,
            grid_for(self.out_elems),
            &[
                KArg::Ptr(self.d.ptr),
                KArg::Ptr(self.c.ptr),
                KArg::Ptr(self.vectors.bias.ptr),
                KArg::Ptr(self.vectors.scale.ptr),
                KArg::Ptr(self.vectors.tensor.ptr),
            ],
        )
        .when(|| "when applying the unfused epilogue".into())
    }

    /// Applies the workload's activation alone in place, with the support module's elementwise
    /// kernel: the second kernel of a vendor baseline that fused the rest of the epilogue.
    pub(crate) fn apply_activation(&self, stream: &CudaStream) -> Result<(), CudaFailure> {
        launch(stream, &self.f_activate, grid_for(self.out_elems), &[KArg::Ptr(self.d.ptr)])
            .when(|| "when applying the unfused activation".into())
    }

    /// Compares every output element with the reference.
    pub(crate) fn compare(&self, stream: &CudaStream, tol: &Tolerance) -> Result<Comparison, CudaFailure> {
        self.stats.write_u64(stream, &[0, 0, 0, u64::MAX, 0])?;
        launch(
            stream,
            &self.f_compare,
            grid_for(self.out_elems),
            &[
                KArg::Ptr(self.d.ptr),
                KArg::Ptr(self.reference.ptr),
                KArg::Ptr(self.sq.ptr),
                KArg::Ptr(self.mag.ptr),
                KArg::F64(tol.acc),
                KArg::F64(tol.out),
                KArg::Ptr(self.stats.ptr),
            ],
        )
        .when(|| "when comparing with the reference".into())?;
        let s = self.stats.read_u64::<5>(stream)?;
        Ok(Comparison {
            max_abs: f64::from_bits(s[0]),
            max_rel: f64::from_bits(s[1]),
            failures: s[2],
            first_bad: (s[3] != u64::MAX).then_some(s[3]),
            unwritten: s[4],
        })
    }

    /// The output element `index` and its reference value, read back to the host.
    pub(crate) fn value_at(&self, stream: &CudaStream, index: u64) -> Result<(f64, f64), CudaFailure> {
        stream.synchronize().when(|| "waiting for the stream".into())?;
        let out = self.workload.types().output;
        let size = out.bytes() as u64;
        let mut raw = [0u8; 4];
        let mut expected = [0f64; 1];
        // SAFETY: index < out_elems (it came from the comparison), so both reads are in bounds.
        unsafe {
            result::memcpy_dtoh_sync(&mut raw[..size as usize], self.d.ptr + index * size)
                .when(|| "reading an output element".into())?;
            result::memcpy_dtoh_sync(&mut expected, self.reference.ptr + index * 8)
                .when(|| "reading a reference element".into())?;
        }
        let got = match out {
            DType::F16 => half::f16::from_le_bytes([raw[0], raw[1]]).to_f64(),
            DType::Bf16 => half::bf16::from_le_bytes([raw[0], raw[1]]).to_f64(),
            DType::F32 | DType::Tf32 => f32::from_le_bytes(raw) as f64,
            DType::I32 => i32::from_le_bytes(raw) as f64,
            // Outputs are never packed (Types::SUPPORTED): a byte is the nearest reading.
            DType::I8 | DType::S4 | DType::U4 | DType::B1Xor | DType::B1And | DType::E4m3 | DType::E5m2 => {
                raw[0] as i8 as f64
            }
        };
        Ok((got, expected[0]))
    }

    /// Human-readable position of output element `index` (row, column / n, p, q, k).
    pub(crate) fn describe(&self, index: u64) -> String {
        match &self.workload {
            Workload::Matmul(m) if m.batch > 1 => {
                let per = m.m * m.n;
                format!("D[problem {}][{}, {}]", index / per, index % per % m.m, index % per / m.m)
            }
            Workload::Matmul(m) => format!("D[{}, {}]", index % m.m, index / m.m),
            Workload::Conv2d(c) => {
                let k = index % c.k;
                let q = (index / c.k) % c.q();
                let p = (index / c.k / c.q()) % c.p();
                let n = index / c.k / c.q() / c.p();
                format!("out[n={n}, p={p}, q={q}, k={k}]")
            }
        }
    }

    /// Bytes of device memory this state holds.
    pub(crate) fn bytes(&self) -> usize {
        [
            &self.a_check,
            &self.b_check,
            &self.a_time,
            &self.b_time,
            &self.c,
            &self.d,
            &self.reference,
            &self.sq,
            &self.mag,
        ]
        .iter()
        .map(|b| b.bytes)
        .sum()
    }
}

/// The epilogue's vectors on the device.
pub(crate) struct Vectors {
    pub(crate) bias: DevBuf,
    pub(crate) scale: DevBuf,
    pub(crate) tensor: DevBuf,
    /// B's tensor scale alone, in a buffer of its own for cuBLASLt's B_SCALE_POINTER: pointing
    /// it 4 bytes into `tensor` made every FP8 candidate return CUBLAS_STATUS_NOT_SUPPORTED at
    /// launch (H200, 2026-11-28), an alignment rule the heuristic does not see.
    pub(crate) tensor_b: DevBuf,
}

impl Vectors {
    fn new(ctx: &Arc<CudaContext>, workload: &Workload) -> Result<Vectors, CudaFailure> {
        let (bias, scale, tensor) = host_vectors(workload);
        let tensor_b = tensor.get(4..).unwrap_or_default();
        Ok(Vectors {
            bias: DevBuf::from_bytes(ctx, &bias)?,
            scale: DevBuf::from_bytes(ctx, &scale)?,
            tensor: DevBuf::from_bytes(ctx, &tensor)?,
            tensor_b: DevBuf::from_bytes(ctx, tensor_b)?,
        })
    }
}

/// The bytes of the epilogue's vectors for `workload` (empty where it has none): the bias in
/// the output type, the per-row scale and the tensor scales in f32, from the fixed values of
/// `tensortune_kernels::epilogue`.
pub(crate) fn host_vectors(workload: &Workload) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    // A convolution's rows are its output channels (its GEMM's D is column-major K x N*P*Q).
    let (rows, epi, output, input_scale) = match workload {
        Workload::Matmul(m) => (0..m.m, m.epilogue, m.types.output, m.input_scale),
        Workload::Conv2d(c) => (0..c.k, c.epilogue, c.types.output, InputScale::None),
    };
    let bias: Vec<u8> = if epi.bias {
        rows.clone()
            .flat_map(|r| {
                let v = epilogue::bias_value(r);
                match output {
                    DType::F16 => half::f16::from_f64(v).to_le_bytes().to_vec(),
                    DType::Bf16 => half::bf16::from_f64(v).to_le_bytes().to_vec(),
                    _ => (v as f32).to_le_bytes().to_vec(),
                }
            })
            .collect()
    } else {
        Vec::new()
    };
    let scale: Vec<u8> = if epi.scale {
        rows.flat_map(|r| (epilogue::scale_value(r) as f32).to_le_bytes()).collect()
    } else {
        Vec::new()
    };
    let tensor: Vec<u8> = if input_scale == InputScale::Tensor {
        epilogue::TENSOR_SCALES.iter().flat_map(|s| s.to_le_bytes()).collect()
    } else {
        Vec::new()
    };
    (bias, scale, tensor)
}

/// A generated kernel's tensor-map argument encoded over `ptr`, through the bundle crate's
/// encoder (the one a bundle's loader uses, so a measured kernel and an exported one get the
/// same maps).
fn encode(arg: &Arg, ptr: cudarc::driver::sys::CUdeviceptr) -> Result<KArg, CudaFailure> {
    match tensortune_bundle::encode_map(&crate::params::param(arg), ptr) {
        Ok(Some(map)) => Ok(KArg::Map(map)),
        Ok(None) => Ok(KArg::Ptr(ptr)),
        Err(tensortune_bundle::Error::Cuda { context, source }) => Err(CudaFailure::new(source, context)),
        Err(e) => Err(CudaFailure {
            code: cudarc::driver::sys::CUresult::CUDA_ERROR_INVALID_VALUE,
            context: format!("when encoding {arg:?}: {e}"),
        }),
    }
}

/// A kernel's scratch of `bytes` (zeroed, as kernels expect it), followed by an armed canary.
pub(crate) fn workspace(ctx: &Arc<CudaContext>, stream: &CudaStream, bytes: usize) -> Result<DevBuf, CudaFailure> {
    let buf = DevBuf::zeroed(ctx, stream, bytes + CANARY_BYTES)?;
    arm_canary(stream, buf.ptr + bytes as u64).when(|| "when arming a workspace's canary".into())?;
    Ok(buf)
}

/// What changed in the canary of a workspace of `bytes` (see [`workspace`]).
pub(crate) fn workspace_overrun(
    stream: &CudaStream,
    buf: &DevBuf,
    bytes: usize,
) -> Result<Option<Damage>, CudaFailure> {
    read_canary(stream, buf.ptr + bytes as u64)
}

/// Fills the [`CANARY_BYTES`] at `at` with the canary.
fn arm_canary(stream: &CudaStream, at: u64) -> Result<(), cudarc::driver::DriverError> {
    // SAFETY: every caller allocated CANARY_BYTES past the data that starts its buffer.
    unsafe { result::memset_d8_async(at, CANARY_BYTE, CANARY_BYTES, stream.cu_stream()) }
}

/// Reads the canary at `at` back (after the stream's work) and says what changed.
fn read_canary(stream: &CudaStream, at: u64) -> Result<Option<Damage>, CudaFailure> {
    stream.synchronize().when(|| "waiting for the stream".into())?;
    let mut bytes = vec![0u8; CANARY_BYTES];
    // SAFETY: CANARY_BYTES at `at` belong to the buffer (see `arm_canary`).
    unsafe { result::memcpy_dtoh_sync(&mut bytes, at) }.when(|| "reading a canary back".into())?;
    Ok(canary_damage(&bytes))
}

/// Where a canary was overwritten: the first changed byte's offset past the buffer's end, and
/// how many bytes changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Damage {
    pub(crate) first: usize,
    pub(crate) changed: usize,
}

/// What changed in a canary's bytes as read back; `None` when every byte is still the canary's.
pub(crate) fn canary_damage(bytes: &[u8]) -> Option<Damage> {
    let first = bytes.iter().position(|b| *b != CANARY_BYTE)?;
    let changed = bytes[first..].iter().filter(|b| **b != CANARY_BYTE).count();
    Some(Damage { first, changed })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_canary_names_the_first_changed_byte_and_counts_the_rest() {
        let mut bytes = vec![CANARY_BYTE; 4096];
        assert_eq!(canary_damage(&bytes), None);
        bytes[100..104].fill(0);
        bytes[2000] = 1;
        assert_eq!(canary_damage(&bytes), Some(Damage { first: 100, changed: 5 }));
    }
}
