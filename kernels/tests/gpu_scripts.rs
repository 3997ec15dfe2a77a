//! The configs the GPU scripts run by hand are valid for their template on sm_90: the lab's input
//! files (`lab/inputs/*.txt`: `KEY CONFIG` lines of `wgmma_gemm` or `wgmma_conv2d`, by the
//! workload's op) and the compute-sanitizer cases of `scripts/gpu-check.sh sanitize`
//! (`scripts/sanitize-cases.txt`: `TEMPLATE KEY CONFIG` lines). A typo or a rule change shows here,
//! in CI, and not as a wasted call on the GPU. A `hot` file's vendor lines are checked against the
//! form `run_one`'s `TT_VENDOR` takes (the worker's `VendorAlgorithm`, which this crate cannot call).

use std::path::PathBuf;

use tensortune_kernels::wgmma::WgmmaGemm;
use tensortune_kernels::wgmma::conv::WgmmaConv2d;
use tensortune_kernels::{Config, Target, Template, Workload};

#[test]
fn the_lab_input_files_hold_valid_wgmma_configs() {
    let inputs = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../lab/inputs");
    let (mut checked, mut files) = (0, 0);
    for entry in std::fs::read_dir(&inputs).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "txt") {
            continue;
        }
        files += 1;
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&path).unwrap();
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
            let template: &dyn Template = if key.starts_with("matmul/") { &WgmmaGemm } else { &WgmmaConv2d };
            let c = Config::from_json(config).unwrap();
            template.check(&w, &c, &Target::sm90()).unwrap_or_else(|e| panic!("{file}: {line}: {e}"));
            checked += 1;
        }
    }
    assert!(files >= 20 && checked >= 100, "only {checked} lines in {files} files");
}

/// The compute-sanitizer cases of `gpu-check.sh sanitize` are valid configs of their template on
/// sm_90, so a rule change that drops one shows here rather than as a failed case on the GPU.
#[test]
fn the_sanitize_cases_are_valid_configs() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/sanitize-cases.txt");
    let text = std::fs::read_to_string(path).unwrap();
    let mut checked = std::collections::BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let mut parts = line.splitn(3, ' ');
        let (name, key, config) = (parts.next().unwrap(), parts.next().unwrap(), parts.next().unwrap());
        let template = tensortune_kernels::registry::by_name(name).unwrap();
        let w = Workload::from_key(key).unwrap();
        let c = Config::from_json(config).unwrap();
        template.check(&w, &c, &Target::sm90()).unwrap_or_else(|e| panic!("sanitize case {line}: {e}"));
        *checked.entry(name).or_insert(0) += 1;
    }
    assert!(checked.get("wgmma_gemm").is_some_and(|n| *n >= 10), "{checked:?}");
    assert!(checked.get("wgmma_conv2d").is_some_and(|n| *n >= 5), "{checked:?}");
    assert!(checked.contains_key("wmma_gemm"), "{checked:?}");
}
