//! NVRTC compiles what `wgmma_gemm` emits for sm_90a, on the CPU: a sample of over 300 configs
//! spread over every type combination, every layout the instruction takes, a ragged shape and
//! every kind of config (producer, schedule, cluster, persistence). A serialized wgmma or an
//! ignored setmaxnreg (ptxas C7510/C7511/C7508) counts as a failure, as in the worker.

use tensortune_kernels::template::valid_configs;
use tensortune_kernels::wgmma::WgmmaGemm;
use tensortune_kernels::{Config, KernelSpec, Layout, Matmul, Target, Template, Types, Workload};

mod common;
use common::assert_all_compile;

fn kind(c: &Config) -> String {
    let name = |k| c.name(k).unwrap_or("").to_owned();
    let int = |k| c.int(k).unwrap_or(0);
    format!("{}/{}/{}/{}", name("producer"), name("schedule"), int("cluster"), int("persistent"))
}

/// `per` configs of each kind, evenly spaced over the kind's configs.
fn sample(valid: &[(u64, Config)], per: usize) -> Vec<Config> {
    let mut kinds: std::collections::BTreeMap<String, Vec<&Config>> = Default::default();
    for (_, c) in valid {
        kinds.entry(kind(c)).or_default().push(c);
    }
    let mut out = Vec::new();
    for group in kinds.values() {
        let step = (group.len() / per).max(1);
        out.extend(group.iter().skip(step / 2).step_by(step).take(per).map(|c| (*c).clone()));
    }
    out
}

#[test]
fn a_sample_of_wgmma_configs_compiles_for_sm90a() {
    let target = Target::sm90();
    let mut specs: Vec<KernelSpec> = Vec::new();
    for (input, acc, outs) in Types::SUPPORTED {
        for out in *outs {
            let types = Types::new(*input, *acc, Some(*out)).unwrap();
            for layout in Layout::ALL {
                for (m, n, k) in [(4096, 4096, 4096), (1000, 1000, 1000)] {
                    let mut mm = Matmul::new(m, n, k, layout, types).unwrap();
                    mm.beta = if m == 1000 { -1.0 } else { 0.0 };
                    let w = Workload::Matmul(mm);
                    let Ok(valid) = valid_configs(&WgmmaGemm, &w, &target) else { continue };
                    for c in sample(&valid, if m == 1000 { 1 } else { 2 }) {
                        specs.push(WgmmaGemm.generate(&w, &c, &target).unwrap());
                    }
                }
            }
        }
    }
    assert!(specs.len() >= 300, "only {} sampled configs", specs.len());
    assert_all_compile(&specs, &target);
}
