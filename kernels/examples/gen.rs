//! Prints the generated source of one config: `gen TEMPLATE WORKLOAD_JSON CONFIG_JSON`.
fn main() {
    let a: Vec<String> = std::env::args().collect();
    let t = tensortune_kernels::template::by_name(&a[1]).expect("template");
    let w: tensortune_kernels::Workload = serde_json::from_str(&a[2]).expect("workload JSON");
    let c = tensortune_kernels::Config::from_json(&a[3]).expect("config JSON");
    let spec = t.generate(&w, &c, &tensortune_kernels::Target::sm90()).unwrap_or_else(|e| panic!("{e}"));
    print!("{}", spec.source);
}
