//! `tensortune selftest`: the flags turned into a [`Selection`], the worker's self-test run on the
//! chosen device, a line per failing kernel as it comes, then a table (template, workload,
//! configs, ok, failed, statuses of the failures) and, with `--json`, the whole report.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::Context as _;
use tensortune_kernels::Workload;
use tensortune_worker::DeviceSpec;
use tensortune_worker::protocol::Status;
use tensortune_worker::selftest::{self, Check, Report, Selection};

use crate::cli::SelftestArgs;

/// Validated flags.
#[derive(Debug)]
pub struct Args {
    selection: Selection,
    device: DeviceSpec,
    json: Option<PathBuf>,
    verbose: bool,
}

impl TryFrom<&SelftestArgs> for Args {
    type Error = anyhow::Error;

    fn try_from(a: &SelftestArgs) -> anyhow::Result<Args> {
        let device: DeviceSpec = a.device.parse()?;
        anyhow::ensure!(device.is_single(), "--device {}: the self-test runs on one device, cuda:N or sim", a.device);
        let workloads = a
            .workload
            .iter()
            .map(|k| Workload::from_key(k).with_context(|| format!("--workload {k:?}")))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let knob = match &a.knob {
            Some(spec) => {
                let (name, value) = spec
                    .split_once(':')
                    .ok_or_else(|| anyhow::anyhow!("--knob {spec:?}: expected NAME:VALUE, e.g. producer:inline"))?;
                Some((name.to_owned(), value.to_owned()))
            }
            None => None,
        };
        let selection = Selection {
            template: a.template.clone(),
            dtypes: a.dtype.clone(),
            workloads,
            knob,
            config: a.config.clone(),
            configs: a.configs,
            samples: a.samples,
            no_baseline: a.no_baseline,
            hold_s: a.hold,
            energy: a.energy,
            listed: match &a.list {
                Some(path) => {
                    let text =
                        std::fs::read_to_string(path).with_context(|| format!("reading --list {}", path.display()))?;
                    selftest::parse_listed(&text).with_context(|| format!("--list {}", path.display()))?
                }
                None => Vec::new(),
            },
            regime: a.regime,
        };
        selftest::validate(&selection)?;
        Ok(Args { selection, device, json: a.json.clone(), verbose: a.verbose })
    }
}

/// Runs the self-test, prints what it found, writes the JSON; fails when any kernel failed.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let verbose = args.verbose || args.selection.config.is_some() || !args.selection.listed.is_empty();
    let mut on_check = |c: &Check| {
        if verbose || c.status != Status::Ok {
            println!("{}", check_line(c));
        }
    };
    let report = selftest::run(&args.selection, &args.device, &mut on_check)?;
    print!("{}", table(&report));
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report)?;
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    let failed = report.failed();
    anyhow::ensure!(failed == 0, "{failed} of {} kernels or workloads failed", failed + report.ok());
    anyhow::ensure!(report.ok() > 0, "nothing was checked: every workload was skipped (see the list above)");
    Ok(())
}

/// One kernel: what it is, its status, its time and the vendor's, its error.
fn check_line(c: &Check) -> String {
    let mut line = format!(
        "{} {} #{} {} {}: {}",
        c.template,
        c.workload,
        c.index,
        c.kernel,
        c.config,
        selftest::status_name(c.status)
    );
    if c.status == Status::Ok {
        let _ = write!(line, " {:.2} us", c.median_us);
        if let Some(b) = c.baseline_us {
            let _ = write!(line, " (vendor {b:.2} us, {})", c.baseline_kind);
        }
        if let Some(e) = c.max_abs_err {
            let _ = write!(line, " max err {e:.3e}");
        }
    } else {
        let first: String = c.error.lines().take(6).collect::<Vec<_>>().join(" | ");
        let _ = write!(line, " {}", first.chars().take(600).collect::<String>());
    }
    line
}

/// The device line, one row per (template, workload), the skipped pairs and a total.
pub fn table(report: &Report) -> String {
    let f = &report.device;
    let mut out = format!(
        "device: {} ({}), sm_{}, {} SMs, driver {}, nvrtc {}; outputs {}\n",
        f.target.name,
        f.target.class_key,
        f.target.arch,
        f.target.sm_count,
        f.driver_version,
        report.nvrtc.as_deref().unwrap_or("?"),
        if report.verified {
            "checked against the reference"
        } else {
            "not checked (sim: generated, compiled, accepted)"
        }
    );
    let width = report.rows.iter().map(|r| r.workload.len()).max().unwrap_or(8).max(8);
    let _ = writeln!(
        out,
        "{:<14} {:<width$} {:>7} {:>4} {:>6}  failures",
        "template", "workload", "configs", "ok", "failed"
    );
    for r in &report.rows {
        let failures: Vec<String> = r.failures.iter().map(|(s, n)| format!("{s}:{n}")).collect();
        let _ = writeln!(
            out,
            "{:<14} {:<width$} {:>7} {:>4} {:>6}  {}",
            r.template,
            r.workload,
            r.configs,
            r.ok,
            r.failed,
            failures.join(" ")
        );
    }
    for s in &report.skipped {
        let _ = writeln!(out, "skipped {} on {}: {}", s.workload, s.template, s.reason);
    }
    let templates: std::collections::BTreeSet<&str> = report.rows.iter().map(|r| r.template.as_str()).collect();
    let _ = writeln!(
        out,
        "total: {} ok, {} failed, over {} workloads and {} templates ({} pairs skipped)",
        report.ok(),
        report.failed(),
        report.rows.iter().map(|r| r.workload.as_str()).collect::<std::collections::BTreeSet<_>>().len(),
        templates.len(),
        report.skipped.len()
    );
    out
}
