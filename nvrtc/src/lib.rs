//! NVRTC: generated CUDA C++ to a cubin for one exact architecture, on the calling thread.
//!
//! cudarc's safe layer stops at PTX; a PTX from an NVRTC newer than the driver will not load, so we
//! go one layer down and ask for the cubin (`nvrtcGetCUBIN`). Compile errors keep the full log and
//! the flags used. NVRTC is thread-safe per program, so a pool of threads may call [`compile`].
//!
//! # Layout
//! One file: finding the toolchain ([`find`], [`cuda_roots`]: an installation the environment names,
//! /usr/local/cuda, then the PyPI wheel that scripts/setup-nvrtc.sh installs above the binary or
//! the working directory), the flags ([`flags`]) and the compile ([`compile`], [`compile_with`]).
//! The worker re-exports it as `tensortune_worker::nvrtc`; kernels/tests/compile compiles every
//! template's output with it.

use std::ffi::{CStr, CString, c_char};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
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

/// The library's file name (its SONAME: a copy loaded by path answers a later load by name).
const LIBRARY: &str = "libnvrtc.so.13";

/// Where `scripts/setup-nvrtc.sh` unpacks NVIDIA's wheels, relative to the repository root.
const WHEEL: &str = ".nvrtc/nvidia/cu13";

/// NVRTC and the CUDA headers, found: what compiling a kernel needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Toolchain {
    /// The directory holding `mma.h` and `cuda_fp16.h`.
    pub include_dir: PathBuf,
    /// NVRTC's version, "major.minor".
    pub version: String,
}

/// The one lookup every command uses (the worker, `tensortune tune`'s embedded worker, `export`,
/// the tests): libnvrtc and the CUDA headers, or why not, naming where it looked.
pub fn find() -> Result<Toolchain, String> {
    let Some(version) = version() else {
        return Err(format!(
            "{LIBRARY} was found neither by the dynamic loader (LD_LIBRARY_PATH) nor in {}; \
             scripts/setup-nvrtc.sh installs it",
            looked_in(&cuda_roots(), "lib")
        ));
    };
    let Some(include_dir) = find_include_dir() else {
        return Err(format!(
            "the CUDA headers (mma.h, cuda_fp16.h) were found neither in TENSORTUNE_CUDA_INCLUDE nor in {}",
            looked_in(&cuda_roots(), "include")
        ));
    };
    Ok(Toolchain { include_dir, version })
}

/// The CUDA installations searched, in order: `$CUDA_HOME`, `$CUDA_PATH`, `/usr/local/cuda`, then
/// the wheels that `scripts/setup-nvrtc.sh` unpacks into `.nvrtc/` at a repository root: above the
/// current directory, above the running binary (a built `tensortune` in `target/`), and at the
/// root of the tree this crate was built from.
pub fn cuda_roots() -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = Vec::new();
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(dir) = std::env::var_os(var) {
            roots.push(dir.into());
        }
    }
    roots.push("/usr/local/cuda".into());
    if let Ok(cwd) = std::env::current_dir() {
        roots.extend(cwd.ancestors().map(|d| d.join(WHEEL)));
    }
    if let Ok(exe) = std::env::current_exe() {
        roots.extend(exe.ancestors().map(|d| d.join(WHEEL)));
    }
    roots.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(WHEEL));
    roots
}

/// The first root's `lib/libnvrtc.so.13` (or `lib64/`) that exists.
fn library_in(roots: &[PathBuf]) -> Option<PathBuf> {
    roots.iter().flat_map(|r| ["lib", "lib64"].map(|l| r.join(l).join(LIBRARY))).find(|p| p.is_file())
}

/// The first directory holding `mma.h` and `cuda_fp16.h`: `include` under a root, after
/// `TENSORTUNE_CUDA_INCLUDE` when set.
fn include_in(explicit: Option<PathBuf>, roots: &[PathBuf]) -> Option<PathBuf> {
    explicit
        .into_iter()
        .chain(roots.iter().map(|r| r.join("include")))
        .find(|d| d.join("mma.h").is_file() && d.join("cuda_fp16.h").is_file())
}

/// The directories searched, for an error message.
fn looked_in(roots: &[PathBuf], sub: &str) -> String {
    let mut seen: Vec<String> = Vec::new();
    for r in roots {
        let d = r.join(sub).display().to_string();
        if !seen.contains(&d) {
            seen.push(d);
        }
    }
    seen.join(", ")
}

/// Whether libnvrtc can be loaded (cudarc would panic on first use otherwise): by name through
/// the dynamic loader first, else from [`cuda_roots`]. A copy found there is loaded by path
/// (with `libnvrtc-builtins` beside it, which NVRTC loads by name) and kept for the process, so
/// cudarc's own load by name finds it already loaded.
pub fn available() -> bool {
    static LOADED: OnceLock<bool> = OnceLock::new();
    *LOADED.get_or_init(|| {
        // SAFETY: only tries to dlopen the library by its candidate names.
        if unsafe { sys::is_culib_present() } {
            return true;
        }
        let Some(lib) = library_in(&cuda_roots()) else { return false };
        let dir = lib.parent().expect("a file has a directory");
        let builtins =
            std::fs::read_dir(dir).into_iter().flatten().flatten().map(|e| e.path()).filter(|p| {
                p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("libnvrtc-builtins.so"))
            });
        for path in builtins.chain([lib.clone()]) {
            // SAFETY: NVIDIA's libraries run no initialisers beyond their own set-up; each stays
            // loaded for the life of the process (forgotten, never unloaded).
            match unsafe { libloading::Library::new(&path) } {
                Ok(loaded) => std::mem::forget(loaded),
                Err(e) => tracing::warn!(path = %path.display(), "could not load: {e}"),
            }
        }
        tracing::debug!(path = %lib.display(), "loaded NVRTC from a CUDA root");
        // SAFETY: as above.
        unsafe { sys::is_culib_present() }
    })
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
/// `TENSORTUNE_CUDA_INCLUDE` variable, then `include` under each of [`cuda_roots`].
pub fn find_include_dir() -> Option<PathBuf> {
    include_in(std::env::var_os("TENSORTUNE_CUDA_INCLUDE").map(PathBuf::from), &cuda_roots())
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
            find().err().unwrap_or_else(|| format!("{LIBRARY} could not be loaded")),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(path: &Path) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, b"").unwrap();
    }

    #[test]
    fn the_search_covers_the_wheel_above_the_binary_and_the_working_directory() {
        let roots = cuda_roots();
        // A built binary sits in <repo>/target/<profile>/: every directory above it is searched.
        for dir in std::env::current_exe().unwrap().ancestors() {
            assert!(roots.contains(&dir.join(WHEEL)), "{dir:?} not searched: {roots:?}");
        }
        let cwd_wheel = std::env::current_dir().unwrap().join(WHEEL);
        assert!(roots.contains(&cwd_wheel), "{cwd_wheel:?} not in {roots:?}");
        assert!(roots.contains(&PathBuf::from("/usr/local/cuda")));
        // Installations named by the environment come before the wheels.
        let system = roots.iter().position(|r| r == Path::new("/usr/local/cuda")).unwrap();
        assert!(roots.iter().position(|r| r == &cwd_wheel).unwrap() > system);
    }

    #[test]
    fn library_and_headers_are_taken_from_the_first_root_that_has_them() {
        let dir = tempfile::tempdir().unwrap();
        let (empty, a, b) = (dir.path().join("empty"), dir.path().join("a"), dir.path().join("b"));
        touch(&b.join("lib").join(LIBRARY));
        touch(&a.join("lib64").join(LIBRARY));
        let roots = vec![empty.clone(), a.clone(), b.clone()];
        assert_eq!(library_in(&roots), Some(a.join("lib64").join(LIBRARY)));
        assert_eq!(library_in(&roots[..1]), None);

        for h in ["mma.h", "cuda_fp16.h"] {
            touch(&b.join("include").join(h));
        }
        touch(&a.join("include/mma.h")); // without cuda_fp16.h: not a header directory
        assert_eq!(include_in(None, &roots), Some(b.join("include")));
        assert_eq!(include_in(Some(empty.clone()), &roots), Some(b.join("include")));
        assert_eq!(include_in(Some(b.join("include")), &[]), Some(b.join("include")));
        assert!(looked_in(&roots, "lib").contains(&a.join("lib").display().to_string()));
    }

    /// A binary run without LD_LIBRARY_PATH (`tensortune export` from `target/`) finds the NVRTC
    /// that scripts/setup-nvrtc.sh installed, as the worker does: this test runs itself again
    /// with the variable removed, from a directory outside the repository.
    #[test]
    fn nvrtc_loads_without_ld_library_path() {
        if std::env::var_os("TENSORTUNE_NVRTC_CHILD").is_some() {
            let toolchain = find().unwrap();
            assert!(!toolchain.version.is_empty());
            return;
        }
        assert!(
            library_in(&cuda_roots()).is_some() || std::env::var_os("CUDA_HOME").is_some(),
            "no {LIBRARY} under {}: run scripts/setup-nvrtc.sh",
            looked_in(&cuda_roots(), "lib")
        );
        let elsewhere = tempfile::tempdir().unwrap();
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "tests::nvrtc_loads_without_ld_library_path", "--nocapture"])
            .env("TENSORTUNE_NVRTC_CHILD", "1")
            .env_remove("LD_LIBRARY_PATH")
            .env_remove("TENSORTUNE_CUDA_INCLUDE")
            .current_dir(elsewhere.path())
            .output()
            .unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success() && text.contains("1 passed"), "{text}");
    }
}
