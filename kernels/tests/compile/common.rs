//! The batched NVRTC harness the compile tests share: every generated source is a shared preamble
//! plus one self-contained block in its own namespace (`kernels::cuda::PREAMBLE`), so a batch is
//! the preamble followed by the blocks, byte for byte as the worker compiles them one at a time.
//! Batches run on every core; a failing batch is recompiled kernel by kernel to name the culprit
//! with its log.

use std::path::PathBuf;
use std::sync::Mutex;

use tensortune_kernels::{Config, KernelSpec, Target, cuda};
use tensortune_nvrtc as nvrtc;

const BATCH: usize = 16;

pub(crate) fn include_dir() -> PathBuf {
    nvrtc::find().unwrap_or_else(|why| panic!("{why} (scripts/test.sh installs NVRTC from PyPI)")).include_dir
}

/// Runs `work` on every batch of `specs` (BATCH kernels behind one preamble, byte for byte as the
/// worker compiles them one at a time) on all cores, and gathers what it returns.
fn each_batch<T, F>(specs: &[KernelSpec], work: F) -> Vec<T>
where
    T: Send,
    F: Fn(&[KernelSpec], &str) -> Vec<T> + Sync,
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

/// Compiles every spec for `arch` with `extra` flags, in batches on all cores. Returns
/// "name: log" per kernel that failed (a failing batch is recompiled kernel by kernel to name the
/// culprit) and the log lines of the batches (and kernels) that compiled, for warnings.
fn compile_batches(specs: &[KernelSpec], arch: &str, extra: &[&str]) -> (Vec<String>, Vec<String>) {
    let inc = include_dir();
    let log = |log: &str| log.lines().map(|l| Ok(l.to_owned())).collect::<Vec<Result<String, String>>>();
    let lines = each_batch(specs, |batch, source| match nvrtc::compile_with(source, "batch", arch, &inc, extra) {
        Ok(c) => log(&c.log),
        Err(_) => batch
            .iter()
            .flat_map(|spec| match nvrtc::compile_with(&spec.source, &spec.name, arch, &inc, extra) {
                Ok(c) => log(&c.log),
                Err(e) => vec![Err(format!("{} ({arch}): {e}", spec.name))],
            })
            .collect(),
    });
    let (logs, failed): (Vec<_>, Vec<_>) = lines.into_iter().partition(Result::is_ok);
    (failed.into_iter().filter_map(Result::err).collect(), logs.into_iter().filter_map(Result::ok).collect())
}

/// Compiles every spec for `target` in batches on all cores and fails naming each kernel that did not
/// compile, with its log.
pub(crate) fn assert_all_compile(specs: &[KernelSpec], target: &Target) {
    let failures = compile_batches(specs, &target.nvrtc_arch(), &[]).0;
    assert_compiled(&failures, specs.len(), target);
}

/// [`assert_all_compile`] and ptxas's spill warnings in one compilation of each batch: fails naming each
/// kernel that did not compile, then each kernel that spills registers.
pub(crate) fn assert_all_compile_without_spills(specs: &[KernelSpec], target: &Target) {
    let arch = target.nvrtc_arch();
    let (failures, logs) = compile_batches(specs, &arch, &[WARN_ON_SPILLS]);
    assert_compiled(&failures, specs.len(), target);
    let spilled = spill_lines(logs, &arch);
    assert!(spilled.is_empty(), "{} of {} kernels spill:\n{}", spilled.len(), specs.len(), spilled.join("\n"));
}

/// Fails naming each kernel of `failures` (out of `n` compiled for `target`), with its log.
fn assert_compiled(failures: &[String], n: usize, target: &Target) {
    assert!(
        failures.is_empty(),
        "{} of {n} kernels failed on {}:\n{}",
        failures.len(),
        target.name,
        failures.join("\n\n")
    );
}

/// ptxas's option that writes a warning for each function that spills registers to local memory.
const WARN_ON_SPILLS: &str = "--ptxas-options=--warn-on-spills";

/// The spill warnings among NVRTC log lines, each prefixed with `arch`.
fn spill_lines(logs: Vec<String>, arch: &str) -> Vec<String> {
    logs.into_iter().filter(|l| l.contains("spill")).map(|l| format!("{arch}: {l}")).collect()
}

/// The value of `constexpr TY NAME = V;` in a generated source's `cfg` namespace (panics when it
/// has none). The lookup stops at the end of that namespace, a few KB into a source of 80 or more:
/// the tests that pick configs by their header read thousands of sources, and in this crate's
/// debug build a scan of each whole source cost more than generating it.
fn header_value<'a>(source: &'a str, ty: &str, name: &str) -> &'a str {
    let prefix = format!("constexpr {ty} {name} = ");
    let value = source
        .lines()
        .take_while(|l| !l.starts_with("}  // namespace cfg"))
        .find_map(|l| l.trim().strip_prefix(prefix.as_str()));
    value.unwrap_or_else(|| panic!("no {name} in the source's header")).trim_end_matches(';')
}

/// The value of `constexpr int NAME = V;` in a generated source (panics when it has none).
pub(crate) fn header_int(source: &str, name: &str) -> u64 {
    header_value(source, "int", name).parse().unwrap()
}

/// Whether a generated source sets `constexpr bool NAME = true;` (panics when it has no such flag).
pub(crate) fn header_flag(source: &str, name: &str) -> bool {
    match header_value(source, "bool", name) {
        "true" => true,
        "false" => false,
        v => panic!("{name} = {v} is not a bool"),
    }
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

/// `n` configs of `valid` for one workload of a sample: one from each of the `n` kinds (by `kind`)
/// that the sample has compiled least so far (`seen`, which counts them; ties in kind order from
/// `turn`), the config at a spot that moves with `turn` within its kind. Every kind a workload
/// offers is compiled before any is compiled twice, so a sample of a few configs a workload covers
/// every kind, and the types and layouts the kinds meet vary from one workload to the next.
pub(crate) fn least_seen_kinds(
    valid: &[(u64, Config)],
    kind: impl Fn(&Config) -> String,
    n: usize,
    turn: usize,
    seen: &mut std::collections::BTreeMap<String, usize>,
) -> Vec<Config> {
    let mut kinds: std::collections::BTreeMap<String, Vec<&Config>> = Default::default();
    for (_, c) in valid {
        kinds.entry(kind(c)).or_default().push(c);
    }
    let count = kinds.len().max(1);
    let mut order: Vec<(usize, usize, String)> = kinds
        .keys()
        .enumerate()
        .map(|(i, k)| (seen.get(k).copied().unwrap_or(0), (i + count - turn % count) % count, k.clone()))
        .collect();
    order.sort();
    order
        .into_iter()
        .take(n)
        .map(|(_, _, k)| {
            *seen.entry(k.clone()).or_insert(0) += 1;
            let group = &kinds[&k];
            group[(group.len() / 2 + 7 * turn) % group.len()].clone()
        })
        .collect()
}

/// Sampled kernels for sm_80 and sm_90 in turn: the first workload a test walks is generated for
/// sm_80, the next for sm_90, and so on, so both architectures see every kind of workload the walk
/// holds (each walk has more than one workload of a kind, taken in a row) at half the compiles of
/// both taking each. NVRTC's cost is the compile tests' time in CI.
pub(crate) struct InTurn {
    targets: [Target; 2],
    specs: [Vec<KernelSpec>; 2],
    turns: usize,
}

impl InTurn {
    pub(crate) fn new() -> InTurn {
        InTurn { targets: [Target::sm80(), Target::sm90()], specs: [Vec::new(), Vec::new()], turns: 0 }
    }

    /// The target of the next workload.
    pub(crate) fn target(&self) -> Target {
        self.targets[self.turns % 2].clone()
    }

    /// The next workload's kernels, generated for [`InTurn::target`].
    pub(crate) fn add(&mut self, specs: impl IntoIterator<Item = KernelSpec>) {
        self.specs[self.turns % 2].extend(specs);
        self.turns += 1;
    }

    /// Each architecture with its kernels, after checking it has at least `at_least` of them.
    pub(crate) fn each(&self, at_least: usize) -> impl Iterator<Item = (&Target, &[KernelSpec])> {
        self.targets.iter().zip(&self.specs).map(move |(t, s)| {
            assert!(s.len() >= at_least, "only {} sampled kernels for {}", s.len(), t.name);
            (t, s.as_slice())
        })
    }
}
