//! Writes the PTX NVRTC makes of a .cu file (compute_90): `ptx_file FILE.cu`.
fn main() -> anyhow::Result<()> {
    let a: Vec<String> = std::env::args().collect();
    let src = std::fs::read_to_string(&a[1])?;
    let inc = tensortune_worker::nvrtc::find_include_dir().expect("CUDA headers");
    let opts = cudarc::nvrtc::CompileOptions {
        arch: Some("compute_90"),
        include_paths: vec![inc.display().to_string()],
        options: vec!["-std=c++17".into(), "--device-as-default-execution-space".into()],
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(src, opts).map_err(|e| anyhow::anyhow!("{e:?}"))?;
    std::fs::write(format!("{}.ptx", a[1]), ptx.to_src())?;
    Ok(())
}
