//! `tensortune plot`: pictures of what was measured, as SVG or PNG (plotters).
//!
//! - convergence (`--job`, `--records`): for each job and workload, the best time so far against
//!   trials, with the vendor library's time as a line;
//! - the time-energy front (`--pareto` with `--job` or `--records`): for each job and workload,
//!   every trusted ok record with an energy as a point (time per launch, energy per launch), the
//!   Pareto front joined (no other record is both faster and cheaper), the vendor as a cross;
//! - speedups (`--bench`): a bench run's speedup over the vendor per workload, 1.0 marked;
//! - replay (`--replay`): tuners run again on recorded measurements, the median over seeds of the
//!   best found over the true best against trials, one line per tuner.
//!
//! Text is laid out with a TrueType font from the system (`$TENSORTUNE_FONT`, else the usual
//! font folders); SVG output names the family and the viewer draws it.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use anyhow::{Context, bail};
use plotters::coord::Shift;
use plotters::prelude::*;
use tensortune_proto::pb;
use tokio_stream::StreamExt;

use crate::bench::BenchReport;
use crate::cli::PlotArgs;
use crate::commands::{open, status_error};
use crate::report::RecordView;

/// Panels per picture at most (a grid); more workloads need `--workload`.
const MAX_PANELS: usize = 24;
/// Pixels of one panel.
const PANEL: (u32, u32) = (560, 360);

/// One workload's convergence: the best time so far after each trial that had one.
#[derive(Clone, Debug, PartialEq)]
pub struct Convergence {
    /// Job and workload, for the panel's title.
    pub title: String,
    /// Trials the job finished for the workload (measured, failed or reused).
    pub trials: usize,
    /// (trial, best ok time so far in microseconds), from the first ok trial on.
    pub best: Vec<(usize, f64)>,
    /// Median vendor time of the workload's ok records.
    pub vendor_us: Option<f64>,
}

/// `records` grouped by job and workload, the groups in the order they first appear.
fn by_job_and_workload<'a>(records: impl Iterator<Item = &'a RecordView>) -> Vec<((u64, String), Vec<&'a RecordView>)> {
    let mut groups: Vec<((u64, String), Vec<&RecordView>)> = Vec::new();
    for r in records {
        let key = (r.job_id, r.workload.clone());
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, rs)) => rs.push(r),
            None => groups.push((key, vec![r])),
        }
    }
    groups
}

/// Groups records by job and workload (in the order they first appear) and follows each group's
/// best trusted ok time in the order the records were stored. Finalists' re-measurements are not
/// trials and are left out.
pub fn convergence(records: &[RecordView]) -> Vec<Convergence> {
    by_job_and_workload(records.iter().filter(|r| !r.remeasure))
        .into_iter()
        .map(|((job, workload), mut rs)| {
            rs.sort_by_key(|r| r.id);
            let mut best = Vec::new();
            let mut so_far = f64::INFINITY;
            for (i, r) in rs.iter().enumerate() {
                if r.status == "ok" && r.untrusted.is_empty() && r.median_us > 0.0 && r.median_us < so_far {
                    so_far = r.median_us;
                    best.push((i + 1, so_far));
                }
            }
            // The line runs to the last trial at the final best.
            if let Some(&(_, last)) = best.last() {
                best.push((rs.len(), last));
            }
            let trusted_ok = rs.iter().filter(|r| r.status == "ok" && r.untrusted.is_empty());
            let vendor = median(trusted_ok.filter_map(|r| r.baseline_us).collect());
            Convergence {
                title: format!("job {job}: {}", short_key(&workload)),
                trials: rs.len(),
                best,
                vendor_us: vendor,
            }
        })
        .collect()
}

/// One workload's records on the time-energy plane.
#[derive(Clone, Debug, PartialEq)]
pub struct Pareto {
    /// Job and workload, for the panel's title.
    pub title: String,
    /// (time us, energy mJ) of every trusted ok tuning record that read an energy.
    pub points: Vec<(f64, f64)>,
    /// The front: the points no other is both faster and cheaper than, fastest first.
    pub front: Vec<(f64, f64)>,
    /// The vendor's (median time, median energy), when both were read.
    pub vendor: Option<(f64, f64)>,
}

/// Groups records by job and workload (in the order they first appear) and places each group's
/// trusted ok tuning records with a known energy on the time-energy plane, with its front.
pub fn pareto(records: &[RecordView]) -> Vec<Pareto> {
    by_job_and_workload(records.iter().filter(|r| !r.remeasure && r.status == "ok" && r.untrusted.is_empty()))
        .into_iter()
        .map(|((job, workload), rs)| {
            let points: Vec<(f64, f64)> =
                rs.iter().filter_map(|r| Some((r.median_us, r.power.energy_mj?))).filter(|p| p.0 > 0.0).collect();
            let front = tensortune_kernels::energy::pareto_front(&points).into_iter().map(|i| points[i]).collect();
            let vendor_us = median(rs.iter().filter_map(|r| r.baseline_us).collect());
            let vendor_mj = median(rs.iter().filter_map(|r| r.baseline_energy_mj).collect());
            Pareto {
                title: format!("job {job}: {}", short_key(&workload)),
                points,
                front,
                vendor: vendor_us.zip(vendor_mj),
            }
        })
        .collect()
}

/// One tuner's replay curve on one workload.
#[derive(Clone, Debug)]
pub struct ReplayCurve {
    /// Tuner label.
    pub tuner: String,
    /// Median over seeds of best found / true best after each trial (infinite before the
    /// first ok config).
    pub ratio: Vec<f64>,
}

/// The median of `v` (none when empty).
fn median(mut v: Vec<f64>) -> Option<f64> {
    v.retain(|x| x.is_finite());
    v.sort_by(f64::total_cmp);
    (!v.is_empty()).then(|| v[v.len() / 2])
}

/// A workload key without the default epilogue, for titles.
fn short_key(key: &str) -> String {
    key.trim_end_matches("/alpha=1,beta=0").to_owned()
}

/// The picture's format, from the output's extension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    Svg,
    Png,
}

fn format_of(path: &Path) -> anyhow::Result<Format> {
    match path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).as_deref() {
        Some("svg") => Ok(Format::Svg),
        Some("png") => Ok(Format::Png),
        _ => bail!("invalid --output {}: the name must end in .svg or .png", path.display()),
    }
}

/// `tensortune plot ...`
pub async fn run(tracker: Option<&str>, db: &Path, args: &PlotArgs) -> anyhow::Result<()> {
    let format = format_of(&args.output)?;
    let keep = |key: &str| args.workload.as_deref().is_none_or(|f| key.contains(f));
    let pictured = |records: &[RecordView]| {
        if args.pareto {
            let fronts: Vec<Pareto> = pareto(records).into_iter().filter(|p| keep(&p.title)).collect();
            anyhow::ensure!(
                fronts.iter().any(|p| !p.points.is_empty()),
                "no record here read an energy (workers without NVML, or records from before energy): nothing \
                 to place on the time-energy plane"
            );
            Ok(Picture::Pareto(fronts))
        } else {
            Ok(Picture::Convergence(convergence(records).into_iter().filter(|c| keep(&c.title)).collect()))
        }
    };
    anyhow::ensure!(
        !args.pareto || args.job.is_some() || !args.records.is_empty(),
        "--pareto draws the records of --job or --records"
    );
    let what = if let Some(job) = args.job {
        let records = job_records(tracker, db, job).await?;
        anyhow::ensure!(!records.is_empty(), "job {job} has no records yet");
        pictured(&records)?
    } else if !args.records.is_empty() {
        let mut records = Vec::new();
        for path in &args.records {
            records.extend(read_records(path)?);
        }
        pictured(&records)?
    } else if let Some(path) = &args.bench {
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read --bench {}", path.display()))?;
        let report: BenchReport = serde_json::from_str(&text)
            .with_context(|| format!("--bench {} is not a `tensortune bench` JSON", path.display()))?;
        let bars: Vec<(String, f64)> = report
            .rows
            .iter()
            .filter(|r| keep(&r.workload))
            .filter_map(|r| Some((short_key(&r.workload), r.speedup?)))
            .collect();
        Picture::Speedups { title: format!("{} on {}", report.suite, report.device_class), bars }
    } else {
        Picture::Replay(replay_curves(args, &keep)?)
    };
    let panels = what.panels();
    anyhow::ensure!(
        panels > 0,
        "nothing to plot{}",
        args.workload.as_ref().map_or(String::new(), |w| format!(" for --workload {w:?}"))
    );
    anyhow::ensure!(
        panels <= MAX_PANELS,
        "{panels} workloads to plot; at most {MAX_PANELS} fit in one picture: choose with --workload"
    );
    register_font()?;
    let size = what.size();
    match format {
        Format::Svg => draw(SVGBackend::new(&args.output, size).into_drawing_area(), &what)?,
        Format::Png => draw(BitMapBackend::new(&args.output, size).into_drawing_area(), &what)?,
    }
    eprintln!("wrote {}", args.output.display());
    Ok(())
}

/// What is drawn.
enum Picture {
    Convergence(Vec<Convergence>),
    Pareto(Vec<Pareto>),
    Speedups { title: String, bars: Vec<(String, f64)> },
    Replay(Vec<(String, Vec<ReplayCurve>)>),
}

impl Picture {
    fn panels(&self) -> usize {
        match self {
            Picture::Convergence(c) => c.len(),
            Picture::Pareto(p) => p.len(),
            Picture::Speedups { bars, .. } => usize::from(!bars.is_empty()),
            Picture::Replay(r) => r.len(),
        }
    }

    /// Rows and columns of the panel grid.
    fn grid(&self) -> (usize, usize) {
        let n = self.panels();
        let cols = (n as f64).sqrt().ceil() as usize;
        (n.div_ceil(cols), cols)
    }

    fn size(&self) -> (u32, u32) {
        if let Picture::Speedups { bars, .. } = self {
            return (900, 120 + 28 * bars.len() as u32);
        }
        let (rows, cols) = self.grid();
        (PANEL.0 * cols as u32, PANEL.1 * rows as u32)
    }
}

async fn job_records(tracker: Option<&str>, db: &Path, job: u64) -> anyhow::Result<Vec<RecordView>> {
    let mut session = open(tracker, db, None).await?;
    let result = async {
        let request = pb::ExportRecordsRequest { job_id: job, ..Default::default() };
        let mut stream = session.client.export_records(request).await.map_err(status_error)?.into_inner();
        let mut out = Vec::new();
        while let Some(r) = stream.next().await {
            out.push(RecordView::from(&r.map_err(status_error)?));
        }
        anyhow::Ok(out)
    }
    .await;
    session.close().await?;
    result
}

/// Reads `tensortune records export` output, plain or gzip-compressed (`.gz`).
fn read_records(path: &Path) -> anyhow::Result<Vec<RecordView>> {
    let file = std::fs::File::open(path).with_context(|| format!("cannot read --records {}", path.display()))?;
    let reader: Box<dyn Read> = if path.extension().is_some_and(|e| e == "gz") {
        Box::new(flate2::read::GzDecoder::new(file))
    } else {
        Box::new(file)
    };
    let mut out = Vec::new();
    for (i, line) in BufReader::new(reader).lines().enumerate() {
        let line = line.with_context(|| format!("reading {}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let record: RecordView = serde_json::from_str(&line)
            .with_context(|| format!("{} line {}: not a `tensortune records export` record", path.display(), i + 1))?;
        out.push(record);
    }
    Ok(out)
}

fn replay_curves(args: &PlotArgs, keep: &dyn Fn(&str) -> bool) -> anyhow::Result<Vec<(String, Vec<ReplayCurve>)>> {
    anyhow::ensure!(args.seeds >= 1 && args.seeds <= 1000, "invalid --seeds {}; allowed 1 ..= 1000", args.seeds);
    anyhow::ensure!(args.batch >= 1 && args.batch <= 4096, "invalid --batch {}; allowed 1 ..= 4096", args.batch);
    anyhow::ensure!(args.budget >= 1, "invalid --budget 0; it must be at least 1");
    for t in &args.tuner {
        tensortune_search::tuner::by_name(t, 0, None).with_context(|| format!("invalid --tuner {t:?}"))?;
    }
    let data = tensortune_search::replay::Dataset::load_all(&args.replay).context("cannot read --replay")?;
    let mut out = Vec::new();
    for w in data.workloads.iter().filter(|w| keep(&w.key)) {
        let mut curves = Vec::new();
        let mut runs: Vec<(String, String, Option<Arc<_>>)> =
            args.tuner.iter().map(|t| (t.clone(), t.clone(), None)).collect();
        if args.transfer {
            let prior = data.prior_for(w);
            if !prior.is_empty() {
                runs.push(("model".into(), "model+transfer".into(), Some(Arc::new(prior))));
            }
        }
        for (tuner, label, prior) in runs {
            let per_seed = (0..args.seeds)
                .map(|seed| tensortune_search::replay::curve(w, &tuner, seed, prior.clone(), args.budget, args.batch))
                .collect::<Result<Vec<_>, _>>()?;
            let len = per_seed.iter().map(Vec::len).max().unwrap_or(0);
            let ratio = (0..len)
                .map(|i| {
                    let mut at: Vec<f64> =
                        per_seed.iter().map(|c| c.get(i).or(c.last()).copied().unwrap_or(f64::INFINITY)).collect();
                    at.sort_by(f64::total_cmp);
                    at[at.len() / 2]
                })
                .collect();
            curves.push(ReplayCurve { tuner: label, ratio });
        }
        out.push((short_key(&w.key), curves));
    }
    Ok(out)
}

/// The font every picture's text is laid out with.
static FONT: OnceLock<PathBuf> = OnceLock::new();

/// Finds a TrueType font and registers it as plotters' "sans-serif".
fn register_font() -> anyhow::Result<()> {
    if FONT.get().is_some() {
        return Ok(());
    }
    let path = find_font().ok_or_else(|| {
        anyhow::anyhow!(
            "plot lays text out with a TrueType font and found none: set TENSORTUNE_FONT to a .ttf file, or \
             install one (Debian: apt-get install fonts-dejavu-core); searched {}",
            FONT_DIRS.join(", ")
        )
    })?;
    let bytes = std::fs::read(&path).with_context(|| format!("cannot read the font {}", path.display()))?;
    // plotters keeps fonts for the life of the process.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| anyhow::anyhow!("{} is not a TrueType font plotters can read", path.display()))?;
    let _ = FONT.set(path);
    Ok(())
}

const FONT_DIRS: [&str; 3] = ["/usr/share/fonts", "/usr/local/share/fonts", "~/.local/share/fonts"];
/// Fonts preferred when present, in order.
const PREFERRED: [&str; 5] =
    ["DejaVuSans.ttf", "LiberationSans-Regular.ttf", "NotoSans-Regular.ttf", "FreeSans.ttf", "Arial.ttf"];

fn find_font() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("TENSORTUNE_FONT").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_default();
    let mut found = Vec::new();
    for dir in FONT_DIRS {
        let dir = dir.strip_prefix("~/").map_or_else(|| PathBuf::from(dir), |rest| home.join(rest));
        collect_ttf(&dir, 4, &mut found);
    }
    let name = |p: &PathBuf| p.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_owned();
    PREFERRED.iter().find_map(|want| found.iter().find(|p| name(p) == *want).cloned()).or_else(|| {
        found.sort();
        found.into_iter().next()
    })
}

fn collect_ttf(dir: &Path, depth: u32, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() && depth > 0 {
            collect_ttf(&p, depth - 1, out);
        } else if p.extension().is_some_and(|x| x.eq_ignore_ascii_case("ttf")) {
            out.push(p);
        }
    }
}

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, what: &Picture) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let fail = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow::anyhow!("drawing the plot: {e:?}");
    root.fill(&WHITE).map_err(fail)?;
    match what {
        Picture::Convergence(list) => {
            let (rows, cols) = what.grid();
            for (area, c) in root.split_evenly((rows, cols)).iter().zip(list) {
                draw_convergence(area, c).map_err(fail)?;
            }
        }
        Picture::Pareto(list) => {
            let (rows, cols) = what.grid();
            for (area, p) in root.split_evenly((rows, cols)).iter().zip(list) {
                draw_pareto(area, p).map_err(fail)?;
            }
        }
        Picture::Speedups { title, bars } => draw_speedups(&root, title, bars).map_err(fail)?,
        Picture::Replay(list) => {
            let (rows, cols) = what.grid();
            for (area, (title, curves)) in root.split_evenly((rows, cols)).iter().zip(list) {
                draw_replay(area, title, curves).map_err(fail)?;
            }
        }
    }
    root.present().map_err(fail)?;
    Ok(())
}

type Drawn<DB> = Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

/// The y range of a panel holding `values`, with a little room.
fn y_range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values
        .filter(|v| v.is_finite() && *v > 0.0)
        .fold((f64::INFINITY, 0.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if !lo.is_finite() {
        return (0.1, 10.0);
    }
    let room = (hi - lo).max(lo * 0.05) * 0.08;
    ((lo - room).max(0.0), hi + room)
}

fn draw_convergence<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, c: &Convergence) -> Drawn<DB> {
    let (lo, hi) = y_range(c.best.iter().map(|p| p.1).chain(c.vendor_us));
    let mut chart = ChartBuilder::on(area)
        .caption(&c.title, ("sans-serif", 14))
        .margin(10)
        .x_label_area_size(32)
        .y_label_area_size(56)
        .build_cartesian_2d(1usize..c.trials.max(2), lo..hi)?;
    chart.configure_mesh().x_desc("trials").y_desc("best so far (us)").label_style(("sans-serif", 11)).draw()?;
    chart
        .draw_series(LineSeries::new(c.best.iter().copied(), BLUE.stroke_width(2)))?
        .label("best kernel")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], BLUE.stroke_width(2)));
    if let Some(v) = c.vendor_us {
        chart
            .draw_series(LineSeries::new(vec![(1, v), (c.trials.max(2), v)], RED.stroke_width(1)))?
            .label(format!("vendor {v:.2} us"))
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], RED));
    }
    chart
        .configure_series_labels()
        .label_font(("sans-serif", 11))
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

fn draw_pareto<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, p: &Pareto) -> Drawn<DB> {
    let (x_lo, x_hi) = y_range(p.points.iter().map(|q| q.0).chain(p.vendor.map(|v| v.0)));
    let (y_lo, y_hi) = y_range(p.points.iter().map(|q| q.1).chain(p.vendor.map(|v| v.1)));
    let mut chart = ChartBuilder::on(area)
        .caption(&p.title, ("sans-serif", 14))
        .margin(10)
        .x_label_area_size(32)
        .y_label_area_size(56)
        .build_cartesian_2d(x_lo..x_hi, y_lo..y_hi)?;
    chart
        .configure_mesh()
        .x_desc("time per launch (us)")
        .y_desc("energy per launch (mJ)")
        .label_style(("sans-serif", 11))
        .draw()?;
    chart
        .draw_series(p.points.iter().map(|&q| Circle::new(q, 2, BLUE.mix(0.4).filled())))?
        .label(format!("{} records", p.points.len()))
        .legend(|(x, y)| Circle::new((x + 8, y), 2, BLUE.mix(0.4).filled()));
    chart
        .draw_series(LineSeries::new(p.front.iter().copied(), BLUE.stroke_width(2)))?
        .label(format!("front ({} kernels)", p.front.len()))
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], BLUE.stroke_width(2)));
    chart.draw_series(p.front.iter().map(|&q| Circle::new(q, 4, BLUE.filled())))?;
    if let Some(v) = p.vendor {
        chart
            .draw_series(std::iter::once(Cross::new(v, 6, RED.stroke_width(2))))?
            .label(format!("vendor {:.2} us, {:.3} mJ", v.0, v.1))
            .legend(|(x, y)| Cross::new((x + 8, y), 4, RED.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .label_font(("sans-serif", 11))
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

fn draw_speedups<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, title: &str, bars: &[(String, f64)]) -> Drawn<DB> {
    let top = bars.iter().map(|b| b.1).fold(1.0f64, f64::max) * 1.15;
    let n = bars.len();
    let mut chart = ChartBuilder::on(area)
        .caption(format!("speedup over the vendor library: {title}"), ("sans-serif", 15))
        .margin(12)
        .x_label_area_size(32)
        .y_label_area_size(330)
        .build_cartesian_2d(0.0..top, 0.0..n as f64)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(n * 2 + 1)
        .y_label_formatter(&|y| {
            // Labels sit at the middle of each bar.
            let i = (y - 0.5).round();
            if (y - 0.5 - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < n {
                bars[n - 1 - i as usize].0.clone()
            } else {
                String::new()
            }
        })
        .x_desc("vendor time / our time")
        .label_style(("sans-serif", 11))
        .draw()?;
    chart.draw_series(bars.iter().enumerate().map(|(i, (_, s))| {
        let y = (n - 1 - i) as f64;
        let color = if *s >= 1.0 { GREEN.mix(0.7) } else { RGBColor(230, 140, 40).mix(0.8) };
        Rectangle::new([(0.0, y + 0.15), (*s, y + 0.85)], color.filled())
    }))?;
    chart.draw_series(bars.iter().enumerate().map(|(i, (_, s))| {
        let y = (n - 1 - i) as f64;
        Text::new(format!("{s:.2}x"), (*s, y + 0.35), ("sans-serif", 11))
    }))?;
    chart.draw_series(LineSeries::new(vec![(1.0, 0.0), (1.0, n as f64)], BLACK.stroke_width(1)))?;
    Ok(())
}

fn draw_replay<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, title: &str, curves: &[ReplayCurve]) -> Drawn<DB> {
    let trials = curves.iter().map(|c| c.ratio.len()).max().unwrap_or(2).max(2);
    // Ratios start far above 1 on big spaces; the interesting part is the last few tens of %.
    let hi =
        curves.iter().flat_map(|c| c.ratio.iter().copied()).filter(|r| r.is_finite()).fold(1.1f64, f64::max).min(3.0);
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 14))
        .margin(10)
        .x_label_area_size(32)
        .y_label_area_size(56)
        .build_cartesian_2d(1usize..trials, 0.99..hi)?;
    chart.configure_mesh().x_desc("trials").y_desc("best found / true best").label_style(("sans-serif", 11)).draw()?;
    let colors: [RGBColor; 5] = [BLUE, RED, RGBColor(0, 150, 0), MAGENTA, RGBColor(200, 130, 0)];
    let mut by_tuner: BTreeMap<usize, &ReplayCurve> = BTreeMap::new();
    by_tuner.extend(curves.iter().enumerate());
    for (i, c) in by_tuner {
        let color = colors[i % colors.len()];
        let points = c.ratio.iter().enumerate().filter(|(_, r)| r.is_finite()).map(|(t, r)| (t + 1, r.min(hi)));
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))?
            .label(c.tuner.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .label_font(("sans-serif", 11))
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: u64, job: u64, workload: &str, status: &str, us: f64, vendor: Option<f64>) -> RecordView {
        RecordView {
            id,
            task_id: id,
            job_id: job,
            workload: workload.into(),
            template: "wmma_gemm".into(),
            template_version: 6,
            config: serde_json::json!({}),
            config_index: id,
            device_class: "sim".into(),
            worker_id: 1,
            status: status.into(),
            error: String::new(),
            compile_ms: 0.0,
            measure_ms: 0.0,
            samples_us: vec![],
            median_us: us,
            spread: 0.0,
            batch: 1,
            baseline_us: vendor,
            baseline_kind: String::new(),
            vendor_algo: String::new(),
            speedup: 0.0,
            tflops: 0.0,
            max_abs_err: None,
            max_rel_err: None,
            registers: 0,
            smem_bytes: 0,
            cache_hit: false,
            remeasure: false,
            untrusted: String::new(),
            provenance: Default::default(),
            created_ms: 0,
            power: Default::default(),
            regime: "burst".into(),
            settle_ms: 0.0,
            steady: true,
            baseline_energy_mj: None,
        }
    }

    #[test]
    fn convergence_follows_the_best_trusted_time_per_job_and_workload() {
        let a = "matmul/m512n64k512/nn/f16,f32,f32/alpha=1,beta=0";
        let mut poisoned = record(4, 1, a, "ok", 0.5, Some(9.0));
        poisoned.untrusted = "faster than the device".into();
        let mut finalist = record(7, 1, a, "ok", 1.0, Some(9.0));
        finalist.remeasure = true;
        let records = vec![
            record(2, 1, a, "ok", 8.0, Some(10.0)),
            record(1, 1, a, "compile_error", 0.0, None),
            record(3, 1, a, "ok", 9.0, Some(11.0)),
            poisoned,
            record(5, 1, a, "ok", 6.0, Some(12.0)),
            record(6, 2, a, "ok", 7.0, None),
            finalist,
        ];
        let c = convergence(&records);
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].title, "job 1: matmul/m512n64k512/nn/f16,f32,f32");
        assert_eq!(c[0].trials, 5);
        // Stored order: the failed record is trial 1; the untrusted 0.5 us never counts.
        assert_eq!(c[0].best, vec![(2, 8.0), (5, 6.0), (5, 6.0)]);
        assert_eq!(c[0].vendor_us, Some(11.0));
        assert_eq!((c[1].trials, c[1].vendor_us), (1, None));
    }

    #[test]
    fn the_front_keeps_records_nothing_beats_on_both_time_and_energy() {
        let a = "matmul/m512n64k512/nn/f16,f32,f32/alpha=1,beta=0";
        let with = |id, us, mj: Option<f64>| {
            let mut r = record(id, 1, a, "ok", us, Some(9.0));
            r.power.energy_mj = mj;
            r.baseline_energy_mj = Some(6.0);
            r
        };
        let mut remeasured = with(9, 1.0, Some(0.1));
        remeasured.remeasure = true;
        let records = vec![
            with(1, 10.0, Some(5.0)),
            with(2, 11.0, Some(4.0)),
            with(3, 12.0, Some(4.5)),
            with(4, 9.5, None),
            with(5, 13.0, Some(3.0)),
            record(6, 1, a, "compile_error", 0.0, None),
            remeasured,
        ];
        let p = pareto(&records);
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].points.len(), 4, "ok tuning records that read an energy");
        assert_eq!(p[0].front, vec![(10.0, 5.0), (11.0, 4.0), (13.0, 3.0)]);
        assert_eq!(p[0].vendor, Some((9.0, 6.0)));
    }

    #[test]
    fn the_output_name_picks_the_format() {
        assert_eq!(format_of(Path::new("a.svg")).unwrap(), Format::Svg);
        assert_eq!(format_of(Path::new("a.PNG")).unwrap(), Format::Png);
        let e = format_of(Path::new("a.pdf")).unwrap_err().to_string();
        assert!(e.contains("--output") && e.contains(".svg or .png"), "{e}");
    }
}
