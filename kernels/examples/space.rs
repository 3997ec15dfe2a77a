//! Size of each template's valid space for workloads: `space KEY... [--sm80]`.
use tensortune_kernels::*;
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let t = if args.iter().any(|a| a == "--sm80") { Target::sm80() } else { Target::sm90() };
    for key in args.iter().filter(|a| !a.starts_with("--")) {
        let w = match Workload::from_key(key) {
            Ok(w) => w,
            Err(e) => {
                println!("{key}: {e}");
                continue;
            }
        };
        for tpl in template::templates_for(w.op()) {
            match template::valid_configs(tpl, &w, &t) {
                Ok(v) => println!("{key} {} {}", tpl.name(), v.len()),
                Err(e) => println!("{key} {}: {e}", tpl.name()),
            }
        }
    }
}
