//! The batched NVRTC harness the compile tests share: every generated source is a shared preamble
//! plus one self-contained block in its own namespace (`kernels::cuda::PREAMBLE`), so a batch is
//! the preamble followed by the blocks, byte for byte as the worker compiles them one at a time.
//! Batches run on every core; a failing batch is recompiled kernel by kernel to name the culprit
//! with its log.

use std::path::PathBuf;
use std::sync::Mutex;

use tensortune_kernels::{Config, KernelSpec, Target, cuda};
use tensortune_worker::nvrtc;

const BATCH: usize = 16;

pub(crate) fn include_dir() -> PathBuf {
    nvrtc::find().unwrap_or_else(|why| panic!("{why} (scripts/test.sh installs NVRTC from PyPI)")).include_dir
}

/// Runs `work` on every batch of `specs` (BATCH kernels behind one preamble, byte for byte as the
/// worker compiles them one at a time) on all cores, and gathers the lines it returns.
fn each_batch<F>(specs: &[KernelSpec], work: F) -> Vec<String>
where
    F: Fn(&[KernelSpec], &str) -> Vec<String> + Sync,
{
    let batches: Vec<&[KernelSpec]> = specs.chunks(BATCH).collect();
    let next = Mutex::new(0usize);
    let found = Mutex::new(Vec::new());
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                loop {
                    let i = {
                        let mut n = next.lock().unwrap();
                        *n += 1;
                        *n - 1
                    };
                    let Some(batch) = batches.get(i) else { break };
                    let mut source = String::from(cuda::PREAMBLE);
                    for spec in *batch {
                        source.push_str(
                            spec.source.strip_prefix(cuda::PREAMBLE).expect("every source starts with the preamble"),
                        );
                    }
                    let lines = work(batch, &source);
                    found.lock().unwrap().extend(lines);
                }
            });
        }
    });
    found.into_inner().unwrap()
}

/// Compiles every spec for `arch`, in batches on all cores; returns "name: log" per failure. A
/// failing batch is recompiled kernel by kernel to name the culprit.
pub(crate) fn compile_all(specs: &[KernelSpec], arch: &str) -> Vec<String> {
    let inc = include_dir();
    each_batch(specs, |batch, source| {
        if nvrtc::compile(source, "batch", arch, &inc).is_ok() {
            return Vec::new();
        }
        batch
            .iter()
            .filter_map(|spec| {
                let e = nvrtc::compile(&spec.source, &spec.name, arch, &inc).err()?;
                Some(format!("{} ({arch}): {e}", spec.name))
            })
            .collect()
    })
}

/// Compiles every spec for `target` ([`compile_all`]) and fails naming each kernel that did not
/// compile, with its log.
pub(crate) fn assert_all_compile(specs: &[KernelSpec], target: &Target) {
    let failures = compile_all(specs, &target.nvrtc_arch());
    assert!(
        failures.is_empty(),
        "{} of {} kernels failed on {}:\n{}",
        failures.len(),
        specs.len(),
        target.name,
        failures.join("\n\n")
    );
}

/// [`assert_all_compile`], then fails naming each kernel that spills registers ([`spills`]).
pub(crate) fn assert_all_compile_without_spills(specs: &[KernelSpec], target: &Target) {
    assert_all_compile(specs, target);
    let spilled = spills(specs, &target.nvrtc_arch());
    assert!(spilled.is_empty(), "{} of {} kernels spill:\n{}", spilled.len(), specs.len(), spilled.join("\n"));
}

/// ptxas's spill warnings for `specs` on `arch` (compiled in batches with
/// `--ptxas-options=--warn-on-spills`): one line per kernel that spills registers to local memory,
/// naming it. Compile errors are [`compile_all`]'s business; a batch that fails here is reported
/// as a line too.
pub(crate) fn spills(specs: &[KernelSpec], arch: &str) -> Vec<String> {
    let inc = include_dir();
    each_batch(specs, |_, source| {
        match nvrtc::compile_with(source, "batch", arch, &inc, &["--ptxas-options=--warn-on-spills"]) {
            Ok(c) => c.log.lines().filter(|l| l.contains("spill")).map(|l| format!("{arch}: {l}")).collect(),
            Err(e) => vec![format!("{arch}: a batch failed to compile: {e}")],
        }
    })
}

/// The value of `constexpr int NAME = V;` in a generated source (panics when it has none).
pub(crate) fn header_int(source: &str, name: &str) -> u64 {
    let prefix = format!("constexpr int {name} = ");
    let value = source.lines().find_map(|l| l.trim().strip_prefix(prefix.as_str()));
    value.unwrap_or_else(|| panic!("no {name} in the source")).trim_end_matches(';').parse().unwrap()
}

/// Whether a generated source sets `constexpr bool NAME = true;`.
pub(crate) fn header_flag(source: &str, name: &str) -> bool {
    source.contains(&format!("constexpr bool {name} = true;"))
}

/// The kind of a wgmma config the compile tests sample by: producer, schedule, cluster,
/// persistence, stream-K and epilogue (the knobs that change the generated code's shape).
pub(crate) fn wgmma_kind(c: &Config) -> String {
    let name = |k| c.name(k).unwrap_or("").to_owned();
    let int = |k| c.int(k).unwrap_or(0);
    format!(
        "{}/{}/{}/{}/{}/{}",
        name("producer"),
        name("schedule"),
        int("cluster"),
        int("persistent"),
        int("stream_k"),
        name("epilogue")
    )
}
