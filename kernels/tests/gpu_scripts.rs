//! The configs the GPU check script runs by hand (`scripts/ab-wgmma-*.txt` and `ab-wconv-*.txt`
//! for the current versions, `diag-*.txt`, `instmix-*.txt`, `hot-*.txt`) are valid for their
//! template on sm_90: a typo or a rule change shows here, in CI, and not as a wasted call on the
//! GPU. A `hot` file's vendor lines are checked against the form `run_one`'s `TT_VENDOR` takes
//! (the worker's `VendorAlgorithm`, which this crate cannot call).

use std::path::PathBuf;

use tensortune_kernels::wgmma::WgmmaGemm;
use tensortune_kernels::wgmma::conv::WgmmaConv2d;
use tensortune_kernels::{Config, Target, Template, Workload};

#[test]
fn the_a_b_files_of_the_current_wgmma_version_hold_valid_configs() {
    let scripts = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts");
    let mut checked = 0;
    let files: [(&str, &dyn Template); 40] = [
        ("ab-wgmma-7.txt", &WgmmaGemm),
        ("ab-wconv-7.txt", &WgmmaConv2d),
        ("ab-wgmma-split.txt", &WgmmaGemm),
        ("ab-wconv-split.txt", &WgmmaConv2d),
        ("ab-wgmma-6.txt", &WgmmaGemm),
        ("ab-wgmma-sustain.txt", &WgmmaGemm),
        ("ab-wgmma-160.txt", &WgmmaGemm),
        ("ab-wgmma-resident.txt", &WgmmaGemm),
        ("ab-wconv-resident.txt", &WgmmaConv2d),
        ("ab-wconv-pointwise-stages.txt", &WgmmaConv2d),
        ("diag-large.txt", &WgmmaGemm),
        ("diag-l2.txt", &WgmmaGemm),
        ("ab-wgmma-8.txt", &WgmmaGemm),
        ("ab-wgmma-pairs.txt", &WgmmaGemm),
        ("ab-wgmma-10.txt", &WgmmaGemm),
        ("ab-wgmma-sustain-14336.txt", &WgmmaGemm),
        ("diag-stream-k.txt", &WgmmaGemm),
        ("diag-14336.txt", &WgmmaGemm),
        ("diag-14336-clock.txt", &WgmmaGemm),
        ("instmix-14336.txt", &WgmmaGemm),
        ("hot-14336.txt", &WgmmaGemm),
        ("hot-raster.txt", &WgmmaGemm),
        ("diag-raster.txt", &WgmmaGemm),
        ("hot-14336-knobs.txt", &WgmmaGemm),
        ("hot-14336-tn.txt", &WgmmaGemm),
        ("hot-conv.txt", &WgmmaConv2d),
        ("diag-conv-energy.txt", &WgmmaConv2d),
        ("diag-14336-cluster.txt", &WgmmaGemm),
        ("ab-wgmma-sustain-pick.txt", &WgmmaGemm),
        ("hot-longk.txt", &WgmmaGemm),
        ("hot-sk.txt", &WgmmaGemm),
        ("diag-longk.txt", &WgmmaGemm),
        ("hot-splitpairs.txt", &WgmmaGemm),
        ("hot-sk-aligned.txt", &WgmmaGemm),
        ("hot-cluster-sync.txt", &WgmmaConv2d),
        ("hot-cluster-tail.txt", &WgmmaConv2d),
        ("hot-cluster-tail-14336.txt", &WgmmaGemm),
        ("hot-syncwarp.txt", &WgmmaConv2d),
        ("hot-nomc.txt", &WgmmaConv2d),
        ("hot-tiles.txt", &WgmmaConv2d),
    ];
    for (file, template) in files {
        let text = std::fs::read_to_string(scripts.join(file)).unwrap();
        for line in text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
            let (key, config) = line.split_once(' ').unwrap();
            // A `hot` file's vendor lines end with the algorithm to time: fastest, or for a
            // matmul gemmex or lt:N.
            let config = match config.rsplit_once(' ') {
                Some((config, vendor)) if !vendor.ends_with('}') => {
                    let lt = vendor.strip_prefix("lt:").and_then(|n| n.parse::<usize>().ok());
                    let cublas = vendor == "gemmex" || lt.is_some_and(|n| (1..=8).contains(&n));
                    assert!(
                        vendor == "fastest" || (cublas && key.starts_with("matmul/")),
                        "{file}: {line}: vendor {vendor}"
                    );
                    config
                }
                _ => config,
            };
            let w = Workload::from_key(key).unwrap();
            let c = Config::from_json(config).unwrap();
            template.check(&w, &c, &Target::sm90()).unwrap_or_else(|e| panic!("{file}: {line}: {e}"));
            checked += 1;
        }
    }
    assert!(checked >= 140, "only {checked} lines");
}

/// The compute-sanitizer cases of `gpu-check.sh wsanitize` (single-quoted `KEY CONFIG` lines of
/// its `cases` array) are valid `wgmma_gemm` configs on sm_90, so a rule change that drops one
/// shows here rather than as a failed case on the GPU.
#[test]
fn the_wsanitize_cases_are_valid_wgmma_configs() {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/gpu-check.sh");
    let text = std::fs::read_to_string(script).unwrap();
    let body = text.split("step_wsanitize() {").nth(1).expect("gpu-check.sh has step_wsanitize");
    let cases = body.split("\n  )").next().unwrap();
    let mut checked = 0;
    for line in cases.lines().map(str::trim).filter(|l| l.starts_with("'matmul/")) {
        let (key, config) = line.trim_matches('\'').split_once(' ').unwrap();
        let w = Workload::from_key(key).unwrap();
        let c = Config::from_json(config).unwrap();
        WgmmaGemm.check(&w, &c, &Target::sm90()).unwrap_or_else(|e| panic!("wsanitize case {line}: {e}"));
        checked += 1;
    }
    assert!(checked >= 10, "found only {checked} wsanitize cases");
}
