//! Fault injection on a real GPU, to test fault isolation where it matters:
//! `TENSORTUNE_INJECT_FAULTS=oob:3,hang:7` makes the 3rd tuning task this worker sends to its
//! measuring child write out of bounds and the 7th never finish.
//!
//! Tasks are counted from 1 per worker (each GPU of `cuda:all` counts its own), in the order the
//! measure stage sends them to the child; finalist tasks and drift-reference measurements do not
//! count, nor do tasks that never reach the GPU. Every generated source starts with
//! `#ifndef TT_FAULT_HOOK / #define TT_FAULT_HOOK / #endif` and the GEMM kernel runs
//! `TT_FAULT_HOOK;` first, so a fault is one `#define` put before that task's source, compiled
//! through the pool like any kernel (cached under its own source hash). The faulty kernel keeps its
//! name and launch shape; its record says `launch_error` (an illegal address poisons the child's
//! context) or `timeout` (the deadline kills the child). The `sim` device runs no kernel: it
//! ignores these (its own faults are `SimFault`s).

use std::fmt;

/// The environment variable the daemon reads the faults from.
pub(crate) const INJECT_FAULTS_ENV: &str = "TENSORTUNE_INJECT_FAULTS";

/// What an injected fault does on the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FaultKind {
    /// One thread writes 2^40 elements past the start of the output: an illegal address.
    Oob,
    /// Thread 0 of every block sleeps forever; the block's other threads wait for it.
    Hang,
}

impl FaultKind {
    /// The name in [`INJECT_FAULTS_ENV`].
    fn name(self) -> &'static str {
        match self {
            FaultKind::Oob => "oob",
            FaultKind::Hang => "hang",
        }
    }

    /// The statement `TT_FAULT_HOOK` becomes (the GEMM kernel's output parameter is `D`).
    fn statement(self) -> &'static str {
        match self {
            FaultKind::Oob => "if (threadIdx.x == 0 && blockIdx.x == 0) { D[(size_t)1 << 40] = D[0]; }",
            FaultKind::Hang => "if (threadIdx.x == 0) { for (;;) { asm volatile(\"nanosleep.u32 1000;\"); } }",
        }
    }

    /// `source` with this fault in its kernel: the hook's definition, then the source unchanged.
    pub(crate) fn inject(self, source: &str) -> String {
        format!("#define TT_FAULT_HOOK {}\n{source}", self.statement())
    }
}

/// One fault: what, and in which task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Fault {
    pub(crate) kind: FaultKind,
    /// The task's 1-based number among the tuning tasks sent to the child.
    pub(crate) task: u64,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.kind.name(), self.task)
    }
}

/// Parses `oob:3,hang:7` (whitespace allowed; empty means none).
pub(crate) fn parse(text: &str) -> Result<Vec<Fault>, String> {
    let mut faults: Vec<Fault> = Vec::new();
    for item in text.split(',').map(str::trim).filter(|item| !item.is_empty()) {
        let bad = |why: &str| format!("invalid {INJECT_FAULTS_ENV} entry {item:?}: {why}; expected e.g. oob:3,hang:7");
        let (kind, task) = item.split_once(':').ok_or_else(|| bad("no task number"))?;
        let kind = match kind.trim() {
            "oob" => FaultKind::Oob,
            "hang" => FaultKind::Hang,
            _ => return Err(bad("the fault is oob or hang")),
        };
        let task = task.trim().parse::<u64>().ok().filter(|&n| n > 0).ok_or_else(|| bad("tasks count from 1"))?;
        if let Some(other) = faults.iter().find(|f| f.task == task) {
            return Err(bad(&format!("task {task} already gets {other}")));
        }
        faults.push(Fault { kind, task });
    }
    Ok(faults)
}

/// The faults in [`INJECT_FAULTS_ENV`] (none when unset).
pub(crate) fn from_env() -> Result<Vec<Fault>, String> {
    match std::env::var(INJECT_FAULTS_ENV) {
        Ok(text) => parse(&text),
        Err(std::env::VarError::NotPresent) => Ok(Vec::new()),
        Err(e) => Err(format!("{INJECT_FAULTS_ENV}: {e}")),
    }
}

/// Counts the tuning tasks sent to the child and says which fault, if any, each one gets.
#[derive(Debug, Default)]
pub(crate) struct Injector {
    faults: Vec<Fault>,
    sent: u64,
}

impl Injector {
    pub(crate) fn new(faults: Vec<Fault>) -> Injector {
        Injector { faults, sent: 0 }
    }

    /// Counts the next task; the fault it gets, with its number.
    pub(crate) fn next_task(&mut self) -> Option<Fault> {
        self.sent += 1;
        self.faults.iter().copied().find(|f| f.task == self.sent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nvrtc;
    use tensortune_kernels::gemm::WmmaGemm;
    use tensortune_kernels::{Target, Template as _, template};

    #[test]
    fn faults_parse_from_the_variable() {
        let faults = parse(" oob:3, hang:7,").unwrap();
        assert_eq!(faults, vec![Fault { kind: FaultKind::Oob, task: 3 }, Fault { kind: FaultKind::Hang, task: 7 }]);
        assert_eq!(faults.iter().map(Fault::to_string).collect::<Vec<_>>(), ["oob:3", "hang:7"]);
        assert_eq!(parse("").unwrap(), Vec::new());
        for (bad, why) in [
            ("oob", "no task number"),
            ("oob:0", "from 1"),
            ("oob:x", "from 1"),
            ("boom:3", "oob or hang"),
            ("oob:3,hang:3", "already gets oob:3"),
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains(INJECT_FAULTS_ENV) && e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn the_injector_counts_tasks_from_one() {
        let mut injector = Injector::new(parse("oob:2,hang:4").unwrap());
        let kinds: Vec<_> = (0..5).map(|_| injector.next_task().map(|f| f.kind)).collect();
        assert_eq!(kinds, [None, Some(FaultKind::Oob), None, Some(FaultKind::Hang), None]);
    }

    #[test]
    fn an_injected_source_differs_only_by_the_define_and_compiles() {
        let (workload, config) = template::drift_reference();
        let spec = WmmaGemm.generate(&workload, &config, &Target::sm90()).unwrap();
        assert!(spec.source.contains("#ifndef TT_FAULT_HOOK") && spec.source.contains("TT_FAULT_HOOK;"));
        let include = nvrtc::find_include_dir().expect("the CUDA headers (scripts/setup-nvrtc.sh)");
        let plain = nvrtc::compile(&spec.source, &spec.name, "sm_90", &include).unwrap().cubin;
        for kind in [FaultKind::Oob, FaultKind::Hang] {
            let injected = kind.inject(&spec.source);
            let (define, rest) = injected.split_once('\n').unwrap();
            assert_eq!(rest, spec.source);
            assert_eq!(define, format!("#define TT_FAULT_HOOK {}", kind.statement()));
            let compiled = nvrtc::compile(&injected, &spec.name, "sm_90", &include);
            let cubin = compiled.unwrap_or_else(|e| panic!("{kind:?}: {e}")).cubin;
            assert_ne!(cubin, plain, "{kind:?}: the hook reached the kernel");
        }
    }
}
