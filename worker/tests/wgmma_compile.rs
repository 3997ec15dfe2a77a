//! NVRTC compiles what `wgmma_gemm` emits for sm_90a, on the CPU: a sample of over 300 configs
//! spread over every type combination, every layout the instruction takes, a ragged shape and
//! every kind of config (producer, schedule, cluster, persistence, stream-K, epilogue). A serialized
//! wgmma or an ignored setmaxnreg (ptxas C7510/C7511/C7508/C7514) counts as a failure, as in the
//! worker.

use tensortune_kernels::template::valid_configs;
use tensortune_kernels::wgmma::WgmmaGemm;
use tensortune_kernels::{Config, KernelSpec, Layout, Matmul, Target, Template, Types, Workload};

mod common;
use common::{assert_all_compile, wgmma_kind as kind};

/// One config from every `every`-th kind (in kind order, starting at `turn % every`), from the
/// middle of the kind's configs: successive workloads take turns, so every kind is compiled on a
/// third of the workloads and CI compiles a few hundred kernels, not a thousand.
fn sample(valid: &[(u64, Config)], turn: usize, every: usize) -> Vec<Config> {
    let mut kinds: std::collections::BTreeMap<String, Vec<&Config>> = Default::default();
    for (_, c) in valid {
        kinds.entry(kind(c)).or_default().push(c);
    }
    kinds.values().skip(turn % every).step_by(every).map(|group| group[group.len() / 2].clone()).collect()
}

#[test]
fn a_sample_of_wgmma_configs_compiles_for_sm90a() {
    let target = Target::sm90();
    let mut specs: Vec<KernelSpec> = Vec::new();
    let mut kinds_seen = std::collections::BTreeSet::new();
    let mut turn = 0;
    for (input, acc, outs) in Types::SUPPORTED {
        for out in *outs {
            let types = Types::new(*input, *acc, Some(*out)).unwrap();
            for layout in Layout::ALL {
                for (m, n, k) in [(4096, 4096, 4096), (1000, 1000, 1000)] {
                    // Packed types exist in tn only (and wgmma_gemm refuses them below).
                    let Ok(mut mm) = Matmul::new(m, n, k, layout, types) else { continue };
                    mm.beta = if m == 1000 { -1.0 } else { 0.0 };
                    let w = Workload::Matmul(mm);
                    let Ok(valid) = valid_configs(&WgmmaGemm, &w, &target) else { continue };
                    for c in sample(&valid, turn, 3) {
                        kinds_seen.insert(kind(&c));
                        specs.push(WgmmaGemm.generate(&w, &c, &target).unwrap());
                    }
                    turn += 1;
                }
            }
        }
    }
    eprintln!("{} sampled configs of {} kinds", specs.len(), kinds_seen.len());
    assert!(specs.len() >= 300, "only {} sampled configs", specs.len());
    // Every kind of code path: producer x schedule x cluster x persistence x stream-K x epilogue
    // (what the rules allow: ping-pong needs a producer warpgroup, stream-K a persistent
    // cooperative grid).
    assert!(kinds_seen.len() >= 30, "only {} kinds of config: {kinds_seen:?}", kinds_seen.len());
    assert_all_compile(&specs, &target);
}
