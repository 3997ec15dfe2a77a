//! What the worker tells the tracker: its device (`pb::DeviceInfo`) and its measurement records
//! (`pb::Measurement`), built from what the child said.

use tensortune_proto::pb;

use crate::protocol::{DeviceFacts, MeasureOutcome, Status};

/// How a task's kernel image was obtained.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Compile {
    /// NVRTC wall time spent for this task (0 when cached or nothing was compiled).
    pub(crate) ms: f64,
    /// Whether the image came from the cache.
    pub(crate) cache_hit: bool,
}

/// The device as the tracker sees it: the child's facts plus the daemon's NVRTC version.
pub(crate) fn device_info(facts: &DeviceFacts, nvrtc_version: Option<String>) -> pb::DeviceInfo {
    pb::DeviceInfo {
        class_key: facts.class_key.clone(),
        name: facts.name.clone(),
        arch: facts.arch,
        sm_count: facts.sm_count,
        max_threads_per_block: facts.max_threads_per_block,
        max_smem_per_block: facts.max_smem_per_block,
        smem_per_sm: facts.smem_per_sm,
        regs_per_sm: facts.regs_per_sm,
        l2_bytes: facts.l2_bytes,
        memory_bytes: facts.memory_bytes,
        uuid: facts.uuid.clone(),
        driver_version: facts.driver_version.clone(),
        cuda_version: facts.cuda_version.clone(),
        nvrtc_version: nvrtc_version.unwrap_or_default(),
        sm_clock_mhz: facts.sm_clock_mhz,
        mem_clock_mhz: facts.mem_clock_mhz,
    }
}

/// Provenance shared by every record of a worker run (the SM clock is filled per record).
pub(crate) fn provenance(worker_name: &str, device: &pb::DeviceInfo) -> pb::Provenance {
    pb::Provenance {
        worker_name: worker_name.to_owned(),
        gpu_name: device.name.clone(),
        gpu_uuid: device.uuid.clone(),
        driver_version: device.driver_version.clone(),
        cuda_version: device.cuda_version.clone(),
        nvrtc_version: device.nvrtc_version.clone(),
        sm_clock_mhz: 0,
    }
}

/// The wire status of an outcome.
pub(crate) fn status_to_pb(status: Status) -> pb::RecordStatus {
    match status {
        Status::Ok => pb::RecordStatus::Ok,
        Status::InvalidConfig => pb::RecordStatus::InvalidConfig,
        Status::CompileError => pb::RecordStatus::CompileError,
        Status::LaunchError => pb::RecordStatus::LaunchError,
        Status::WrongResult => pb::RecordStatus::WrongResult,
        Status::Timeout => pb::RecordStatus::Timeout,
        Status::DeviceLost => pb::RecordStatus::DeviceLost,
    }
}

/// The record of one task.
pub(crate) fn measurement(outcome: MeasureOutcome, compile: Compile, provenance: &pb::Provenance) -> pb::Measurement {
    pb::Measurement {
        status: status_to_pb(outcome.status) as i32,
        error: outcome.error,
        compile_ms: compile.ms,
        measure_ms: outcome.measure_ms,
        samples_us: outcome.samples_us,
        median_us: outcome.median_us,
        spread: outcome.spread,
        batch: outcome.batch,
        baseline_us: outcome.baseline_us,
        baseline_kind: outcome.baseline_kind,
        max_abs_err: outcome.max_abs_err,
        max_rel_err: outcome.max_rel_err,
        provenance: Some(pb::Provenance { sm_clock_mhz: outcome.sm_clock_mhz, ..provenance.clone() }),
        cache_hit: compile.cache_hit,
        registers: outcome.registers,
        smem_bytes: outcome.smem_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Executor as _;
    use crate::sim::SimExecutor;
    use tensortune_proto::convert::status_name;

    #[test]
    fn statuses_map_to_the_same_names() {
        for (s, name) in [
            (Status::Ok, "ok"),
            (Status::InvalidConfig, "invalid_config"),
            (Status::CompileError, "compile_error"),
            (Status::LaunchError, "launch_error"),
            (Status::WrongResult, "wrong_result"),
            (Status::Timeout, "timeout"),
            (Status::DeviceLost, "device_lost"),
        ] {
            assert_eq!(status_name(status_to_pb(s)), name);
            assert_eq!(serde_json::to_string(&s).unwrap(), format!("\"{name}\""));
        }
    }

    #[test]
    fn records_carry_provenance_and_compile_facts() {
        let device = device_info(&SimExecutor::new(Vec::new()).facts(), Some("13.0".into()));
        assert_eq!((device.class_key.as_str(), device.uuid.as_str()), ("sim", "sim-0"));
        let p = provenance("box/sim", &device);
        let mut outcome = MeasureOutcome::failed(Status::Timeout, "too slow");
        outcome.sm_clock_mhz = 1980;
        let m = measurement(outcome, Compile { ms: 12.5, cache_hit: false }, &p);
        assert_eq!((m.status(), m.error.as_str(), m.compile_ms), (pb::RecordStatus::Timeout, "too slow", 12.5));
        let prov = m.provenance.unwrap();
        assert_eq!(
            (prov.worker_name.as_str(), prov.nvrtc_version.as_str(), prov.sm_clock_mhz),
            ("box/sim", "13.0", 1980)
        );
    }
}
