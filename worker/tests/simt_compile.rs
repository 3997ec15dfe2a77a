//! NVRTC compiles what `simt_gemm` emits for sm_80 and sm_90, on the CPU: a spread over the valid
//! configs of the suite's f32 shapes (1024^3 and 4096^3) in every layout, plus a ragged shape with
//! beta = 1. None may spill registers to local memory (ptxas's `--warn-on-spills`).

use tensortune_kernels::simt::SimtGemm;
use tensortune_kernels::template::valid_configs;
use tensortune_kernels::{DType, KernelSpec, Layout, Matmul, Target, Template, Types, Workload};

mod common;
use common::{assert_all_compile, spills};

/// Every `valid.len() / per`-th valid config, from a start that differs per workload.
fn sampled(w: &Workload, target: &Target, per: usize, turn: usize) -> Vec<KernelSpec> {
    let valid = valid_configs(&SimtGemm, w, target).unwrap();
    assert!(valid.len() >= per, "{}: {} valid configs", w.key(), valid.len());
    let step = valid.len() / per;
    (0..per).map(|j| SimtGemm.generate(w, &valid[j * step + turn % step].1, target).unwrap()).collect()
}

#[test]
fn a_sample_of_simt_configs_compiles_without_spills_for_sm80_and_sm90() {
    let types = Types::default_for(DType::F32).unwrap();
    for target in [Target::sm80(), Target::sm90()] {
        let mut specs = Vec::new();
        let mut turn = 0;
        for layout in Layout::ALL {
            for (m, n, k, beta) in [(1024, 1024, 1024, 0.0), (4096, 4096, 4096, 0.0), (1000, 72, 260, 1.0)] {
                let mut mm = Matmul::new(m, n, k, layout, types).unwrap();
                mm.beta = beta;
                specs.extend(sampled(&Workload::Matmul(mm), &target, 8, turn));
                turn += 1;
            }
        }
        assert!(specs.len() >= 90, "only {} sampled kernels", specs.len());
        assert_all_compile(&specs, &target);
        let spilled = spills(&specs, &target.nvrtc_arch());
        assert!(spilled.is_empty(), "{} kernels spill:\n{}", spilled.len(), spilled.join("\n"));
    }
}
