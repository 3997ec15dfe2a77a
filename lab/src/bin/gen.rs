//! Prints the generated source of one config: `gen TEMPLATE WORKLOAD CONFIG_JSON`, the workload as
//! JSON or as its key (`conv2d/n32h7w7c512/...`).
fn main() {
    let a: Vec<String> = std::env::args().collect();
    let t = tensortune_kernels::registry::by_name(&a[1]).expect("template");
    let w: tensortune_kernels::Workload = if a[2].trim_start().starts_with('{') {
        serde_json::from_str(&a[2]).expect("workload JSON")
    } else {
        tensortune_kernels::Workload::from_key(&a[2]).unwrap_or_else(|e| panic!("workload key: {e}"))
    };
    let c = tensortune_kernels::Config::from_json(&a[3]).expect("config JSON");
    let spec = t.generate(&w, &c, &tensortune_kernels::Target::sm90()).unwrap_or_else(|e| panic!("{e}"));
    print!("{}", spec.source);
}
