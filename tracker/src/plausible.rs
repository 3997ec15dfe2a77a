//! Whether a reported time can be true. A worker that reports a kernel faster than the GPU can
//! run it (a bug, a broken timer, or a lie) must not make that kernel the best every client is
//! told to use: such a record is stored, marked untrusted with the reason, and never wins.
//!
//! Three checks, each with a wide margin so that no honest measurement trips it:
//! - **the device bound**: the workload's operations at the tensor cores' dense peak of the
//!   worker's architecture, at the higher of its reported clock and [`MAX_CLOCK_MHZ`];
//! - **the vendor time**: the same vendor kernel (cuBLAS/cuDNN) timed by other workers of the
//!   class for this workload; a report whose own vendor time is far below theirs timed nothing real;
//! - **the speedup**: over the vendor in the same run, more than [`SPEEDUP_MARGIN`] times the most
//!   any trusted record of the template has shown on the class (at least [`SPEEDUP_FLOOR`]).
//!   Only where the vendor kernel is a yardstick at all: a vendor time more than
//!   [`VENDOR_SLOW`] times what the device can do (its bound plus [`LATENCY_FLOOR_US`]) says
//!   nothing about how fast a kernel may be (cuDNN's i8 convolutions on the H200 took 194 us where
//!   honest kernels took 9 us, 2026-11-25), and the other two checks and the re-measurement of
//!   each winner on another worker still stand.

use tensortune_kernels::{DType, Workload};

use crate::model::Device;

/// A clock no current part's boost exceeds (H100/H200 boost 1980 MHz, B200 1965 MHz), used when a
/// worker reports a lower clock or none.
pub(crate) const MAX_CLOCK_MHZ: f64 = 2100.0;
/// A time this many times below the device bound is refused (the bound already takes the highest
/// clock and dense peak).
const BOUND_MARGIN: f64 = 1.25;
/// A vendor time this many times below the median of other workers' is refused.
const VENDOR_MARGIN: f64 = 2.0;
/// Other workers' vendor times needed before they judge a report's.
const VENDOR_QUORUM: usize = 3;
/// A speedup over the vendor this many times the template's record is refused...
pub(crate) const SPEEDUP_MARGIN: f64 = 1.5;
/// ...where the record is taken as at least this (the first reports of a template have none).
pub(crate) const SPEEDUP_FLOOR: f64 = 3.0;

/// A vendor time past this many times the least a kernel can take is no yardstick for speedups.
const VENDOR_SLOW: f64 = 10.0;
/// The least time of any kernel timed by graph replay on these GPUs, whatever its work: about
/// 2.8 us for cuBLAS's smallest GEMMs and 0.5 us for an empty kernel on an H200 (GPU.md).
const LATENCY_FLOOR_US: f64 = 2.0;

/// Dense tensor-core multiply-adds ×2 per SM per clock for an input type on an architecture, from
/// the vendors' datasheets (H100 SXM: 989 dense f16 TFLOP/s over 132 SMs at 1830 MHz = 4096).
/// Unknown newer architectures take twice Hopper's, which only loosens the check.
fn peak_flops_per_sm_clock(arch: u32, input: DType) -> f64 {
    let f16 = match arch {
        0..=69 => 256.0,   // no tensor cores: FMA peak, 128 lanes x 2
        70..=79 => 1024.0, // Volta, Turing
        80 => 2048.0,      // A100
        81..=89 => 1024.0, // Ampere consumer, Ada
        90..=99 => 4096.0, // Hopper
        _ => 8192.0,
    };
    match input {
        DType::I8 | DType::E4m3 | DType::E5m2 => f16 * 2.0,
        // Exact f32 runs on the CUDA cores: 128 FMA lanes per SM from Ampere on (64 before, so
        // this only loosens the check there); newer parts again take twice.
        DType::F32 => {
            if arch >= 100 {
                512.0
            } else {
                256.0
            }
        }
        DType::Tf32 | DType::I32 => f16 / 2.0,
        DType::F16 | DType::Bf16 => f16,
        // A100: int4 at twice i8, binary at 16 times f16; Hopper lists neither, so its bound
        // takes Ampere's ratios, which can only loosen the check.
        DType::S4 | DType::U4 => f16 * 4.0,
        DType::B1Xor | DType::B1And => f16 * 16.0,
    }
}

/// The least time, in microseconds, that `workload` can take on `device`.
pub(crate) fn device_bound_us(workload: &Workload, device: &Device) -> f64 {
    let t = &device.target;
    let clock_mhz = f64::from(device.sm_clock_mhz).max(MAX_CLOCK_MHZ);
    let peak = peak_flops_per_sm_clock(t.arch, workload.types().input) * f64::from(t.sm_count.max(1)) * clock_mhz * 1e6;
    workload.flops() / peak * 1e6
}

/// What other records say about a report, read from the store.
#[derive(Clone, Debug, Default)]
pub(crate) struct History {
    /// Trusted vendor times of this workload on this class from other workers.
    pub(crate) vendor_us: Vec<f64>,
    /// The highest speedup over the vendor of a trusted record of the template on the class.
    pub(crate) best_speedup: Option<f64>,
}

/// Why an ok measurement of `median_us` (vendor time `baseline_us` in the same run) cannot be
/// true, or `None` when it can. `sim` devices are skipped: their times come from a model.
pub(crate) fn judge(
    workload: &Workload,
    device: &Device,
    median_us: f64,
    baseline_us: Option<f64>,
    history: &History,
) -> Option<String> {
    if device.target.class_key == "sim" && device.uuid.starts_with("sim") {
        return None;
    }
    let bound = device_bound_us(workload, device);
    if median_us * BOUND_MARGIN < bound {
        return Some(format!(
            "implausible: {median_us:.3} us is below the device bound of {bound:.3} us ({} SMs of sm_{} at their \
             dense tensor-core peak)",
            device.target.sm_count, device.target.arch
        ));
    }
    if let Some(vendor) = baseline_us.filter(|v| *v > 0.0) {
        if history.vendor_us.len() >= VENDOR_QUORUM {
            let mut others = history.vendor_us.clone();
            others.sort_by(f64::total_cmp);
            let median = others[others.len() / 2];
            if vendor * VENDOR_MARGIN < median {
                return Some(format!(
                    "implausible: the vendor kernel took {vendor:.3} us in this run but {median:.3} us (median) on \
                     {} other workers of the class",
                    others.len()
                ));
            }
        }
        let speedup = vendor / median_us;
        let limit = history.best_speedup.unwrap_or(0.0).max(SPEEDUP_FLOOR) * SPEEDUP_MARGIN;
        let yardstick = vendor <= VENDOR_SLOW * (bound + LATENCY_FLOOR_US);
        if yardstick && speedup > limit {
            return Some(format!(
                "implausible: {speedup:.2}x the vendor kernel; no trusted record of this template has shown more \
                 than {:.2}x on the class",
                history.best_speedup.unwrap_or(0.0)
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use tensortune_kernels::{Layout, Matmul, Target, Types};

    use super::*;

    fn h200() -> Device {
        let target = Target { class_key: "nvidia-h200/sm90/132sm".into(), ..Target::sm90() };
        Device {
            target,
            memory_bytes: 141 << 30,
            uuid: "GPU-1".into(),
            driver_version: String::new(),
            cuda_version: String::new(),
            nvrtc_version: String::new(),
            sm_clock_mhz: 1980,
            mem_clock_mhz: 0,
        }
    }

    fn gemm(n: u64, input: DType) -> Workload {
        Workload::Matmul(Matmul::new(n, n, n, Layout::Tn, Types::default_for(input).unwrap()).unwrap())
    }

    #[test]
    fn the_device_bound_sits_below_measured_hopper_times() {
        // cuBLAS f16 4096^3 on the H200 measured 174 us (docs/BENCHMARKS.md): 790 TFLOP/s, which
        // must pass; the bound is the datasheet peak at the highest clock.
        let bound = device_bound_us(&gemm(4096, DType::F16), &h200());
        assert!(bound > 100.0 && bound < 174.0 / BOUND_MARGIN, "{bound}");
        // i8 runs twice as fast at peak.
        let i8 = device_bound_us(&gemm(4096, DType::I8), &h200());
        assert!((bound / i8 - 2.0).abs() < 1e-9);
    }

    #[test]
    fn honest_times_pass_and_impossible_ones_are_named() {
        let w = gemm(4096, DType::F16);
        let d = h200();
        assert_eq!(judge(&w, &d, 180.0, Some(174.0), &History::default()), None);
        let e = judge(&w, &d, 10.0, Some(174.0), &History::default()).unwrap();
        assert!(e.contains("below the device bound"), "{e}");
        // A vendor time far below what three other workers saw.
        let history = History { vendor_us: vec![170.0, 174.0, 180.0], best_speedup: Some(1.2) };
        let e = judge(&w, &d, 120.0, Some(60.0), &history).unwrap();
        assert!(e.contains("the vendor kernel took"), "{e}");
        // Fewer than the quorum: no judgement from vendor times.
        let few = History { vendor_us: vec![170.0], best_speedup: None };
        assert_eq!(judge(&w, &d, 170.0, Some(160.0), &few), None);
    }

    #[test]
    fn speedups_beyond_the_templates_record_are_refused() {
        // A small shape: the device bound says little, the speedup does.
        let w = gemm(256, DType::F16);
        let d = h200();
        let history = History { vendor_us: Vec::new(), best_speedup: Some(1.5) };
        assert_eq!(judge(&w, &d, 5.0, Some(7.0), &history), None);
        let e = judge(&w, &d, 1.0, Some(7.0), &history).unwrap();
        assert!(e.contains("7.00x the vendor"), "{e}");
        // A template that has shown 4x may show 5x.
        let strong = History { vendor_us: Vec::new(), best_speedup: Some(4.0) };
        assert_eq!(judge(&w, &d, 1.4, Some(7.0), &strong), None);
    }

    #[test]
    fn a_vendor_far_slower_than_the_device_is_no_yardstick() {
        // cuDNN's i8 1x1 convolution N=32 28x28 256->256 on the H200: 194 us, against 8.8 us for
        // honest kernels (2026-11-25); the device bound is about 1.5 us.
        let layer = Workload::Conv2d(tensortune_kernels::Conv2d {
            n: 32,
            h: 28,
            w: 28,
            c: 256,
            k: 256,
            r: 1,
            s: 1,
            pad: (0, 0),
            stride: (1, 1),
            dilation: (1, 1),
            types: Types::default_for(DType::I8).unwrap(),
            epilogue: Default::default(),
            residual: false,
        });
        let d = h200();
        assert_eq!(judge(&layer, &d, 8.8, Some(194.0), &History::default()), None);
        // The device bound still holds there.
        let e = judge(&layer, &d, 0.5, Some(194.0), &History::default()).unwrap();
        assert!(e.contains("below the device bound"), "{e}");
        // A vendor at the device's pace is a yardstick: 23x it is refused, on a small shape too.
        let e = judge(&gemm(256, DType::F16), &d, 0.3, Some(7.0), &History::default()).unwrap();
        assert!(e.contains("23.33x the vendor"), "{e}");
    }

    #[test]
    fn the_simulator_is_not_judged() {
        let sim = Device { target: Target::sim(), uuid: "sim-0".into(), ..h200() };
        assert_eq!(judge(&gemm(4096, DType::F16), &sim, 0.001, Some(100.0), &History::default()), None);
    }
}
