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

/// Joins a vendor kind and the algorithm the library says it ran (`describe`d), as the child
/// carries them in one text (`kind [algorithm]`), so that the algorithm goes wherever the kind
/// goes (the child's and the daemon's baselines, a finalist's rounds); [`split_vendor_algo`]
/// parts them into the record's two fields. Text may follow (the compute type of an f32 GEMM).
pub(crate) fn with_vendor_algo(kind: &str, algo: &str) -> String {
    if algo.is_empty() { kind.to_owned() } else { format!("{kind} [{algo}]") }
}

/// A vendor kind made by [`with_vendor_algo`] parted into (kind, algorithm); a kind without an
/// algorithm gives an empty one.
pub(crate) fn split_vendor_algo(text: &str) -> (String, String) {
    let Some(open) = text.find(" [") else { return (text.to_owned(), String::new()) };
    let Some(len) = text[open + 2..].find(']') else { return (text.to_owned(), String::new()) };
    let algo = text[open + 2..open + 2 + len].to_owned();
    let kind = format!("{}{}", &text[..open], &text[open + 2 + len + 1..]);
    (kind, algo)
}

/// The record of one task.
pub(crate) fn measurement(outcome: MeasureOutcome, compile: Compile, provenance: &pb::Provenance) -> pb::Measurement {
    let (baseline_kind, vendor_algo) = split_vendor_algo(&outcome.baseline_kind);
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
        baseline_kind,
        max_abs_err: outcome.max_abs_err,
        max_rel_err: outcome.max_rel_err,
        provenance: Some(pb::Provenance { sm_clock_mhz: outcome.sm_clock_mhz, ..provenance.clone() }),
        cache_hit: compile.cache_hit,
        registers: outcome.registers,
        smem_bytes: outcome.smem_bytes,
        vendor_algo,
        energy_mj: outcome.power.energy_mj,
        power_w: outcome.power.power_w,
        mean_clock_mhz: outcome.power.mean_clock_mhz,
        temperature_c: outcome.power.temperature_c,
        regime: outcome.regime.name().to_owned(),
        settle_ms: outcome.settle_ms,
        steady: outcome.steady,
        baseline_energy_mj: outcome.baseline_energy_mj,
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
    fn the_vendor_algorithm_rides_with_its_kind_and_parts_from_it_in_the_record() {
        let algo = "algo=66 tile=128x64x64 stages=4 cluster=1x1x1 splitk=1 swizzle=0";
        let kind = with_vendor_algo("cublasLt heuristic #2 of 8", algo);
        assert_eq!(split_vendor_algo(&kind), ("cublasLt heuristic #2 of 8".into(), algo.into()));
        // Text after it (an f32 GEMM's compute type) stays with the kind.
        let f32 = format!("{kind} CUBLAS_COMPUTE_32F");
        assert_eq!(split_vendor_algo(&f32), ("cublasLt heuristic #2 of 8 CUBLAS_COMPUTE_32F".into(), algo.into()));
        for plain in ["cublasGemmEx", "cudnnConvolutionForward IMPLICIT_PRECOMP_GEMM (tensor-op), x", "", "odd [open"] {
            assert_eq!(split_vendor_algo(plain), (plain.to_string(), String::new()));
            assert_eq!(with_vendor_algo(plain, ""), plain);
        }
        let mut outcome = MeasureOutcome::failed(Status::Ok, "");
        outcome.baseline_kind = kind;
        let m = measurement(outcome, Compile::default(), &pb::Provenance::default());
        assert_eq!((m.baseline_kind.as_str(), m.vendor_algo.as_str()), ("cublasLt heuristic #2 of 8", algo));
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

    #[test]
    fn records_carry_energy_and_regime_and_unknown_stays_unset() {
        let mut outcome = MeasureOutcome::failed(Status::Ok, "");
        outcome.power = crate::energy::Power {
            energy_mj: Some(11.1),
            power_w: Some(650.0),
            mean_clock_mhz: Some(1755.0),
            temperature_c: None,
        };
        (outcome.regime, outcome.settle_ms, outcome.steady) =
            (tensortune_kernels::energy::Regime::Sustained, 4200.0, false);
        let m = measurement(outcome, Compile::default(), &pb::Provenance::default());
        assert_eq!(
            (m.energy_mj, m.power_w, m.mean_clock_mhz, m.temperature_c),
            (Some(11.1), Some(650.0), Some(1755.0), None)
        );
        assert_eq!((m.regime.as_str(), m.settle_ms, m.steady), ("sustained", 4200.0, false));
        let plain = measurement(MeasureOutcome::failed(Status::Ok, ""), Compile::default(), &pb::Provenance::default());
        assert_eq!(
            (plain.energy_mj, plain.baseline_energy_mj, plain.regime.as_str(), plain.steady),
            (None, None, "burst", true)
        );
    }
}
