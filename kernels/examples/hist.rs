//! Histogram of the valid configs of a workload per knob value: `hist KEY [sm_80]`.
use std::collections::BTreeMap;
use tensortune_kernels::*;
fn main() {
    let a: Vec<String> = std::env::args().collect();
    let w = Workload::from_key(&a[1]).unwrap();
    let t = if a.get(2).map(String::as_str) == Some("sm_80") { Target::sm80() } else { Target::sm90() };
    let v = template::valid_configs(&gemm::WmmaGemm, &w, &t).unwrap();
    println!("{} valid on {}", v.len(), t.name);
    let mut h: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
    for (_, c) in &v {
        for (k, x) in &c.0 {
            *h.entry(k.clone()).or_default().entry(x.to_string()).or_default() += 1;
        }
    }
    for (k, m) in h {
        println!("{k}: {}", m.iter().map(|(x, n)| format!("{x}={n}")).collect::<Vec<_>>().join(" "));
    }
}
