use tensortune_kernels::*;
fn main() {
    let inc = tensortune_worker::nvrtc::find_include_dir().expect("include");
    let w = Workload::Matmul(Matmul::new(512, 64, 512, Layout::Nn, Types::default_for(DType::F16).unwrap()).unwrap());
    let v = template::valid_configs(&gemm::WmmaGemm, &w, &Target::sm90()).unwrap();
    let specs: Vec<_> = v
        .iter()
        .step_by(v.len() / 20)
        .take(20)
        .map(|(_, c)| gemm::WmmaGemm.generate(&w, c, &Target::sm90()).unwrap())
        .collect();
    let t = std::time::Instant::now();
    for s in &specs {
        let _ = tensortune_worker::nvrtc::compile(&s.source, &s.name, "sm_90", &inc);
    }
    println!("one by one: {:.0} ms/kernel", t.elapsed().as_secs_f64() * 1e3 / specs.len() as f64);
    let mut batch = String::from(cuda::PREAMBLE);
    for s in &specs {
        batch.push_str(s.source.strip_prefix(cuda::PREAMBLE).unwrap());
    }
    let t = std::time::Instant::now();
    match tensortune_worker::nvrtc::compile(&batch, "batch", "sm_90", &inc) {
        Ok(c) => println!(
            "batched: {:.0} ms/kernel ({} bytes)",
            t.elapsed().as_secs_f64() * 1e3 / specs.len() as f64,
            c.cubin.len()
        ),
        Err(e) => println!("{e}"),
    }
}
