//! The self-test's new paths on `cuda:0`, marked `#[ignore = "needs a GPU"]` (scripts/gpu-check.sh
//! gputests runs them): FP8 and fused-epilogue matmuls on `wgmma_gemm` and the fused conv layers
//! of the self-test's matrix on `wgmma_conv2d`, every output element against the f64 reference,
//! the vendor beside each. (NVRTC compiles the same paths on the CPU in kernels/tests/compile.)

use tensortune_kernels::Workload;

/// The FP8 and fused-epilogue matmuls that kernels/tests/compile compiles (one file for both).
fn fused_keys() -> Vec<&'static str> {
    include_str!("../../../kernels/tests/data/fused-keys.txt")
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect()
}

/// Three configs of each of `keys` on `template`, on `cuda:0`, every output element against the
/// f64 reference; prints each kernel and asserts that all ran, none was skipped and none failed.
pub(crate) fn self_test_on_gpu(template: &str, keys: &[&str]) -> tensortune_worker::selftest::Report {
    use tensortune_worker::DeviceSpec;
    use tensortune_worker::selftest::{self, Selection};
    let selection = Selection {
        template: Some(template.into()),
        workloads: keys.iter().map(|k| Workload::from_key(k).unwrap()).collect(),
        configs: 3,
        ..Selection::default()
    };
    let report = selftest::run(&selection, &DeviceSpec::Cuda(0), &mut |_| {}).unwrap();
    eprintln!("device {}", report.device.target.name);
    for c in &report.checks {
        eprintln!(
            "{:<14} {:>10.2} us  vendor {:>10.2} us  max_abs {:>9.2e}  {}  {}  {} {}",
            format!("{:?}", c.status),
            c.median_us,
            c.baseline_us.unwrap_or(f64::NAN),
            c.max_abs_err.unwrap_or(f64::NAN),
            c.workload,
            c.config,
            c.baseline_kind,
            c.error.chars().take(400).collect::<String>()
        );
    }
    assert!(report.verified, "outputs were checked on a GPU");
    assert!(report.skipped.is_empty(), "skipped: {:?}", report.skipped);
    assert_eq!(report.failed(), 0, "{} kernels failed", report.failed());
    assert!(report.ok() >= 2 * keys.len(), "only {} kernels ran", report.ok());
    report
}

/// On a GPU: three configs of each workload of [`KEYS`], every output element against the f64
/// reference (which applies the same epilogue), and cuBLASLt's time beside each, its output
/// checked too. `<this test binary> --ignored --nocapture gpu_selftest::` on a GPU machine.
#[test]
#[ignore = "needs a GPU"]
fn fp8_and_fused_epilogue_kernels_pass_every_element_on_the_gpu() {
    let report = self_test_on_gpu("wgmma_gemm", &fused_keys());
    for c in &report.checks {
        // cuBLASLt has no e5m2 x e5m2 FP8 matmul: those have no vendor time, and say so.
        if c.workload.contains("/e5m2,") {
            assert!(c.baseline_kind.contains("no e5m2 x e5m2"), "{}: {}", c.workload, c.baseline_kind);
            continue;
        }
        assert!(c.baseline_us.is_some(), "{}: no vendor baseline ({})", c.workload, c.baseline_kind);
        assert!(!c.baseline_kind.contains("failed our check"), "{}: {}", c.workload, c.baseline_kind);
    }
}

/// On a GPU: three configs of each conv epilogue layer of the self-test's matrix, every element
/// checked, and cuDNN beside each: its fused convolution-bias-activation where it has the
/// epilogue (a bias, then ReLU or none, the residual as z), else its convolution and an
/// elementwise kernel, the kind saying which. `--ignored --nocapture gpu_selftest::` there.
#[test]
#[ignore = "needs a GPU"]
fn fused_conv_epilogues_pass_every_element_on_the_gpu() {
    let keys: Vec<String> = tensortune_worker::selftest::matrix()
        .iter()
        .filter(|w| matches!(w, Workload::Conv2d(c) if c.fused()))
        .map(|w| w.key())
        .collect();
    assert!(keys.len() >= 6, "{keys:?}");
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let report = self_test_on_gpu("wgmma_conv2d", &refs);
    for c in &report.checks {
        let (k, fused) = (&c.baseline_kind, c.baseline_kind.starts_with("cudnnConvolutionBiasActivationForward"));
        assert!(c.baseline_us.is_some() && !k.contains("failed our check"), "{}: {k}", c.workload);
        assert!(fused || k.contains("tt_epilogue elementwise kernel (unfused"), "{}: {k}", c.workload);
    }
}
