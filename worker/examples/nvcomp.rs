//! Spot check: compile a spread of generated kernels for one workload key with NVRTC.
use tensortune_kernels::*;
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let w = Workload::from_key(&args[1]).unwrap();
    let arch = args.get(2).cloned().unwrap_or("sm_90".into());
    let n: usize = args.get(3).map(|s| s.parse().unwrap()).unwrap_or(20);
    let t = if arch == "sm_80" { Target::sm80() } else { Target::sm90() };
    let inc = tensortune_worker::nvrtc::find_include_dir().expect("include");
    let v = template::valid_configs(&gemm::WmmaGemm, &w, &t).unwrap();
    let mut fails = 0;
    for (_, c) in v.iter().step_by((v.len() / n).max(1)) {
        let s = gemm::WmmaGemm.generate(&w, c, &t).unwrap();
        let start = std::time::Instant::now();
        match tensortune_worker::nvrtc::compile(&s.source, &s.name, &arch, &inc) {
            Ok(_) => println!("ok {:.0} ms {}", start.elapsed().as_secs_f64() * 1e3, s.name),
            Err(e) => {
                fails += 1;
                println!("FAIL {}: {}", s.name, e.to_string().chars().take(3000).collect::<String>())
            }
        }
    }
    println!("{} valid, {fails} failures", v.len());
}
