//! Prints each config's launch of a `hot`/A-B file: `grid TEMPLATE FILE` (grid, block, shared
//! memory, workspace, the analytic time), to see what a config file will run before a GPU call.
fn main() {
    let a: Vec<String> = std::env::args().collect();
    let t = tensortune_kernels::registry::by_name(&a[1]).expect("template");
    let target = tensortune_kernels::Target::sm90();
    for line in std::fs::read_to_string(&a[2]).expect("file").lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let (key, rest) = line.split_once(' ').expect("KEY CONFIG");
        let config = match rest.rsplit_once(' ') {
            Some((c, v)) if !v.ends_with('}') => c,
            _ => rest,
        };
        let w = tensortune_kernels::Workload::from_key(key).expect("workload key");
        let c = tensortune_kernels::Config::from_json(config).expect("config JSON");
        match t.generate(&w, &c, &target) {
            Ok(s) => println!(
                "grid {:?} block {:?} smem {} ws {} model {:.2} us  {}",
                s.grid,
                s.block,
                s.smem_bytes,
                s.workspace_bytes,
                t.model_us(&w, &c, &target).unwrap_or(0.0),
                s.name
            ),
            Err(e) => println!("rejected: {e}"),
        }
    }
}
