//! Compiles a .cu file with the worker's NVRTC flags and writes the cubin next to it:
//! `compile_file FILE.cu [sm_90]` (for SASS inspection with nvdisasm).
fn main() -> anyhow::Result<()> {
    let a: Vec<String> = std::env::args().collect();
    let arch = a.get(2).cloned().unwrap_or("sm_90".into());
    let src = std::fs::read_to_string(&a[1])?;
    let inc = tensortune_worker::nvrtc::find_include_dir().expect("CUDA headers");
    let out = tensortune_worker::nvrtc::compile(&src, "file", &arch, &inc)?;
    std::fs::write(format!("{}.cubin", a[1]), &out.cubin)?;
    println!("{}.cubin ({} bytes) {}", a[1], out.cubin.len(), out.log);
    Ok(())
}
