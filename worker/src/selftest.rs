//! The correctness self-test of the templates on one device, in this process (`tensortune
//! selftest`): for each workload of a matrix that covers every template x input type x layout (and
//! the conv load paths), a spread of valid configs is generated, compiled with NVRTC for the
//! device's architecture, and measured through the device's [`Executor`], which on a GPU checks
//! every output element against the float64 reference before and after the timed launches.
//!
//! On `sim` nothing runs: a config passes when it generates, compiles and the sim accepts its
//! cubin, which is what CI can check without a GPU; [`Report::verified`] says which kind of pass
//! a report holds.
//!
//! [`run`] does the work; [`Selection`] says what to check; [`matrix`] is the default set of
//! workloads; [`Report`] holds one [`Row`] per (template, workload) and one [`Check`] per kernel.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;

use anyhow::Context as _;
use serde::Serialize;
use tensortune_kernels::energy::Regime;
use tensortune_kernels::registry;
use tensortune_kernels::support::{self, Tolerance};
use tensortune_kernels::template::{Template, valid_configs};
use tensortune_kernels::{Config, DType, KernelSpec, Space, Target, Workload};

use crate::config::DeviceSpec;
use crate::protocol::{Device, Executor, Launch, MeasureOutcome, MeasureRequest, Status};
use crate::{nvrtc, plan};

/// Configs checked per (template, workload) unless told otherwise.
pub const DEFAULT_CONFIGS: usize = 4;
/// Timing samples per kernel unless told otherwise (the check runs before and after them).
pub const DEFAULT_SAMPLES: u32 = 3;

/// What to check.
#[derive(Clone, Debug)]
pub struct Selection {
    /// Only this template (its name); workloads it does not support are skipped and listed.
    /// Without it, every template that supports a workload checks it.
    pub template: Option<String>,
    /// Only workloads with these input types (none: every type).
    pub dtypes: Vec<DType>,
    /// These workloads instead of [`matrix`].
    pub workloads: Vec<Workload>,
    /// Only configs whose knob `.0` has the value `.1` (needs `template`: knobs are per template).
    pub knob: Option<(String, String)>,
    /// This one config (JSON) instead of a spread (needs exactly one workload).
    pub config: Option<String>,
    /// Configs per (template, workload).
    pub configs: usize,
    /// Timing samples per kernel.
    pub samples: u32,
    /// Leave the vendor library out of the process (for compute-sanitizer, whose racecheck
    /// otherwise reports inside the vendor's kernels).
    pub no_baseline: bool,
    /// Run each kernel back to back this long before its samples, seconds (0: not held): the
    /// steady loop a sustained record is checked against, with its clock and power a point a
    /// second in the report.
    pub hold_s: f64,
    /// Read each kernel's energy after its samples (the one-second window records read).
    pub energy: bool,
    /// These kernels instead of a spread per workload: to time chosen kernels (a job's finalists,
    /// say) of several workloads in one process. Their workloads and templates are the ones
    /// checked; `workloads`, `template`, `knob` and `config` must be unset.
    pub listed: Vec<Listed>,
    /// The clock regime each kernel is timed in, as a job's trial in that regime: sustained
    /// settles under the kernel by the records' rule (at most the cap a trial waits), reads the
    /// energy, reports the time over the energy window and times the vendor settled under itself
    /// (with the workload's first kernel). Burst (the default) is the plain timing; with
    /// `energy` it idles after the window as a burst record does.
    pub regime: Regime,
}

/// One kernel of [`Selection::listed`].
#[derive(Clone, Debug, PartialEq)]
pub struct Listed {
    /// The workload.
    pub workload: Workload,
    /// The template's name.
    pub template: String,
    /// The config, JSON.
    pub config: String,
}

/// The kernels of a list file: one a line, `WORKLOAD_KEY<TAB>TEMPLATE<TAB>CONFIG_JSON` (blank
/// lines and lines starting with `#` are skipped). Errors name the line.
pub fn parse_listed(text: &str) -> anyhow::Result<Vec<Listed>> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let mut parts = line.splitn(3, '\t');
        let (Some(key), Some(template), Some(config)) = (parts.next(), parts.next(), parts.next()) else {
            anyhow::bail!("line {}: expected WORKLOAD_KEY<TAB>TEMPLATE<TAB>CONFIG_JSON, got {line:?}", n + 1);
        };
        let workload = Workload::from_key(key).with_context(|| format!("line {}: workload {key:?}", n + 1))?;
        registry::by_name(template).with_context(|| format!("line {}", n + 1))?;
        Config::from_json(config).with_context(|| format!("line {}: config {config:?}", n + 1))?;
        out.push(Listed { workload, template: template.to_owned(), config: config.to_owned() });
    }
    anyhow::ensure!(!out.is_empty(), "the list names no kernel");
    Ok(out)
}

/// The longest `--hold`, seconds.
pub const MAX_HOLD_S: f64 = 600.0;

impl Default for Selection {
    fn default() -> Selection {
        Selection {
            template: None,
            dtypes: Vec::new(),
            workloads: Vec::new(),
            knob: None,
            config: None,
            configs: DEFAULT_CONFIGS,
            samples: DEFAULT_SAMPLES,
            no_baseline: false,
            hold_s: 0.0,
            energy: false,
            listed: Vec::new(),
            regime: Regime::Burst,
        }
    }
}

/// One kernel's outcome.
#[derive(Clone, Debug, Serialize)]
pub struct Check {
    /// Template name.
    pub template: String,
    /// Workload key.
    pub workload: String,
    /// The config's index in the template's space.
    pub index: u64,
    /// The config, canonical JSON.
    pub config: String,
    /// The kernel's name.
    pub kernel: String,
    /// Outcome class.
    pub status: Status,
    /// Why it failed (compile log, first mismatch, fault), cut to 2,000 characters; empty when ok.
    pub error: String,
    /// Median time of the kernel, microseconds (the analytic model's on `sim`).
    pub median_us: f64,
    /// Every timing sample, microseconds a launch (a sustained kernel's median is the time over
    /// its energy window instead: see `timing`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub samples_us: Vec<f64>,
    /// The vendor library's time for the workload, microseconds, when it was timed.
    pub baseline_us: Option<f64>,
    /// Which vendor call that was.
    pub baseline_kind: String,
    /// Worst absolute error of the output check (none on `sim`).
    pub max_abs_err: Option<f64>,
    /// Worst relative error.
    pub max_rel_err: Option<f64>,
    /// SM clock just before the timed samples, MHz (0 when unknown).
    pub sm_clock_mhz: u32,
    /// With `energy`: energy per launch, mean power and clock, temperature after the samples.
    #[serde(flatten)]
    pub power: crate::energy::Power,
    /// With `hold_s`: how long the kernel ran before its samples, milliseconds.
    pub settle_ms: f64,
    /// With `hold_s`: clock and power a point a second while it ran.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub trace: Vec<crate::energy::StatePoint>,
}

/// The outcome of one (template, workload): how many configs, how many passed, and the statuses
/// of those that did not.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// Template name.
    pub template: String,
    /// Workload key.
    pub workload: String,
    /// Configs checked.
    pub configs: usize,
    /// Configs that passed.
    pub ok: usize,
    /// Configs (or, for a workload that could not be set up, the workload) that failed.
    pub failed: usize,
    /// Count per failure status (`compile_error`, `wrong_result`, ...).
    pub failures: BTreeMap<String, usize>,
}

/// A (template, workload) that was not checked, and why.
#[derive(Clone, Debug, Serialize)]
pub struct Skipped {
    /// Template name.
    pub template: String,
    /// Workload key.
    pub workload: String,
    /// Why.
    pub reason: String,
}

/// Everything a self-test found.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The device.
    pub device: Device,
    /// NVRTC's version.
    pub nvrtc: Option<String>,
    /// Whether outputs were checked against a reference (a GPU), or only generated, compiled and
    /// accepted (`sim`).
    pub verified: bool,
    /// One row per (template, workload) checked.
    pub rows: Vec<Row>,
    /// Every kernel.
    pub checks: Vec<Check>,
    /// What was left out, and why.
    pub skipped: Vec<Skipped>,
}

impl Report {
    /// Kernels (or workloads) that failed.
    pub fn failed(&self) -> usize {
        self.rows.iter().map(|r| r.failed).sum()
    }

    /// Kernels that passed.
    pub fn ok(&self) -> usize {
        self.rows.iter().map(|r| r.ok).sum()
    }
}

/// Fails when `selection` asks for something that cannot be: an unknown template, a knob or value
/// the template does not have, a config without exactly one workload, no configs. Errors name the
/// flag and what is allowed.
pub fn validate(selection: &Selection) -> anyhow::Result<()> {
    anyhow::ensure!(selection.configs >= 1, "--configs {}: must be at least 1", selection.configs);
    anyhow::ensure!(selection.samples >= 1, "--samples {}: must be at least 1", selection.samples);
    anyhow::ensure!(
        (0.0..=MAX_HOLD_S).contains(&selection.hold_s),
        "--hold {}: seconds, 0 to {MAX_HOLD_S}",
        selection.hold_s
    );
    let template = selection.template.as_deref().map(registry::by_name).transpose()?;
    if let Some((knob, value)) = &selection.knob {
        let Some(template) = template else {
            anyhow::bail!("--knob {knob}:{value} needs --template (each template has its own knobs)");
        };
        check_knob(template.space(), template.name(), knob, value)?;
    }
    if let Some(config) = &selection.config {
        anyhow::ensure!(
            selection.workloads.len() == 1,
            "--config needs exactly one --workload (got {})",
            selection.workloads.len()
        );
        Config::from_json(config).with_context(|| format!("--config {config:?}"))?;
    }
    if !selection.listed.is_empty() {
        let with = [
            (!selection.workloads.is_empty(), "--workload"),
            (selection.template.is_some(), "--template"),
            (selection.knob.is_some(), "--knob"),
            (selection.config.is_some(), "--config"),
        ];
        if let Some((_, flag)) = with.iter().find(|(set, _)| *set) {
            anyhow::bail!("--list names its kernels' workloads, templates and configs; drop {flag}");
        }
    }
    anyhow::ensure!(
        selection.regime == Regime::Burst || selection.hold_s == 0.0,
        "--regime sustained settles each kernel by the records' rule; --hold runs it a fixed time: give one"
    );
    Ok(())
}

/// Runs the self-test on `device` (`cuda:N` or `sim`), calling `on_check` after each kernel (to
/// print progress). `Err` only when it cannot run at all (bad selection, no NVRTC or CUDA headers,
/// the device does not open); failing kernels are in the report.
pub fn run(selection: &Selection, device: &DeviceSpec, on_check: &mut dyn FnMut(&Check)) -> anyhow::Result<Report> {
    validate(selection)?;
    anyhow::ensure!(
        nvrtc::available(),
        "libnvrtc was not found: the self-test compiles every kernel (put the CUDA toolkit's lib64, or \
         scripts/setup-nvrtc.sh's lib, on LD_LIBRARY_PATH)"
    );
    let include = nvrtc::find_include_dir()
        .ok_or_else(|| anyhow::anyhow!("the CUDA headers were not found; set TENSORTUNE_CUDA_INCLUDE"))?;
    let open = || -> anyhow::Result<Box<dyn Executor>> {
        match device {
            DeviceSpec::Cuda(ordinal) => Ok(Box::new(
                crate::cuda::CudaExecutor::new(*ordinal).with_context(|| format!("opening cuda:{ordinal}"))?,
            )),
            DeviceSpec::Sim => Ok(Box::new(crate::sim::SimExecutor::new(Vec::new()))),
            other => anyhow::bail!("--device {other:?}: the self-test runs on one device, cuda:N or sim"),
        }
    };
    let mut exec = open()?;
    let facts = exec.facts();
    let target = facts.target.clone();
    let arch = target.nvrtc_arch();
    let chosen = selection.template.as_deref().map(registry::by_name).transpose()?;
    let workloads = if !selection.listed.is_empty() {
        let mut seen = Vec::new();
        for l in &selection.listed {
            if !seen.contains(&l.workload) {
                seen.push(l.workload);
            }
        }
        seen
    } else if selection.workloads.is_empty() {
        matrix()
    } else {
        selection.workloads.clone()
    };
    let workloads: Vec<Workload> = workloads
        .into_iter()
        .filter(|w| selection.dtypes.is_empty() || selection.dtypes.contains(&w.types().input))
        .collect();
    anyhow::ensure!(!workloads.is_empty(), "no workload has an input type of {:?}", selection.dtypes);

    let mut report = Report {
        device: facts,
        nvrtc: nvrtc::version(),
        verified: !matches!(device, DeviceSpec::Sim),
        rows: Vec::new(),
        checks: Vec::new(),
        skipped: Vec::new(),
    };
    // Workloads go in chunks: every kernel of a chunk, and each workload's support module, is
    // compiled on every core at once, then measured one by one on the device.
    let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
    let ctx = Context { target: &target, selection, open: &open };
    let mut task_id = 0u64;
    for chunk in workloads.chunks(CHUNK) {
        let mut sources = Vec::new();
        let plans: Vec<Planned<'_>> =
            chunk.iter().filter_map(|w| plan_workload(w, chosen, &ctx, &mut report, &mut sources, on_check)).collect();
        let images = compile_all(&sources, &arch, &include, threads);
        for planned in &plans {
            measure_workload(planned, &images, &ctx, &mut report, &mut task_id, &mut exec, on_check)?;
        }
    }
    Ok(report)
}

/// Workloads whose kernels are compiled together before they are measured: enough to keep every
/// core busy, few enough that the cubins held at once stay small.
const CHUNK: usize = 16;

/// What every workload of a run shares.
struct Context<'a> {
    target: &'a Target,
    selection: &'a Selection,
    /// Opens the device (again, after a sticky error poisoned its context).
    open: &'a dyn Fn() -> anyhow::Result<Box<dyn Executor>>,
}

/// A workload's kernels, generated, with their places in the compile list.
struct Planned<'w> {
    workload: &'w Workload,
    key: String,
    /// The support module's place in the compile list.
    support: usize,
    groups: Vec<(&'static dyn Template, Vec<Kernel>)>,
}

/// One config of a template for a workload.
struct Kernel {
    index: u64,
    config: Config,
    /// The generated kernel and its place in the compile list, or why it could not be generated.
    spec: Result<(KernelSpec, usize), String>,
}

/// The templates and configs that check `w`, their sources appended to `sources` (a name and a
/// source each); `None` when nothing of `w` is to be measured (what was left out, and why, is in
/// `report`).
fn plan_workload<'w>(
    w: &'w Workload,
    chosen: Option<&'static dyn Template>,
    ctx: &Context<'_>,
    report: &mut Report,
    sources: &mut Vec<(String, String)>,
    on_check: &mut dyn FnMut(&Check),
) -> Option<Planned<'w>> {
    let (target, selection) = (ctx.target, ctx.selection);
    let key = w.key();
    let (mut templates, unsupported) = templates_for(w, chosen, target);
    if !selection.listed.is_empty() {
        templates.retain(|t| selection.listed.iter().any(|l| l.workload == *w && l.template == t.name()));
    }
    // Without a chosen template, templates that do not take a workload are no news.
    if chosen.is_some() {
        for (t, reason) in unsupported {
            report.skipped.push(Skipped { template: t, workload: key.clone(), reason });
        }
    }
    if templates.is_empty() {
        if chosen.is_none() {
            report.rows.push(failed_row("-", &key, "unsupported"));
        }
        return None;
    }
    let mut groups = Vec::new();
    for t in templates {
        match pick(t, w, target, selection) {
            Ok(configs) if configs.is_empty() => {
                let reason = match &selection.knob {
                    Some((knob, value)) => format!("no valid config has {knob}={value}"),
                    None => "no valid config".to_owned(),
                };
                report.skipped.push(Skipped { template: t.name().into(), workload: key.clone(), reason });
            }
            Ok(configs) => {
                let kernels = configs
                    .into_iter()
                    .map(|(index, config)| {
                        let spec = t.generate(w, &config, target).map_err(|e| e.to_string()).map(|spec| {
                            sources.push((spec.name.clone(), spec.source.clone()));
                            (spec, sources.len() - 1)
                        });
                        Kernel { index, config, spec }
                    })
                    .collect();
                groups.push((t, kernels));
            }
            Err(e) => {
                let check = Check {
                    template: t.name().into(),
                    workload: key.clone(),
                    index: 0,
                    config: selection.config.clone().unwrap_or_default(),
                    kernel: String::new(),
                    status: Status::InvalidConfig,
                    error: format!("{e:#}"),
                    median_us: 0.0,
                    samples_us: Vec::new(),
                    baseline_us: None,
                    baseline_kind: String::new(),
                    max_abs_err: None,
                    max_rel_err: None,
                    sm_clock_mhz: 0,
                    power: Default::default(),
                    settle_ms: 0.0,
                    trace: Vec::new(),
                };
                on_check(&check);
                report.checks.push(check);
                report.rows.push(failed_row(t.name(), &key, "invalid_config"));
            }
        }
    }
    if groups.is_empty() {
        return None;
    }
    sources.push(("support".into(), support::source(w)));
    Some(Planned { workload: w, key, support: sources.len() - 1, groups })
}

/// Compiles every `(name, source)` on `threads` threads; the cubins, or the compile errors, in order.
fn compile_all(
    sources: &[(String, String)],
    arch: &str,
    include: &std::path::Path,
    threads: usize,
) -> Vec<Result<Vec<u8>, String>> {
    let next = AtomicUsize::new(0);
    let mut out: Vec<Option<Result<Vec<u8>, String>>> = (0..sources.len()).map(|_| None).collect();
    std::thread::scope(|s| {
        let (tx, rx) = mpsc::channel();
        for _ in 0..threads.min(sources.len()) {
            let (tx, next) = (tx.clone(), &next);
            s.spawn(move || {
                loop {
                    let at = next.fetch_add(1, Ordering::Relaxed);
                    let Some((name, source)) = sources.get(at) else { break };
                    let image = nvrtc::compile(source, name, arch, include).map(|c| c.cubin).map_err(|e| e.to_string());
                    if tx.send((at, image)).is_err() {
                        break;
                    }
                }
            });
        }
        drop(tx);
        for (at, image) in rx {
            out[at] = Some(image);
        }
    });
    out.into_iter().map(|r| r.unwrap_or_else(|| Err("the compile thread stopped before this kernel".into()))).collect()
}

/// Measures the kernels of `planned` one by one, adding a row per template to `report`.
fn measure_workload(
    planned: &Planned<'_>,
    images: &[Result<Vec<u8>, String>],
    ctx: &Context<'_>,
    report: &mut Report,
    task_id: &mut u64,
    exec: &mut Box<dyn Executor>,
    on_check: &mut dyn FnMut(&Check),
) -> anyhow::Result<()> {
    let (target, selection) = (ctx.target, ctx.selection);
    let (w, key) = (planned.workload, &planned.key);
    let support = match &images[planned.support] {
        Ok(image) => image,
        Err(e) => {
            tracing::warn!(workload = %key, "the support module failed to compile: {e}");
            for (t, _) in &planned.groups {
                report.rows.push(failed_row(t.name(), key, "support_compile_error"));
            }
            return Ok(());
        }
    };
    for (template, kernels) in &planned.groups {
        let mut row = Row {
            template: template.name().into(),
            workload: key.clone(),
            configs: kernels.len(),
            ok: 0,
            failed: 0,
            failures: BTreeMap::new(),
        };
        for k in kernels {
            let check = |status, error: &str, o: Option<&MeasureOutcome>| Check {
                template: template.name().into(),
                workload: key.clone(),
                index: k.index,
                config: k.config.to_json(),
                kernel: k.spec.as_ref().map(|(s, _)| s.name.clone()).unwrap_or_default(),
                status,
                error: error.chars().take(2000).collect(),
                median_us: o.map_or(0.0, |o| o.median_us),
                samples_us: o.map(|o| o.samples_us.clone()).unwrap_or_default(),
                baseline_us: o.and_then(|o| o.baseline_us),
                baseline_kind: o.map(|o| o.baseline_kind.clone()).unwrap_or_default(),
                max_abs_err: o.and_then(|o| o.max_abs_err),
                max_rel_err: o.and_then(|o| o.max_rel_err),
                sm_clock_mhz: o.map_or(0, |o| o.sm_clock_mhz),
                power: o.map(|o| o.power).unwrap_or_default(),
                settle_ms: o.map_or(0.0, |o| o.settle_ms),
                trace: o.map(|o| o.trace.clone()).unwrap_or_default(),
            };
            let done = match &k.spec {
                Err(e) => check(Status::InvalidConfig, e, None),
                Ok((spec, at)) => match &images[*at] {
                    Err(e) => check(Status::CompileError, e, None),
                    Ok(cubin) => {
                        // The support module (and the vendor's time) go with the workload's first
                        // kernel on this device context.
                        let first = !exec.support_loaded().contains(key);
                        let sustained = selection.regime == Regime::Sustained;
                        let request = MeasureRequest {
                            task_id: *task_id,
                            workload: *w,
                            workload_key: key.clone(),
                            launch: Launch::of(spec),
                            cubin: cubin.clone(),
                            support_cubin: if first { support.clone() } else { Vec::new() },
                            tolerance: Tolerance::for_workload(w),
                            samples: selection.samples,
                            min_sample_ms: 1.0,
                            min_batch: 50,
                            sample_launches: 0,
                            flush_l2: false,
                            baseline: first && !selection.no_baseline,
                            // Sustained: the vendor's pick timed again, settled under itself.
                            fresh_baseline: sustained,
                            repick_baseline: false,
                            regime: selection.regime,
                            settle_cap_ms: if sustained { plan::SETTLE_CAP_MS } else { 0.0 },
                            hold_ms: selection.hold_s * 1e3,
                            // A sustained time is the one over the energy window (see `timing`).
                            energy_ms: if selection.energy || sustained { crate::energy::MIN_WINDOW_MS } else { 0.0 },
                            start_uncapped: false,
                            baseline_first: false,
                            model_us: template.model_us(w, &k.config, target).unwrap_or(0.0),
                            vendor_model_us: plan::vendor_time(w),
                        };
                        *task_id += 1;
                        let o = exec.measure(&request);
                        if exec.poisoned() {
                            tracing::warn!(workload = %key, kernel = %spec.name, "the device context is poisoned; reopening it");
                            *exec = (ctx.open)()?;
                        }
                        check(o.status, &o.error, Some(&o))
                    }
                },
            };
            if done.status == Status::Ok {
                row.ok += 1;
            } else {
                row.failed += 1;
                *row.failures.entry(status_name(done.status)).or_default() += 1;
            }
            on_check(&done);
            report.checks.push(done);
        }
        report.rows.push(row);
    }
    Ok(())
}

/// The templates that check `w`: the chosen one, else every template of its op that supports it
/// on `target`; and the (template, reason) of those that do not.
fn templates_for(
    w: &Workload,
    chosen: Option<&'static dyn Template>,
    target: &Target,
) -> (Vec<&'static dyn Template>, Vec<(String, String)>) {
    let candidates = match chosen {
        Some(t) => vec![t],
        None => registry::templates_for(w.op()),
    };
    let mut yes = Vec::new();
    let mut no = Vec::new();
    for t in candidates {
        match t.supports(w, target) {
            Ok(()) => yes.push(t),
            Err(e) => no.push((t.name().to_owned(), e.to_string())),
        }
    }
    (yes, no)
}

/// The configs to check: the one given, or a spread of the valid ones (those with the knob's value
/// when a knob is given).
fn pick(
    template: &dyn Template,
    w: &Workload,
    target: &Target,
    selection: &Selection,
) -> anyhow::Result<Vec<(u64, Config)>> {
    if let Some(json) = &selection.config {
        let config = Config::from_json(json)?;
        let index = template.space().index_of(&config)?;
        template.check(w, &config, target)?;
        return Ok(vec![(index, config)]);
    }
    if !selection.listed.is_empty() {
        let mut out = Vec::new();
        for l in selection.listed.iter().filter(|l| l.workload == *w && l.template == template.name()) {
            let config = Config::from_json(&l.config)?;
            let index = template.space().index_of(&config)?;
            template.check(w, &config, target)?;
            out.push((index, config));
        }
        return Ok(out);
    }
    let valid = valid_configs(template, w, target)?;
    let valid: Vec<(u64, Config)> = match &selection.knob {
        Some((knob, value)) => {
            valid.into_iter().filter(|(_, c)| c.0.get(knob).is_some_and(|v| v.to_string() == *value)).collect()
        }
        None => valid,
    };
    Ok(spread(&valid, selection.configs).into_iter().cloned().collect())
}

fn failed_row(template: &str, workload: &str, status: &str) -> Row {
    Row {
        template: template.into(),
        workload: workload.into(),
        configs: 0,
        ok: 0,
        failed: 1,
        failures: BTreeMap::from([(status.to_owned(), 1)]),
    }
}

/// The status as records spell it (`wrong_result`): its serde name.
pub fn status_name(status: Status) -> String {
    serde_json::to_value(status)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("{status:?}"))
}

/// Fails unless `knob` is a knob of the template's space and `value` one of its values, naming
/// what is allowed (a misspelt filter would otherwise keep nothing and check nothing).
fn check_knob(space: Space, template: &str, knob: &str, value: &str) -> anyhow::Result<()> {
    let Some(k) = space.knobs.iter().find(|k| k.name == knob) else {
        let names: Vec<_> = space.knobs.iter().map(|k| k.name).collect();
        anyhow::bail!("--knob {knob}:{value}: {template} has no knob {knob:?}; its knobs are {}", names.join(", "));
    };
    let values: Vec<String> = k.values.iter().map(|v| v.to_string()).collect();
    anyhow::ensure!(
        values.iter().any(|v| v == value),
        "--knob {knob}:{value}: {template}'s {knob} takes {}, not {value:?}",
        values.join(", ")
    );
    Ok(())
}

/// `per` configs of `valid`: evenly spaced over the space, and round-robin over the kinds of
/// config that run different code (conv path and gather, split-K and its reduction; wgmma
/// producer, schedule, cluster, persistence, stream-K and epilogue), so that every kind a workload
/// allows is checked.
fn spread(valid: &[(u64, Config)], per: usize) -> Vec<&(u64, Config)> {
    let kind = |c: &Config| {
        let name = |k| c.name(k).unwrap_or("").to_owned();
        let split = c.int("split_k").is_ok_and(|s| s > 1);
        let int = |k| c.int(k).map_or(String::new(), |v| v.to_string());
        (
            name("path"),
            name("gather"),
            if split { name("split_reduce") } else { String::new() },
            (name("producer"), name("schedule"), int("cluster"), int("persistent"), int("stream_k"), name("epilogue")),
        )
    };
    let mut kinds: BTreeMap<_, Vec<&(u64, Config)>> = BTreeMap::new();
    for v in valid {
        kinds.entry(kind(&v.1)).or_default().push(v);
    }
    // Each kind's share of the picks, evenly spaced over its configs (from the middle of each
    // stretch, so small and large tiles both come up), then taken in turns.
    let share = per.div_ceil(kinds.len().max(1));
    let queues: Vec<Vec<&(u64, Config)>> = kinds
        .into_values()
        .map(|g| {
            let step = (g.len() / share).max(1);
            g.into_iter().skip(step / 2).step_by(step).collect()
        })
        .collect();
    let mut out = Vec::new();
    let mut round = 0;
    while out.len() < per && queues.iter().any(|q| round < q.len()) {
        for q in &queues {
            if let Some(v) = q.get(round)
                && out.len() < per
            {
                out.push(*v);
            }
        }
        round += 1;
    }
    out.sort_by_key(|(i, _)| *i);
    out
}

/// The default workloads: every matmul input/output type combination x every layout x a square,
/// a skinny and two ragged shapes, and two epilogues that read C; the f32, tf32 and packed-integer
/// matmuls; every conv type x layers with padding, stride, dilation, ragged tiles, non-square
/// filters, pointwise layers and every load path of wgmma_conv2d. Each goes to every template that
/// supports it.
pub fn matrix() -> Vec<Workload> {
    let mut keys = Vec::new();
    for t in ["f16,f32,f32", "f16,f32,f16", "f16,f16,f16", "bf16,f32,f32", "bf16,f32,bf16", "i8,i32,i32"] {
        for layout in ["nn", "nt", "tn", "tt"] {
            // The ragged shapes: M and N not multiples of 16 (1000x1000: multiples of 8, for TMA
            // rows of 16 bytes; 1000x1001: odd N); K stays a multiple of 16 for i8.
            for (m, n, k) in [(256, 256, 256), (512, 32, 512), (1000, 1000, 1024), (1000, 1001, 1024)] {
                keys.push(format!("matmul/m{m}n{n}k{k}/{layout}/{t}/alpha=1,beta=0"));
            }
        }
    }
    // An epilogue that reads C, on an odd shape.
    keys.push("matmul/m200n136k264/tt/f16,f32,f32/alpha=0.5,beta=-1".into());
    keys.push("matmul/m96n80k128/nn/i8,i32,i32/alpha=2,beta=3".into());
    keys.extend(fused_matrix());
    keys.extend(conv_fused_matrix());
    keys.extend(types_matrix());
    keys.extend(conv_matrix());
    keys.iter().map(|k| Workload::from_key(k).expect("the self-test's workload keys are valid")).collect()
}

/// FP8 (tn, every output type, tensor scales, a ragged shape with C and a fused epilogue) and
/// every epilogue part and combination on bf16 (ragged, with C): `wgmma_gemm`'s (issue 36); the
/// other templates skip them with the reason.
fn fused_matrix() -> Vec<String> {
    let mut keys = Vec::new();
    for t in ["e4m3,f32,bf16", "e5m2,f32,f16", "e4m3,f32,f32"] {
        keys.push(format!("matmul/m256n256k256/tn/{t}/alpha=1,beta=0,scale=tensor"));
        keys.push(format!("matmul/m1000n1001k1024/tn/{t}/alpha=1,beta=1,scale=tensor,epi=bias+gelu"));
    }
    for epi in ["bias", "relu", "gelu", "bias+relu", "bias+gelu", "scale", "scale+bias+relu"] {
        keys.push(format!("matmul/m1000n1000k1024/tn/bf16,f32,bf16/alpha=1,beta=1,epi={epi}"));
    }
    keys
}

/// Conv2d epilogues per output channel (`wgmma_conv2d`'s; the other conv templates skip them with
/// the reason): bias+ReLU and ResNet's block end (residual + bias + ReLU) on each way the
/// activations load (TMA tiles, TMA im2col, gathered), output channels that fill no tile, and the
/// other parts on f32 and bf16 outputs.
fn conv_fused_matrix() -> Vec<String> {
    [
        "n2h14w14c64/k96r1s1/pad0x0,stride1x1,dil1x1/nhwc/f16,f32,f16/epi=bias+relu",
        "n2h14w14c64/k96r1s1/pad0x0,stride1x1,dil1x1/nhwc/f16,f32,f16/beta=1,epi=bias+relu",
        "n2h10w11c64/k40r3s3/pad1x1,stride1x1,dil1x1/nhwc/f16,f32,f16/beta=1,epi=bias+relu",
        "n3h9w9c16/k40r3s3/pad1x1,stride2x2,dil1x1/nhwc/bf16,f32,bf16/beta=1,epi=bias",
        "n1h13w17c32/k48r1s3/pad0x1,stride1x1,dil1x1/nhwc/f16,f32,f32/epi=scale+bias+gelu",
        "n2h12w9c32/k32r3s1/pad1x0,stride1x2,dil1x1/nhwc/f16,f32,f16/beta=1",
    ]
    .iter()
    .map(|k| format!("conv2d/{k}"))
    .collect()
}

/// f32 and tf32 (every layout, square, ragged with an epilogue reading C, and the types suite's
/// shapes in nn and tn) and the packed types s4, u4, b1xor, b1and (tn: large, skinny, square, a K
/// of one MMA step past a stage, an epilogue reading C).
fn types_matrix() -> Vec<String> {
    let mut keys = Vec::new();
    for t in ["f32,f32,f32", "tf32,f32,f32"] {
        for layout in ["nn", "tn"] {
            keys.push(format!("matmul/m1024n1024k1024/{layout}/{t}/alpha=1,beta=0"));
        }
        for layout in ["nn", "nt", "tn", "tt"] {
            keys.push(format!("matmul/m256n256k256/{layout}/{t}/alpha=1,beta=0"));
            keys.push(format!("matmul/m1000n72k260/{layout}/{t}/alpha=0.5,beta=-1"));
        }
    }
    for t in ["s4", "u4", "b1xor", "b1and"] {
        let k_step = if t.starts_with("b1") { 128 } else { 32 };
        for (m, n, k) in [(512, 64, 4096), (256, 256, 256), (1000, 72, 1024 + k_step)] {
            keys.push(format!("matmul/m{m}n{n}k{k}/tn/{t},i32,i32/alpha=1,beta=0"));
        }
        keys.push(format!("matmul/m200n136k{}/tn/{t},i32,i32/alpha=2,beta=3", 4 * k_step));
    }
    keys
}

/// A conv layer: (n, h, w, c, k, r, s, pad, stride, dilation), pad/stride/dilation as "HxW".
type ConvLayer = (u32, u32, u32, u32, u32, u32, u32, &'static str, &'static str, &'static str);

/// Conv layers: padding, stride 2, dilation 2, ragged output tiles (N*P*Q and K not multiples of
/// the tiles), 1x3 / 3x1 / 7x7 / 5x5 filters, pointwise layers and a strided 1x1, channels that
/// are a multiple of a K tile (wgmma_conv2d's TMA im2col loads) and channels that are not
/// (gathered), and three tuning layers; each in every type whose channel rule it meets (16 for the
/// 16-bit and 8-bit types, 4 for tf32, any for exact f32, which also gets 3 and 6 channels: 1- and
/// 2-float vectors).
fn conv_matrix() -> Vec<String> {
    const LAYERS: [ConvLayer; 19] = [
        (2, 7, 5, 16, 24, 3, 3, "1x1", "1x1", "1x1"),
        (3, 9, 9, 16, 40, 3, 3, "1x1", "2x2", "1x1"),
        (1, 10, 11, 16, 40, 3, 3, "2x2", "1x1", "2x2"),
        (1, 13, 17, 32, 48, 1, 3, "0x1", "1x1", "1x1"),
        (2, 12, 9, 32, 32, 3, 1, "1x0", "1x2", "1x1"),
        (1, 30, 30, 16, 64, 7, 7, "3x3", "2x2", "1x1"),
        (3, 5, 7, 32, 48, 1, 1, "0x0", "1x1", "1x1"),
        (4, 14, 14, 64, 96, 1, 1, "0x0", "2x2", "1x1"),
        (2, 10, 11, 64, 40, 3, 3, "2x2", "1x1", "2x2"),
        (3, 9, 9, 128, 48, 3, 3, "1x1", "2x2", "1x1"),
        (2, 12, 9, 128, 32, 3, 1, "1x0", "1x2", "1x1"),
        (1, 28, 28, 128, 256, 1, 1, "0x0", "1x1", "1x1"),
        (1, 14, 14, 256, 256, 3, 3, "1x1", "1x1", "1x1"),
        (1, 56, 56, 64, 128, 3, 3, "1x1", "2x2", "1x1"),
        (1, 13, 17, 12, 48, 1, 3, "0x1", "1x1", "1x1"),
        (1, 30, 30, 4, 64, 7, 7, "3x3", "2x2", "1x1"),
        (2, 12, 9, 96, 32, 3, 1, "1x0", "1x2", "1x1"),
        (2, 9, 7, 3, 20, 5, 5, "2x2", "1x1", "1x1"),
        (1, 12, 10, 6, 48, 3, 2, "1x0", "2x1", "1x2"),
    ];
    let types = [
        ("f16,f32,f32", 16),
        ("f16,f32,f16", 16),
        ("f16,f16,f16", 16),
        ("bf16,f32,f32", 16),
        ("i8,i32,i32", 16),
        ("tf32,f32,f32", 4),
        ("f32,f32,f32", 1),
    ];
    let mut keys = Vec::new();
    for (t, channels) in types {
        for (n, h, w, c, k, r, s, pad, stride, dil) in LAYERS {
            if c % channels == 0 {
                keys.push(format!("conv2d/n{n}h{h}w{w}c{c}/k{k}r{r}s{s}/pad{pad},stride{stride},dil{dil}/nhwc/{t}"));
            }
        }
    }
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_matrix_covers_every_template_input_type_and_layout() {
        let target = Target::sm90();
        let workloads = matrix();
        for t in registry::all() {
            let supported: Vec<_> = workloads.iter().filter(|w| t.supports(w, &target).is_ok()).collect();
            assert!(!supported.is_empty(), "{} checks no workload of the matrix", t.name());
        }
        for w in &workloads {
            let (yes, _) = templates_for(w, None, &target);
            assert!(!yes.is_empty(), "no template supports {}", w.key());
        }
        let keys: Vec<String> = workloads.iter().map(Workload::key).collect();
        for want in
            ["/nn/f16", "/nt/bf16", "/tn/i8", "/tt/f16", "/tn/s4", "/tn/b1xor", "/nn/tf32", "/nhwc/i8", "/nhwc/f32"]
        {
            assert!(keys.iter().any(|k| k.contains(want)), "{want} missing from the matrix");
        }
    }

    #[test]
    fn a_spread_takes_every_kind_of_config_before_a_second_of_any() {
        let target = Target::sm90();
        // A pointwise layer: wmma_conv2d runs it on both paths (implicit GEMM and plain matrix).
        let w = Workload::from_key("conv2d/n3h5w7c32/k48r1s1/pad0x0,stride1x1,dil1x1/nhwc/f16,f32,f32").unwrap();
        let t = registry::by_name("wmma_conv2d").unwrap();
        let valid = valid_configs(t, &w, &target).unwrap();
        let picked = spread(&valid, 6);
        assert_eq!(picked.len(), 6);
        let paths: std::collections::BTreeSet<_> = picked.iter().map(|(_, c)| c.name("path").unwrap_or("")).collect();
        assert!(paths.len() >= 2, "one path only: {paths:?}");
        assert!(picked.windows(2).all(|p| p[0].0 < p[1].0), "not in index order");
    }

    #[test]
    fn bad_selections_name_the_flag_and_what_is_allowed() {
        let knob = |k: &str, v: &str| Selection {
            template: Some("wgmma_gemm".into()),
            knob: Some((k.into(), v.into())),
            ..Selection::default()
        };
        let e = validate(&knob("nope", "1")).unwrap_err().to_string();
        assert!(e.contains("--knob") && e.contains("its knobs are"), "{e}");
        let e = validate(&knob("producer", "psychic")).unwrap_err().to_string();
        assert!(e.contains("producer") && e.contains("takes"), "{e}");
        let e = validate(&Selection { template: None, ..knob("producer", "tma") }).unwrap_err().to_string();
        assert!(e.contains("needs --template"), "{e}");
        let e = validate(&Selection { template: Some("wmma".into()), ..Selection::default() }).unwrap_err().to_string();
        assert!(e.contains("wmma_gemm"), "{e}");
        let e = validate(&Selection { config: Some("{}".into()), ..Selection::default() }).unwrap_err().to_string();
        assert!(e.contains("exactly one --workload"), "{e}");
        let e = validate(&Selection { configs: 0, ..Selection::default() }).unwrap_err().to_string();
        assert!(e.contains("--configs 0"), "{e}");
        for hold in [-1.0, 601.0, f64::NAN] {
            let e = validate(&Selection { hold_s: hold, ..Selection::default() }).unwrap_err().to_string();
            assert!(e.contains("--hold") && e.contains("0 to 600"), "{e}");
        }
        assert!(validate(&Selection { hold_s: 30.0, ..Selection::default() }).is_ok());
        let listed = parse_listed("matmul/m64n64k64/nn/f16,f32,f32/alpha=1,beta=0\twgmma_gemm\t{}").unwrap();
        let e = validate(&Selection {
            listed: listed.clone(),
            template: Some("wgmma_gemm".into()),
            ..Selection::default()
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("--list") && e.contains("--template"), "{e}");
        let e = validate(&Selection { hold_s: 30.0, regime: Regime::Sustained, ..Selection::default() })
            .unwrap_err()
            .to_string();
        assert!(e.contains("--hold") && e.contains("--regime sustained"), "{e}");
        assert!(validate(&Selection { listed, regime: Regime::Sustained, ..Selection::default() }).is_ok());
    }

    #[test]
    fn a_list_names_its_kernels_a_line_each_and_a_bad_line_by_number() {
        let key = "matmul/m64n64k64/nn/f16,f32,f32/alpha=1,beta=0";
        let text = format!("# finalists\n{key}\twgmma_gemm\t{{\"stages\": 3}}\n\n{key}\twmma_gemm\t{{}}\r\n");
        let listed = parse_listed(&text).unwrap();
        assert_eq!(listed.len(), 2);
        assert_eq!(listed[0].workload, Workload::from_key(key).unwrap());
        assert_eq!((listed[0].template.as_str(), listed[0].config.as_str()), ("wgmma_gemm", "{\"stages\": 3}"));
        assert_eq!((listed[1].template.as_str(), listed[1].config.as_str()), ("wmma_gemm", "{}"));
        for (bad, want) in [
            (format!("{key}\twgmma_gemm\t{{}}\n{key} wgmma_gemm {{}}"), "line 2"),
            (format!("{key}\tnope\t{{}}"), "line 1"),
            ("matmul/nope\twgmma_gemm\t{}".to_owned(), "line 1: workload"),
            (format!("{key}\twgmma_gemm\t{{"), "line 1: config"),
            ("# nothing\n".to_owned(), "no kernel"),
        ] {
            let e = format!("{:#}", parse_listed(&bad).unwrap_err());
            assert!(e.contains(want), "{bad:?}: {e}");
        }
    }
}
