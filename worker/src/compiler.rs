//! Compilation ahead of the GPU: NVRTC on a pool of dedicated threads (never the async runtime's
//! workers), with every image cached by (source hash, arch, NVRTC version, flags) in memory and,
//! when a cache directory is set, on disk, so re-measuring a config never recompiles it.
//!
//! Concurrent requests for the same image share one compile (a once-cell per key), which matters
//! for support modules: the first tasks of a workload all need the same one at once. Compile
//! failures are cached in memory too: the same source fails the same way.

use std::collections::{HashMap, VecDeque};
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use sha2::{Digest, Sha256};
use tokio::sync::{OnceCell, mpsc, oneshot};

use crate::compile_child::{COMPILE_CHILD_ARG, CompileProcess, CompileReply, CompileRequest};
use crate::nvrtc;

/// Images kept in memory. A cubin is tens of KiB, so this bounds the cache near 100 MiB; the
/// disk cache keeps the rest.
const MEMORY_IMAGES: usize = 2048;

/// Where images come from.
#[derive(Clone, Debug)]
pub(crate) enum Backend {
    /// NVRTC, with the CUDA headers in `include_dir`.
    Nvrtc {
        /// Directory with `mma.h` and `cuda_fp16.h`.
        include_dir: PathBuf,
        /// NVRTC's version, part of the cache key.
        version: String,
    },
    /// Nothing is compiled (`sim` without libnvrtc): images are empty.
    Skip,
}

/// A compiled image (empty under [`Backend::Skip`]).
#[derive(Debug, Default)]
pub(crate) struct Image {
    /// The cubin.
    pub(crate) cubin: Vec<u8>,
}

/// What one request for an image got.
#[derive(Debug, Clone)]
pub(crate) struct Build {
    /// The image, or the compiler's full error (log and flags).
    pub(crate) image: Result<Arc<Image>, Arc<str>>,
    /// NVRTC wall time spent for this request (0 when the result was cached).
    pub(crate) compile_ms: f64,
    /// Whether the result came from the memory or disk cache (or a compile another request ran).
    pub(crate) cache_hit: bool,
}

/// What a compile thread produced.
enum Output {
    Compiled { cubin: Vec<u8>, ms: f64 },
    FromDisk { cubin: Vec<u8> },
    Failed { message: String, ms: f64 },
}

struct Job {
    source: String,
    name: String,
    /// The disk-cache file of this image, when there is a disk cache.
    path: Option<PathBuf>,
    reply: oneshot::Sender<Output>,
}

type Slot = Arc<OnceCell<Result<Arc<Image>, Arc<str>>>>;

/// The in-memory cache: one once-cell per key, oldest evicted first.
#[derive(Default)]
struct Memory {
    slots: HashMap<String, Slot>,
    order: VecDeque<String>,
}

/// The compile pool and its caches.
pub(crate) struct Compiler {
    backend: Backend,
    arch: String,
    /// The flags as one string, part of the cache key.
    flags: String,
    /// `<cache_dir>/cubin`, when images are kept on disk.
    disk: Option<PathBuf>,
    memory: Mutex<Memory>,
    /// Feeds the pool; `None` once closed.
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl Compiler {
    /// Starts `threads` compile threads for `arch` (e.g. `sm_90`), caching on disk under
    /// `cache_dir` when given. With `program` (a worker binary), each thread compiles in its own
    /// compile process (`compile_child.rs` says why); without, in this process. With `warm`, each
    /// thread first compiles a kernel of nothing ([`WARM_UP`]), so that the first batch a GPU
    /// worker leases does not wait for the compile processes to start and load NVRTC.
    pub(crate) fn new(
        backend: Backend,
        arch: String,
        threads: usize,
        cache_dir: Option<&Path>,
        program: Option<String>,
        warm: bool,
    ) -> Compiler {
        let (flags, workers) = match &backend {
            Backend::Nvrtc { include_dir, .. } => (nvrtc::flags(&arch, include_dir).join(" "), threads.max(1)),
            Backend::Skip => (String::new(), 0),
        };
        // Two queued jobs per thread keep every thread busy; the lease room bounds the rest.
        let (tx, rx) = mpsc::channel::<Job>(2 * workers.max(1));
        let rx = Arc::new(Mutex::new(rx));
        let handles = (0..workers)
            .map(|i| {
                let (rx, arch, program) = (rx.clone(), arch.clone(), program.clone());
                let include_dir = match &backend {
                    Backend::Nvrtc { include_dir, .. } => include_dir.clone(),
                    Backend::Skip => PathBuf::new(),
                };
                std::thread::Builder::new()
                    .name(format!("nvrtc-{i}"))
                    .spawn(move || compile_thread(&rx, &arch, &include_dir, program.as_deref(), warm))
                    .expect("spawning a compile thread")
            })
            .collect();
        Compiler {
            backend,
            arch,
            flags,
            disk: cache_dir.map(|d| d.join("cubin")),
            memory: Mutex::new(Memory::default()),
            jobs: Mutex::new(Some(tx)),
            threads: Mutex::new(handles),
        }
    }

    /// The image of `source` (an `extern "C"` module called `name` in logs), compiled at most once.
    pub(crate) async fn build(&self, name: &str, source: &str) -> Build {
        let version = match &self.backend {
            Backend::Skip => return Build { image: Ok(Arc::new(Image::default())), compile_ms: 0.0, cache_hit: false },
            Backend::Nvrtc { version, .. } => version,
        };
        let key = cache_key(source, &self.arch, version, &self.flags);
        let slot = self.slot(&key);
        let mut origin = None;
        let origin_ref = &mut origin;
        let image = slot
            .get_or_init(|| async move {
                let (image, how) = self.submit(name, source, &key).await;
                *origin_ref = Some(how);
                image
            })
            .await
            .clone();
        let (compile_ms, cache_hit) = match origin {
            Some(Origin::Compiled(ms)) => (ms, false),
            Some(Origin::Disk) | None => (0.0, true),
        };
        Build { image, compile_ms, cache_hit }
    }

    /// Stops the pool once the queued jobs are done and waits for its threads.
    pub(crate) async fn close(&self) {
        self.jobs.lock().expect("compile queue lock").take();
        let threads = std::mem::take(&mut *self.threads.lock().expect("compile threads lock"));
        let _ = tokio::task::spawn_blocking(move || {
            for t in threads {
                let _ = t.join();
            }
        })
        .await;
    }

    fn slot(&self, key: &str) -> Slot {
        let mut memory = self.memory.lock().expect("image cache lock");
        if let Some(slot) = memory.slots.get(key) {
            return slot.clone();
        }
        while memory.order.len() >= MEMORY_IMAGES {
            // Requests still waiting on an evicted slot hold it; later ones start a new one.
            if let Some(old) = memory.order.pop_front() {
                memory.slots.remove(&old);
            }
        }
        let slot = Slot::default();
        memory.slots.insert(key.to_owned(), slot.clone());
        memory.order.push_back(key.to_owned());
        slot
    }

    async fn submit(&self, name: &str, source: &str, key: &str) -> (Result<Arc<Image>, Arc<str>>, Origin) {
        let (reply, answer) = oneshot::channel();
        let job = Job {
            source: source.to_owned(),
            name: name.to_owned(),
            path: self.disk.as_ref().map(|d| d.join(format!("{key}.cubin"))),
            reply,
        };
        let sender = self.jobs.lock().expect("compile queue lock").clone();
        let sent = match sender {
            Some(tx) => tx.send(job).await.is_ok(),
            None => false,
        };
        if !sent {
            return (Err("the compile pool has stopped".into()), Origin::Compiled(0.0));
        }
        match answer.await {
            Ok(Output::Compiled { cubin, ms }) => (Ok(Arc::new(Image { cubin })), Origin::Compiled(ms)),
            Ok(Output::FromDisk { cubin }) => (Ok(Arc::new(Image { cubin })), Origin::Disk),
            Ok(Output::Failed { message, ms }) => (Err(message.into()), Origin::Compiled(ms)),
            Err(_) => (Err("the compile thread stopped before answering".into()), Origin::Compiled(0.0)),
        }
    }
}

/// How the request that filled a slot got its result.
enum Origin {
    /// NVRTC ran (successfully or not) for this many milliseconds.
    Compiled(f64),
    /// The image was on disk.
    Disk,
}

/// SHA-256 over everything that changes a cubin: the source, the arch, NVRTC's version, the flags.
fn cache_key(source: &str, arch: &str, version: &str, flags: &str) -> String {
    let mut h = Sha256::new();
    for part in [source, arch, version, flags] {
        h.update(part.as_bytes());
        h.update([0u8]);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// What a warmed compile thread compiles first: the generated kernels' preamble (the same
/// headers) and an empty kernel.
const WARM_UP: &str = "extern \"C\" __global__ void tt_warm_up() {}\n";

fn compile_thread(
    jobs: &Mutex<mpsc::Receiver<Job>>,
    arch: &str,
    include_dir: &Path,
    program: Option<&str>,
    warm: bool,
) {
    let mut compiler = ThreadCompiler { program, process: None, in_process: program.is_none() };
    if warm {
        let (reply, _) = oneshot::channel();
        let source = format!("{}{WARM_UP}", tensortune_kernels::cuda::PREAMBLE);
        let job = Job { source, name: "tt_warm_up".to_owned(), path: None, reply };
        let start = Instant::now();
        match compiler.compile(&job, arch, include_dir) {
            Ok(Ok(_)) => tracing::debug!(ms = start.elapsed().as_secs_f64() * 1e3, "compile thread warmed up"),
            Ok(Err(e)) | Err(e) => tracing::warn!("the warm-up compile failed (the first kernels will say why): {e}"),
        }
    }
    loop {
        // One idle thread waits in `recv` holding the lock, the others wait for the lock: each
        // job goes to exactly one thread.
        let job = jobs.lock().expect("compile queue lock").blocking_recv();
        let Some(job) = job else { return };
        let output = run_job(&job, arch, include_dir, &mut compiler);
        let _ = job.reply.send(output);
    }
}

/// How one compile thread runs NVRTC: through its compile process, started on first use and
/// again after it died, or in this process when no program was given or it cannot be started.
struct ThreadCompiler<'a> {
    program: Option<&'a str>,
    process: Option<CompileProcess>,
    in_process: bool,
}

impl ThreadCompiler<'_> {
    fn compile(&mut self, job: &Job, arch: &str, include_dir: &Path) -> Result<Result<(Vec<u8>, f64), String>, String> {
        if !self.in_process && self.process.is_none() {
            let program = self.program.expect("set unless in_process");
            match CompileProcess::spawn(program) {
                Ok(p) => self.process = Some(p),
                Err(e) => {
                    tracing::warn!(
                        "cannot start a compile process ({program} {COMPILE_CHILD_ARG}): {e}; compiling in-process"
                    );
                    self.in_process = true;
                }
            }
        }
        let Some(process) = self.process.as_mut() else {
            return std::panic::catch_unwind(AssertUnwindSafe(|| {
                nvrtc::compile(&job.source, &job.name, arch, include_dir)
            }))
            .map(|r| r.map(|c| (c.cubin, c.ms)).map_err(|e| e.to_string()))
            .map_err(|_| format!("nvrtc panicked while compiling {}", job.name));
        };
        let request = CompileRequest {
            source: job.source.clone(),
            name: job.name.clone(),
            arch: arch.to_owned(),
            include_dir: include_dir.to_owned(),
        };
        match process.compile(&request) {
            Ok(CompileReply::Ok { cubin, ms }) => Ok(Ok((cubin, ms))),
            Ok(CompileReply::Err { message, .. }) => Ok(Err(message)),
            Err(e) => {
                self.process = None;
                Err(format!("the compile process died while compiling {}: {e}", job.name))
            }
        }
    }
}

fn run_job(job: &Job, arch: &str, include_dir: &Path, compiler: &mut ThreadCompiler<'_>) -> Output {
    if let Some(path) = &job.path {
        match std::fs::read(path) {
            Ok(cubin) if cubin.starts_with(b"\x7fELF") => return Output::FromDisk { cubin },
            Ok(_) => tracing::warn!(kernel = %job.name, "ignoring {} in the cubin cache: not a cubin", path.display()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(kernel = %job.name, "cannot read {} from the cubin cache: {e}", path.display()),
        }
    }
    let start = Instant::now();
    let compiled = compiler.compile(job, arch, include_dir);
    let ms = start.elapsed().as_secs_f64() * 1e3;
    match compiled {
        Ok(Ok((cubin, nvrtc_ms))) => {
            if let Some(path) = &job.path {
                store(path, &cubin);
            }
            tracing::debug!(kernel = %job.name, ms = nvrtc_ms, bytes = cubin.len(), "compiled");
            Output::Compiled { cubin, ms: nvrtc_ms }
        }
        Ok(Err(message)) => Output::Failed { message, ms },
        Err(message) => Output::Failed { message, ms },
    }
}

/// Writes `cubin` to `path` through a temporary file and a rename, so a reader never sees half a
/// file and concurrent workers sharing the directory do not clash. A failure only costs a compile
/// later, so it is logged, not returned.
fn store(path: &Path, cubin: &[u8]) {
    let tmp = path.with_extension(format!("tmp-{}-{:?}", std::process::id(), std::thread::current().id()));
    let written = path
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| std::fs::write(&tmp, cubin))
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        tracing::warn!("cannot write {} to the cubin cache: {e}", path.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KERNEL: &str = "extern \"C\" __global__ void k(float* p) { p[threadIdx.x] = 1.0f; }\n";

    fn nvrtc_backend() -> Backend {
        let t = nvrtc::find().unwrap_or_else(|why| panic!("{why} (this test compiles real code)"));
        Backend::Nvrtc { include_dir: t.include_dir, version: t.version }
    }

    #[tokio::test]
    async fn images_compile_once_then_come_from_memory_and_disk() {
        let dir = tempfile::tempdir().unwrap();
        let compiler = Compiler::new(nvrtc_backend(), "sm_90".into(), 1, Some(dir.path()), None, false);
        let first = compiler.build("k", KERNEL).await;
        assert!(first.image.as_ref().unwrap().cubin.starts_with(b"\x7fELF"));
        assert!(!first.cache_hit && first.compile_ms > 0.0);
        let again = compiler.build("k", KERNEL).await;
        assert!(again.cache_hit && again.compile_ms == 0.0);
        compiler.close().await;

        let fresh = Compiler::new(nvrtc_backend(), "sm_90".into(), 1, Some(dir.path()), None, false);
        let from_disk = fresh.build("k", KERNEL).await;
        assert!(from_disk.cache_hit && from_disk.compile_ms == 0.0);
        assert_eq!(from_disk.image.unwrap().cubin, first.image.unwrap().cubin);
        let other_arch = Compiler::new(nvrtc_backend(), "sm_80".into(), 1, Some(dir.path()), None, false);
        assert!(!other_arch.build("k", KERNEL).await.cache_hit);
        fresh.close().await;
        other_arch.close().await;
    }

    #[tokio::test]
    async fn failures_keep_the_log_and_are_cached() {
        let compiler = Compiler::new(nvrtc_backend(), "sm_90".into(), 2, None, None, true);
        let source = "extern \"C\" __global__ void broken() { undeclared_thing(); }\n";
        let (a, b) = tokio::join!(compiler.build("broken", source), compiler.build("broken", source));
        let message = a.image.clone().unwrap_err();
        assert!(message.contains("undeclared_thing") && message.contains("--gpu-architecture=sm_90"), "{message}");
        assert_eq!(b.image.unwrap_err(), message);
        assert!(a.cache_hit != b.cache_hit, "exactly one of two concurrent requests compiles");
        assert!(compiler.build("broken", source).await.cache_hit);
        compiler.close().await;
    }

    #[tokio::test]
    async fn the_skip_backend_compiles_nothing() {
        let compiler = Compiler::new(Backend::Skip, "sm_90".into(), 4, None, None, false);
        let b = compiler.build("k", "not even c++").await;
        assert!(b.image.unwrap().cubin.is_empty() && !b.cache_hit && b.compile_ms == 0.0);
        compiler.close().await;
    }

    #[test]
    fn keys_cover_every_input() {
        let base = cache_key("s", "sm_90", "13.0", "-x");
        for other in [
            cache_key("t", "sm_90", "13.0", "-x"),
            cache_key("s", "sm_80", "13.0", "-x"),
            cache_key("s", "sm_90", "13.1", "-x"),
            cache_key("s", "sm_90", "13.0", "-y"),
            cache_key("s\0sm_90", "", "13.0", "-x"),
        ] {
            assert_ne!(base, other);
        }
        assert_eq!(base.len(), 64);
    }
}
