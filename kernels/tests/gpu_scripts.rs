//! The configs the GPU check script runs by hand (`scripts/ab-wgmma-*.txt` for the current
//! version) are valid for `wgmma_gemm` on sm_90: a typo or a rule change shows here, in CI, and
//! not as a wasted call on the GPU.

use std::path::PathBuf;

use tensortune_kernels::wgmma::WgmmaGemm;
use tensortune_kernels::{Config, Target, Template, Workload};

#[test]
fn the_a_b_files_of_the_current_wgmma_version_hold_valid_configs() {
    let scripts = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts");
    let mut checked = 0;
    for file in ["ab-wgmma-6.txt", "ab-wgmma-160.txt"] {
        let text = std::fs::read_to_string(scripts.join(file)).unwrap();
        for line in text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
            let (key, config) = line.split_once(' ').unwrap();
            let w = Workload::from_key(key).unwrap();
            let c = Config::from_json(config).unwrap();
            WgmmaGemm.check(&w, &c, &Target::sm90()).unwrap_or_else(|e| panic!("{file}: {line}: {e}"));
            checked += 1;
        }
    }
    assert!(checked >= 18, "only {checked} lines");
}
