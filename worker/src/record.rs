//! What the worker tells the tracker: its device (`pb::DeviceInfo`) and its measurement records
//! (`pb::Measurement`), built from what the child said.

use tensortune_proto::{convert, pb};

use crate::protocol::{Device, MeasureOutcome};

/// How a task's kernel image was obtained.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Compile {
    /// NVRTC wall time spent for this task (0 when cached or nothing was compiled).
    pub(crate) ms: f64,
    /// Whether the image came from the cache.
    pub(crate) cache_hit: bool,
}

/// The device as the tracker sees it: the child's facts plus the daemon's NVRTC version.
pub(crate) fn device_info(facts: &Device, nvrtc_version: Option<String>) -> pb::DeviceInfo {
    let mut info = convert::device_info(facts);
    if let Some(version) = nvrtc_version {
        info.nvrtc_version = version;
    }
    info
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

/// The record of one task.
pub(crate) fn measurement(outcome: MeasureOutcome, compile: Compile, provenance: &pb::Provenance) -> pb::Measurement {
    pb::Measurement {
        status: pb::RecordStatus::from(outcome.status) as i32,
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
    use crate::protocol::Status;
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
            assert_eq!(status_name(pb::RecordStatus::from(s)), name);
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
