//! NVRTC: generated CUDA C++ to a cubin for one exact architecture, on the calling thread.
//!
//! cudarc's safe layer stops at PTX; a PTX from an NVRTC newer than the driver will not load, so we
//! go one layer down and ask for the cubin (`nvrtcGetCUBIN`). Compile errors keep the full log and
//! the flags used. NVRTC is thread-safe per program, so a pool of threads may call [`compile`].

use std::ffi::{CStr, CString, c_char};
use std::path::{Path, PathBuf};
use std::time::Instant;

use cudarc::nvrtc::sys;
use thiserror::Error;

/// Why a compile produced no cubin.
#[derive(Debug, Clone, Error)]
pub enum CompileError {
    /// libnvrtc could not be loaded, or the CUDA headers were not found.
    #[error("nvrtc unavailable: {0}")]
    Unavailable(String),
    /// NVRTC rejected the source.
    #[error("nvrtc failed ({code}) with flags [{flags}]:\n{log}")]
    Failed {
        /// NVRTC's result code.
        code: String,
        /// The flags used, space-separated.
        flags: String,
        /// The full compiler log.
        log: String,
    },
}

/// A compiled kernel image.
#[derive(Debug, Clone)]
pub struct Compiled {
    /// The cubin.
    pub cubin: Vec<u8>,
    /// Compiler log (warnings), possibly empty.
    pub log: String,
    /// Wall time of the compile.
    pub ms: f64,
}

/// Whether libnvrtc can be loaded (cudarc would panic on first use otherwise).
pub fn available() -> bool {
    // SAFETY: only tries to dlopen the library by its candidate names.
    unsafe { sys::is_culib_present() }
}

/// NVRTC's version as "major.minor", when the library loads.
pub fn version() -> Option<String> {
    if !available() {
        return None;
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is present; both out-pointers are valid for the call.
    let r = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
    (r == sys::nvrtcResult::NVRTC_SUCCESS).then(|| format!("{major}.{minor}"))
}

/// The first directory holding the CUDA headers WMMA needs (`mma.h`, `cuda_fp16.h`): the
/// `TENSORTUNE_CUDA_INCLUDE` variable, then `$CUDA_HOME`/`$CUDA_PATH`, `/usr/local/cuda`, then the
/// NVRTC wheels that `scripts/setup-nvrtc.sh` unpacks into `.nvrtc/` (next to the binary's
/// workspace or the current directory).
pub fn find_include_dir() -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Ok(dir) = std::env::var("TENSORTUNE_CUDA_INCLUDE") {
        candidates.push(dir.into());
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Ok(dir) = std::env::var(var) {
            candidates.push(Path::new(&dir).join("include"));
        }
    }
    candidates.push("/usr/local/cuda/include".into());
    let wheel = Path::new(".nvrtc/nvidia/cu13/include");
    if let Ok(cwd) = std::env::current_dir() {
        candidates.extend(cwd.ancestors().map(|d| d.join(wheel)));
    }
    if let Ok(exe) = std::env::current_exe() {
        candidates.extend(exe.ancestors().map(|d| d.join(wheel)));
    }
    candidates.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(wheel));
    candidates.into_iter().find(|d| d.join("mma.h").is_file() && d.join("cuda_fp16.h").is_file())
}

/// ptxas warnings that mean wgmma instructions were serialized (C7510, C7511, and C7514: a
/// non-wgmma instruction touches the accumulators while wgmmas are in flight), or setmaxnreg
/// ignored (C7508).
const SERIALIZED_WGMMA: [&str; 4] = ["C7510", "C7511", "C7508", "C7514"];

/// The flags every kernel is compiled with.
pub fn flags(arch: &str, include_dir: &Path) -> Vec<String> {
    vec![
        format!("--gpu-architecture={arch}"),
        "-std=c++17".into(),
        "--device-as-default-execution-space".into(),
        format!("-I{}", include_dir.display()),
    ]
}

struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the program was created by nvrtcCreateProgram and is destroyed exactly once.
        unsafe {
            let _ = sys::nvrtcDestroyProgram(&mut self.0);
        }
    }
}

fn check(r: sys::nvrtcResult) -> Result<(), sys::nvrtcResult> {
    if r == sys::nvrtcResult::NVRTC_SUCCESS { Ok(()) } else { Err(r) }
}

/// Compiles `source` to a cubin for `arch` (e.g. `sm_90`), with headers from `include_dir`.
pub fn compile(source: &str, name: &str, arch: &str, include_dir: &Path) -> Result<Compiled, CompileError> {
    compile_with(source, name, arch, include_dir, &[])
}

/// [`compile`] with `extra` flags after [`flags`]' (compile tests ask ptxas for its spill
/// warnings with `--ptxas-options=--warn-on-spills`; the worker compiles with none).
pub fn compile_with(
    source: &str,
    name: &str,
    arch: &str,
    include_dir: &Path,
    extra: &[&str],
) -> Result<Compiled, CompileError> {
    if !available() {
        return Err(CompileError::Unavailable(
            "libnvrtc.so.13 was not found; put its directory on LD_LIBRARY_PATH (scripts/setup-nvrtc.sh installs it)"
                .into(),
        ));
    }
    let start = Instant::now();
    let mut flags = flags(arch, include_dir);
    flags.extend(extra.iter().map(|f| f.to_string()));
    let src = CString::new(source).map_err(|_| CompileError::Unavailable("source contains a NUL byte".into()))?;
    let cname =
        CString::new(format!("{name}.cu")).map_err(|_| CompileError::Unavailable("name contains a NUL byte".into()))?;
    let failed = |code: sys::nvrtcResult, log: String| CompileError::Failed {
        code: format!("{code:?}"),
        flags: flags.join(" "),
        log,
    };

    let mut raw = std::ptr::null_mut();
    // SAFETY: src and cname outlive the call; no headers are passed in memory.
    check(unsafe {
        sys::nvrtcCreateProgram(&mut raw, src.as_ptr(), cname.as_ptr(), 0, std::ptr::null(), std::ptr::null())
    })
    .map_err(|c| failed(c, String::new()))?;
    let prog = Program(raw);

    let cflags: Vec<CString> = flags.iter().map(|f| CString::new(f.as_str()).expect("flags have no NUL")).collect();
    let ptrs: Vec<*const c_char> = cflags.iter().map(|f| f.as_ptr()).collect();
    // SAFETY: prog is live; ptrs point into cflags, which outlives the call.
    let compiled = check(unsafe { sys::nvrtcCompileProgram(prog.0, ptrs.len() as i32, ptrs.as_ptr()) });
    let log = program_log(&prog);
    if let Err(code) = compiled {
        return Err(failed(code, log));
    }
    // ptxas compiles a wgmma it cannot keep asynchronous (accumulators moved between wgmmas, calls
    // in between) into a serialized one that runs at a fraction of the rate: a broken kernel.
    if let Some(line) = log.lines().find(|l| SERIALIZED_WGMMA.iter().any(|w| l.contains(w))) {
        return Err(CompileError::Failed {
            code: "serialized wgmma".into(),
            flags: flags.join(" "),
            log: format!(
                "{line}\n(treated as an error: serialized wgmma runs far below the tensor cores' rate)\n{log}"
            ),
        });
    }
    let mut size = 0usize;
    // SAFETY: prog compiled successfully; size is a valid out-pointer.
    check(unsafe { sys::nvrtcGetCUBINSize(prog.0, &mut size) }).map_err(|c| failed(c, log.clone()))?;
    let mut cubin = vec![0u8; size];
    // SAFETY: cubin has exactly the size NVRTC reported.
    check(unsafe { sys::nvrtcGetCUBIN(prog.0, cubin.as_mut_ptr().cast()) }).map_err(|c| failed(c, log.clone()))?;
    if cubin.is_empty() {
        return Err(failed(
            sys::nvrtcResult::NVRTC_ERROR_INVALID_OPTION,
            format!("no cubin produced (is {arch} a real architecture?)\n{log}"),
        ));
    }
    Ok(Compiled { cubin, log, ms: start.elapsed().as_secs_f64() * 1e3 })
}

fn program_log(prog: &Program) -> String {
    let mut size = 0usize;
    // SAFETY: prog is live; size is a valid out-pointer.
    if unsafe { sys::nvrtcGetProgramLogSize(prog.0, &mut size) } != sys::nvrtcResult::NVRTC_SUCCESS || size == 0 {
        return String::new();
    }
    let mut buf = vec![0u8; size];
    // SAFETY: buf has the size NVRTC reported, including the terminating NUL.
    if unsafe { sys::nvrtcGetProgramLog(prog.0, buf.as_mut_ptr().cast()) } != sys::nvrtcResult::NVRTC_SUCCESS {
        return String::new();
    }
    CStr::from_bytes_until_nul(&buf).map(|s| s.to_string_lossy().trim_end().to_owned()).unwrap_or_default()
}
