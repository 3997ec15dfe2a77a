//! Conversions between wire messages and the validated domain types of `tensortune-kernels`.
//!
//! Every `TryFrom<pb::X>` validates: a workload that converts is a workload that passed
//! `Workload::validate`, and errors name the field (`workload.matmul.k`, ...).

use tensortune_kernels::status::Status;
use tensortune_kernels::target::Device;
use tensortune_kernels::workload::{Conv2d, Layout, Matmul, Types, Workload};
use tensortune_kernels::{DType, Error, Target};

use crate::pb;

/// A conversion failure: the field path and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {field}: {message}")]
pub struct FieldError {
    /// Dotted path of the field, e.g. `workloads[0].matmul.k`.
    pub field: String,
    /// What is wrong and what is allowed.
    pub message: String,
}

impl FieldError {
    /// An error for `field`.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        FieldError { field: field.into(), message: message.into() }
    }

    /// The same error with `prefix.` in front of the field path.
    pub fn within(self, prefix: &str) -> Self {
        FieldError { field: format!("{prefix}.{}", self.field), message: self.message }
    }

    fn from_kernels(prefix: &str, e: Error) -> Self {
        match e {
            Error::Invalid { field, message } => FieldError::new(format!("{prefix}.{field}"), message),
            other => FieldError::new(prefix, other.to_string()),
        }
    }
}

/// The wire enum of a dtype.
pub fn dtype_to_pb(d: DType) -> pb::Dtype {
    match d {
        DType::F16 => pb::Dtype::F16,
        DType::Bf16 => pb::Dtype::Bf16,
        DType::I8 => pb::Dtype::I8,
        DType::F32 => pb::Dtype::F32,
        DType::I32 => pb::Dtype::I32,
        DType::Tf32 => pb::Dtype::Tf32,
        DType::S4 => pb::Dtype::S4,
        DType::U4 => pb::Dtype::U4,
        DType::B1Xor => pb::Dtype::B1Xor,
        DType::B1And => pb::Dtype::B1And,
        DType::E4m3 => pb::Dtype::E4m3,
        DType::E5m2 => pb::Dtype::E5m2,
    }
}

/// A dtype from its wire value; `None` for unspecified.
pub fn dtype_from_pb(field: &str, v: i32) -> Result<Option<DType>, FieldError> {
    match pb::Dtype::try_from(v) {
        Ok(pb::Dtype::Unspecified) => Ok(None),
        Ok(pb::Dtype::F16) => Ok(Some(DType::F16)),
        Ok(pb::Dtype::Bf16) => Ok(Some(DType::Bf16)),
        Ok(pb::Dtype::I8) => Ok(Some(DType::I8)),
        Ok(pb::Dtype::F32) => Ok(Some(DType::F32)),
        Ok(pb::Dtype::I32) => Ok(Some(DType::I32)),
        Ok(pb::Dtype::Tf32) => Ok(Some(DType::Tf32)),
        Ok(pb::Dtype::S4) => Ok(Some(DType::S4)),
        Ok(pb::Dtype::U4) => Ok(Some(DType::U4)),
        Ok(pb::Dtype::B1Xor) => Ok(Some(DType::B1Xor)),
        Ok(pb::Dtype::B1And) => Ok(Some(DType::B1And)),
        Ok(pb::Dtype::E4m3) => Ok(Some(DType::E4m3)),
        Ok(pb::Dtype::E5m2) => Ok(Some(DType::E5m2)),
        Err(_) => Err(FieldError::new(
            field,
            format!(
                "unknown dtype value {v}; expected f16, bf16, i8, f32, i32, tf32, s4, u4, b1xor, b1and, e4m3 or e5m2"
            ),
        )),
    }
}

/// The wire enum of a layout.
pub fn layout_to_pb(l: Layout) -> pb::Layout {
    match l {
        Layout::Nn => pb::Layout::Nn,
        Layout::Nt => pb::Layout::Nt,
        Layout::Tn => pb::Layout::Tn,
        Layout::Tt => pb::Layout::Tt,
    }
}

fn layout_from_pb(v: i32) -> Result<Layout, FieldError> {
    match pb::Layout::try_from(v) {
        Ok(pb::Layout::Nn) => Ok(Layout::Nn),
        Ok(pb::Layout::Nt) => Ok(Layout::Nt),
        Ok(pb::Layout::Tn) => Ok(Layout::Tn),
        Ok(pb::Layout::Tt) => Ok(Layout::Tt),
        Ok(pb::Layout::Unspecified) => Err(FieldError::new("layout", "must be set to nn, nt, tn or tt")),
        Err(_) => Err(FieldError::new("layout", format!("unknown layout value {v}; expected nn, nt, tn or tt"))),
    }
}

fn types_from_pb(input: i32, accumulator: i32, output: i32) -> Result<Types, FieldError> {
    let input =
        dtype_from_pb("input", input)?.ok_or_else(|| FieldError::new("input", "must be set to f16, bf16 or i8"))?;
    let acc = dtype_from_pb("accumulator", accumulator)?;
    let out = dtype_from_pb("output", output)?;
    let acc = match acc {
        Some(a) => a,
        None => Types::default_for(input).map_err(|e| FieldError::from_kernels("", e).strip())?.accumulator,
    };
    Types::new(input, acc, out).map_err(|e| FieldError::from_kernels("", e).strip())
}

impl FieldError {
    fn strip(self) -> Self {
        FieldError { field: self.field.trim_start_matches('.').to_owned(), message: self.message }
    }
}

impl From<&Workload> for pb::Workload {
    fn from(w: &Workload) -> Self {
        let op = match w {
            Workload::Matmul(m) => pb::workload::Op::Matmul(pb::Matmul {
                m: m.m,
                n: m.n,
                k: m.k,
                layout: layout_to_pb(m.layout) as i32,
                input: dtype_to_pb(m.types.input) as i32,
                accumulator: dtype_to_pb(m.types.accumulator) as i32,
                output: dtype_to_pb(m.types.output) as i32,
                alpha: Some(m.alpha),
                beta: Some(m.beta),
                epilogue: if m.epilogue.is_none() { String::new() } else { m.epilogue.name() },
                input_scale: match m.input_scale {
                    tensortune_kernels::InputScale::None => String::new(),
                    s => s.name().to_string(),
                },
                batch: if m.batch == 1 { 0 } else { m.batch },
                groups: m.groups.iter().collect(),
            }),
            Workload::Conv2d(c) => pb::workload::Op::Conv2d(pb::Conv2d {
                n: c.n,
                h: c.h,
                w: c.w,
                c: c.c,
                k: c.k,
                r: c.r,
                s: c.s,
                pad_h: c.pad.0,
                pad_w: c.pad.1,
                stride_h: c.stride.0,
                stride_w: c.stride.1,
                dilation_h: c.dilation.0,
                dilation_w: c.dilation.1,
                input: dtype_to_pb(c.types.input) as i32,
                accumulator: dtype_to_pb(c.types.accumulator) as i32,
                output: dtype_to_pb(c.types.output) as i32,
                epilogue: if c.epilogue.is_none() { String::new() } else { c.epilogue.name() },
                residual: c.residual,
            }),
        };
        pb::Workload { op: Some(op) }
    }
}

impl TryFrom<&pb::Workload> for Workload {
    type Error = FieldError;

    fn try_from(w: &pb::Workload) -> Result<Self, FieldError> {
        let workload = match &w.op {
            None => return Err(FieldError::new("op", "must be a matmul or a conv2d")),
            Some(pb::workload::Op::Matmul(m)) => {
                let layout = layout_from_pb(m.layout).map_err(|e| e.within("matmul"))?;
                let types = types_from_pb(m.input, m.accumulator, m.output).map_err(|e| e.within("matmul"))?;
                let mm = Matmul {
                    m: m.m,
                    n: m.n,
                    k: m.k,
                    layout,
                    types,
                    alpha: m.alpha.unwrap_or(1.0),
                    beta: m.beta.unwrap_or(0.0),
                    epilogue: m.epilogue.parse().map_err(|e| FieldError::from_kernels("matmul", e))?,
                    input_scale: m.input_scale.parse().map_err(|e| FieldError::from_kernels("matmul", e))?,
                    batch: if m.batch == 0 { 1 } else { m.batch },
                    groups: if m.groups.is_empty() {
                        Default::default()
                    } else {
                        tensortune_kernels::grouped::Groups::new(&m.groups, tensortune_kernels::workload::MAX_DIM)
                            .map_err(|e| FieldError::from_kernels("matmul", e))?
                    },
                };
                mm.validate().map_err(|e| FieldError::from_kernels("matmul", e))?;
                Workload::Matmul(mm)
            }
            Some(pb::workload::Op::Conv2d(c)) => {
                let types = types_from_pb(c.input, c.accumulator, c.output).map_err(|e| e.within("conv2d"))?;
                let one = |v: u64| if v == 0 { 1 } else { v };
                let cv = Conv2d {
                    n: c.n,
                    h: c.h,
                    w: c.w,
                    c: c.c,
                    k: c.k,
                    r: c.r,
                    s: c.s,
                    pad: (c.pad_h, c.pad_w),
                    stride: (one(c.stride_h), one(c.stride_w)),
                    dilation: (one(c.dilation_h), one(c.dilation_w)),
                    types,
                    epilogue: c.epilogue.parse().map_err(|e| FieldError::from_kernels("conv2d", e))?,
                    residual: c.residual,
                };
                cv.validate().map_err(|e| FieldError::from_kernels("conv2d", e))?;
                Workload::Conv2d(cv)
            }
        };
        Ok(workload)
    }
}

impl TryFrom<pb::Workload> for Workload {
    type Error = FieldError;

    fn try_from(w: pb::Workload) -> Result<Self, FieldError> {
        Workload::try_from(&w)
    }
}

/// The validity-relevant part of a worker's device.
pub fn target_from_device(d: &pb::DeviceInfo) -> Result<Target, FieldError> {
    if d.class_key.is_empty() {
        return Err(FieldError::new("device.class_key", "must not be empty"));
    }
    if d.arch < 70 {
        return Err(FieldError::new(
            "device.arch",
            format!("sm_{} has no usable tensor cores; tensortune needs sm_70 or newer", d.arch),
        ));
    }
    for (field, v) in [
        ("device.sm_count", d.sm_count),
        ("device.max_threads_per_block", d.max_threads_per_block),
        ("device.max_smem_per_block", d.max_smem_per_block),
        ("device.smem_per_sm", d.smem_per_sm),
        ("device.regs_per_sm", d.regs_per_sm),
    ] {
        if v == 0 {
            return Err(FieldError::new(field, "must be positive"));
        }
    }
    Ok(Target {
        class_key: d.class_key.clone(),
        name: d.name.clone(),
        arch: d.arch,
        sm_count: d.sm_count,
        max_threads_per_block: d.max_threads_per_block,
        max_smem_per_block: d.max_smem_per_block,
        smem_per_sm: d.smem_per_sm,
        regs_per_sm: d.regs_per_sm,
        l2_bytes: d.l2_bytes,
    })
}

/// The device a worker registers: its limits (validated as [`target_from_device`] does) and its
/// provenance.
pub fn device_from_pb(d: &pb::DeviceInfo) -> Result<Device, FieldError> {
    Ok(Device {
        target: target_from_device(d)?,
        memory_bytes: d.memory_bytes,
        uuid: d.uuid.clone(),
        driver_version: d.driver_version.clone(),
        cuda_version: d.cuda_version.clone(),
        nvrtc_version: d.nvrtc_version.clone(),
        sm_clock_mhz: d.sm_clock_mhz,
        mem_clock_mhz: d.mem_clock_mhz,
    })
}

/// The `DeviceInfo` a worker sends for its device.
pub fn device_info(d: &Device) -> pb::DeviceInfo {
    pb::DeviceInfo {
        memory_bytes: d.memory_bytes,
        uuid: d.uuid.clone(),
        driver_version: d.driver_version.clone(),
        cuda_version: d.cuda_version.clone(),
        nvrtc_version: d.nvrtc_version.clone(),
        sm_clock_mhz: d.sm_clock_mhz,
        mem_clock_mhz: d.mem_clock_mhz,
        ..device_from_target(&d.target)
    }
}

/// A `DeviceInfo` carrying a target's limits (provenance fields left empty).
pub fn device_from_target(t: &Target) -> pb::DeviceInfo {
    pb::DeviceInfo {
        class_key: t.class_key.clone(),
        name: t.name.clone(),
        arch: t.arch,
        sm_count: t.sm_count,
        max_threads_per_block: t.max_threads_per_block,
        max_smem_per_block: t.max_smem_per_block,
        smem_per_sm: t.smem_per_sm,
        regs_per_sm: t.regs_per_sm,
        l2_bytes: t.l2_bytes,
        ..Default::default()
    }
}

impl From<Status> for pb::RecordStatus {
    fn from(s: Status) -> pb::RecordStatus {
        match s {
            Status::Ok => pb::RecordStatus::Ok,
            Status::InvalidConfig => pb::RecordStatus::InvalidConfig,
            Status::CompileError => pb::RecordStatus::CompileError,
            Status::LaunchError => pb::RecordStatus::LaunchError,
            Status::WrongResult => pb::RecordStatus::WrongResult,
            Status::Timeout => pb::RecordStatus::Timeout,
            Status::DeviceLost => pb::RecordStatus::DeviceLost,
        }
    }
}

/// The domain status of a wire status; `None` for `Unspecified` (a message that left it unset).
pub fn status_from_pb(s: pb::RecordStatus) -> Option<Status> {
    Status::ALL.into_iter().find(|d| pb::RecordStatus::from(*d) == s)
}

/// Lowercase status names used in tables, JSON and `status_counts` (`ok`, `compile_error`, ...):
/// [`Status::name`], and `unspecified` for a wire status left unset.
pub fn status_name(s: pb::RecordStatus) -> &'static str {
    status_from_pb(s).map_or("unspecified", Status::name)
}

/// The status called `name` (inverse of [`status_name`]).
pub fn status_from_name(name: &str) -> Option<pb::RecordStatus> {
    Status::from_name(name).map(pb::RecordStatus::from)
}

/// Lowercase job state names (`queued`, `running`, `done`, `cancelled`, `failed`).
pub fn job_state_name(s: pb::JobState) -> &'static str {
    match s {
        pb::JobState::Unspecified => "unspecified",
        pb::JobState::Queued => "queued",
        pb::JobState::Running => "running",
        pb::JobState::Done => "done",
        pb::JobState::Cancelled => "cancelled",
        pb::JobState::Failed => "failed",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matmul(k: u64) -> pb::Workload {
        pb::Workload {
            op: Some(pb::workload::Op::Matmul(pb::Matmul {
                m: 512,
                n: 64,
                k,
                layout: pb::Layout::Nn as i32,
                input: pb::Dtype::F16 as i32,
                ..Default::default()
            })),
        }
    }

    #[test]
    fn round_trip_and_defaults() {
        let w = Workload::try_from(&matmul(512)).unwrap();
        let Workload::Matmul(m) = w else { panic!() };
        assert_eq!((m.types.accumulator, m.types.output, m.alpha, m.beta), (DType::F32, DType::F32, 1.0, 0.0));
        let back = pb::Workload::from(&w);
        assert_eq!(Workload::try_from(&back).unwrap(), w);
        // Batched and grouped matmuls cross the wire whole; bad groups name the field.
        for key in [
            "matmul/b96m384n384k64/tn/f16,f32,f16/alpha=1,beta=0",
            "matmul/m128+4096n4096k4096/tn/bf16,f32,bf16/alpha=1,beta=0",
        ] {
            let w = Workload::from_key(key).unwrap();
            assert_eq!(Workload::try_from(&pb::Workload::from(&w)).unwrap(), w, "{key}");
        }
        let mut bad = matmul(64);
        if let Some(pb::workload::Op::Matmul(m)) = &mut bad.op {
            m.groups = vec![64];
        }
        assert_eq!(Workload::try_from(&bad).unwrap_err().field, "matmul.groups");
    }

    #[test]
    fn errors_name_the_field_path() {
        assert_eq!(Workload::try_from(&matmul(0)).unwrap_err().field, "matmul.k");
        let mut w = matmul(64);
        if let Some(pb::workload::Op::Matmul(m)) = &mut w.op {
            m.layout = 0;
        }
        assert_eq!(Workload::try_from(&w).unwrap_err().field, "matmul.layout");
        if let Some(pb::workload::Op::Matmul(m)) = &mut w.op {
            m.layout = 1;
            m.input = 99;
        }
        assert_eq!(Workload::try_from(&w).unwrap_err().field, "matmul.input");
        if let Some(pb::workload::Op::Matmul(m)) = &mut w.op {
            m.input = pb::Dtype::I8 as i32;
            m.accumulator = pb::Dtype::F32 as i32;
        }
        let e = Workload::try_from(&w).unwrap_err();
        assert_eq!(e.field, "matmul.accumulator");
        assert!(Workload::try_from(&pb::Workload { op: None }).unwrap_err().field == "op");
    }

    #[test]
    fn a_device_converts_to_the_wire_and_back() {
        let device = Device {
            target: Target::sm90(),
            memory_bytes: 141 << 30,
            uuid: "GPU-1".into(),
            driver_version: "580.1".into(),
            cuda_version: "13.0".into(),
            nvrtc_version: "13.0".into(),
            sm_clock_mhz: 1980,
            mem_clock_mhz: 3201,
        };
        assert_eq!(device_from_pb(&device_info(&device)).unwrap(), device);
        let mut info = device_info(&device);
        info.sm_count = 0;
        assert_eq!(device_from_pb(&info).unwrap_err().field, "device.sm_count");
    }

    #[test]
    fn every_status_converts_to_the_wire_and_back() {
        for s in Status::ALL {
            let wire = pb::RecordStatus::from(s);
            assert_eq!(status_from_pb(wire), Some(s));
            assert_eq!(status_name(wire), s.name());
            assert_eq!(status_from_name(s.name()), Some(wire));
        }
        assert_eq!(status_from_pb(pb::RecordStatus::Unspecified), None);
        assert_eq!(status_name(pb::RecordStatus::Unspecified), "unspecified");
        // Every wire value but Unspecified has a domain status.
        let wire: Vec<_> = (1..).map_while(|i| pb::RecordStatus::try_from(i).ok()).collect();
        assert_eq!(wire.len(), Status::ALL.len());
    }
}
