//! Writes the cubin of one generated kernel (workload key, config JSON, arch) to a file, for SASS
//! inspection with cuobjdump/nvdisasm: `cubin KEY CONFIG_JSON [sm_90] [out.cubin]`. The template
//! is the workload's default, or the one `TT_TEMPLATE` names (e.g. wgmma_gemm, with arch sm_90a).
use tensortune_kernels::*;
fn main() -> anyhow::Result<()> {
    let a: Vec<String> = std::env::args().collect();
    let w = Workload::from_key(&a[1])?;
    let c = Config::from_json(&a[2])?;
    let arch = a.get(3).cloned().unwrap_or("sm_90".into());
    let t = if arch == "sm_80" { Target::sm80() } else { Target::sm90() };
    let template = match std::env::var("TT_TEMPLATE") {
        Ok(name) => registry::by_name(&name)?,
        Err(_) => registry::default_for(w.op())?,
    };
    let spec = template.generate(&w, &c, &t)?;
    let inc = tensortune_worker::nvrtc::find_include_dir().expect("CUDA headers");
    let out = tensortune_worker::nvrtc::compile(&spec.source, &spec.name, &arch, &inc)?;
    let path = a.get(4).cloned().unwrap_or(format!("/tmp/{}.cubin", spec.name));
    std::fs::write(&path, &out.cubin)?;
    std::fs::write(format!("{path}.cu"), &spec.source)?;
    println!(
        "{path} ({} bytes, smem {}, threads {}, grid {:?})",
        out.cubin.len(),
        spec.smem_bytes,
        spec.threads(),
        spec.grid
    );
    Ok(())
}
