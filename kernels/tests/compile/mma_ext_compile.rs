//! NVRTC compiles what `mma_ext_gemm` emits for sm_80 and sm_90, on the CPU: tf32 in every
//! layout and the packed s4, u4, b1xor and b1and in tn, on the suite's shapes (1024^3, 4096^3,
//! 512x64x4096) and a ragged one with beta = 1, a spread of valid configs each. None may spill
//! (ptxas's `--warn-on-spills`). That sm_90 compiles the sub-byte mma.sync is what this test
//! shows for Hopper; whether it runs at speed there is the GPU check's question.

use tensortune_kernels::ext::MmaExtGemm;
use tensortune_kernels::template::valid_configs;
use tensortune_kernels::{DType, KernelSpec, Layout, Matmul, Template, Types, Workload};

use crate::common::{InTurn, assert_all_compile_without_spills};

const PER_WORKLOAD: usize = 3;

#[test]
fn a_sample_of_mma_ext_configs_compiles_without_spills_for_sm80_and_sm90() {
    let mut workloads = Vec::new();
    for layout in Layout::ALL {
        for (m, n, k, beta) in [(1024, 1024, 1024, 0.0), (4096, 4096, 4096, 0.0), (1000, 72, 260, 1.0)] {
            workloads.push((DType::Tf32, layout, m, n, k, beta));
        }
    }
    for input in [DType::S4, DType::U4, DType::B1Xor, DType::B1And] {
        for (m, n, k, beta) in [(4096, 4096, 4096, 0.0), (512, 64, 4096, 0.0), (1000, 72, 1024, 1.0)] {
            workloads.push((input, Layout::Tn, m, n, k, beta));
        }
    }
    let mut turns = InTurn::new();
    for (turn, (input, layout, m, n, k, beta)) in workloads.into_iter().enumerate() {
        let mut mm = Matmul::new(m, n, k, layout, Types::default_for(input).unwrap()).unwrap();
        mm.beta = beta;
        let w = Workload::Matmul(mm);
        let target = turns.target();
        let valid = valid_configs(&MmaExtGemm, &w, &target).unwrap();
        assert!(valid.len() >= PER_WORKLOAD, "{}: {} valid configs", w.key(), valid.len());
        let step = valid.len() / PER_WORKLOAD;
        let specs: Vec<KernelSpec> = (0..PER_WORKLOAD)
            .map(|j| MmaExtGemm.generate(&w, &valid[j * step + turn % step].1, &target).unwrap())
            .collect();
        turns.add(specs);
    }
    for (target, specs) in turns.each(35) {
        assert_all_compile_without_spills(specs, target);
    }
}
