//! `tensortune replay`: tuners against recorded measurements. For each workload of the record file
//! and each tuner, the medians over seeds of the trials needed to come within 5% and 2% of the
//! best recorded time, and of the best found over the true best.

use std::sync::Arc;

use anyhow::Context;
use serde::Serialize;
use tensortune_search::replay::{Dataset, Holdout, Summary, summarise};

use crate::cli::ReplayArgs;

/// One row of the table.
#[derive(Debug, Serialize)]
pub struct Row {
    /// Workload key.
    pub workload: String,
    /// Tuner.
    pub tuner: String,
    /// Whether other workloads' records trained its model.
    pub transfer: bool,
    /// Configs in the recorded space.
    pub space: usize,
    /// Median trials to within 5% of the best (budget + 1: not reached).
    pub trials_to_5pct: usize,
    /// Median trials to within 2%.
    pub trials_to_2pct: usize,
    /// Median best found / true best.
    pub best_found: f64,
    /// Seeds.
    pub seeds: u64,
}

impl From<Summary> for Row {
    fn from(s: Summary) -> Self {
        Row {
            workload: s.workload,
            tuner: s.tuner,
            transfer: s.transfer,
            space: s.space,
            trials_to_5pct: s.to_5,
            trials_to_2pct: s.to_2,
            best_found: s.final_ratio,
            seeds: s.seeds,
        }
    }
}

/// Runs the comparison and prints the table.
pub fn run(args: &ReplayArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.seeds >= 1 && args.seeds <= 1000, "invalid --seeds {}; allowed 1 ..= 1000", args.seeds);
    anyhow::ensure!(args.batch >= 1 && args.batch <= 4096, "invalid --batch {}; allowed 1 ..= 4096", args.batch);
    anyhow::ensure!(args.budget >= 1, "invalid --budget 0; it must be at least 1");
    for t in &args.tuner {
        tensortune_search::tuner::by_name(t, 0, None).with_context(|| format!("invalid --tuner {t:?}"))?;
    }
    let names = args.records.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ");
    let data = Dataset::load_all(&args.records).with_context(|| format!("cannot replay {names}"))?;
    if args.holdout {
        return holdout(args, &data, &names);
    }
    if !args.prior_sizes.is_empty() {
        return learning_curve(args, &data, &names);
    }
    let mut rows = Vec::new();
    println!(
        "{:<52} {:<8} {:>8} {:>6} {:>9} {:>9} {:>9}",
        "workload", "tuner", "transfer", "space", "to 5%", "to 2%", "best/true"
    );
    for w in &data.workloads {
        if args.workload.as_ref().is_some_and(|f| !w.key.contains(f.as_str())) {
            continue;
        }
        let mut runs: Vec<(String, Option<Arc<_>>)> = args.tuner.iter().map(|t| (t.clone(), None)).collect();
        if args.transfer {
            let prior = data.prior_for(w);
            if !prior.is_empty() {
                runs.push(("model".into(), Some(Arc::new(prior))));
            }
        }
        for (tuner, prior) in runs {
            let s = summarise(w, &tuner, prior, args.seeds, args.budget, args.batch)?;
            let cap = args.budget.min(s.space) + 1;
            let show = |v: usize| if v >= cap { "never".to_owned() } else { v.to_string() };
            println!(
                "{:<52} {:<8} {:>8} {:>6} {:>9} {:>9} {:>9.3}",
                s.workload,
                s.tuner,
                if s.transfer { "yes" } else { "no" },
                s.space,
                show(s.to_5),
                show(s.to_2),
                s.final_ratio
            );
            rows.push(Row::from(s));
        }
    }
    anyhow::ensure!(
        !rows.is_empty(),
        "--workload {:?} matches no workload of {}",
        args.workload.as_deref().unwrap_or(""),
        names
    );
    if let Some(path) = &args.json {
        crate::commands::write_json(path, &rows)?;
    }
    Ok(())
}

/// One held-out workload in the `--holdout` JSON.
#[derive(Debug, Serialize)]
pub struct HoldoutRow {
    /// Random search over the whole space.
    pub random: Row,
    /// Each tuner, with how many times fewer trials than random it needed to come within 5%.
    pub tuners: Vec<(Row, f64)>,
}

/// One workload's learning curve: (other workloads in the store, median trials to 2%).
#[derive(Debug, Serialize)]
pub struct CurveRow {
    /// Workload key.
    pub workload: String,
    /// Configs in the recorded space.
    pub space: usize,
    /// (count of other workloads in the prior, median trials to within 2%), by count.
    pub trials_to_2pct: Vec<(usize, usize)>,
}

/// `--prior-sizes`: per workload, trials to 2% against the size of the store.
fn learning_curve(args: &ReplayArgs, data: &Dataset, names: &str) -> anyhow::Result<()> {
    println!("learning curve of transfer: {names}; {} seeds, median trials to within 2%", args.seeds);
    let head: Vec<String> = args.prior_sizes.iter().map(|n| format!("{n:>6}")).collect();
    println!("{:<64} {:>6} {}", "workload / other workloads in the store:", "space", head.join(" "));
    let mut rows = Vec::new();
    for w in &data.workloads {
        if args.workload.as_ref().is_some_and(|f| !w.key.contains(f.as_str())) {
            continue;
        }
        let curve =
            tensortune_search::replay::learning_curve(data, w, &args.prior_sizes, args.seeds, args.budget, args.batch)?;
        let cells: Vec<String> = curve.iter().map(|(_, t)| format!("{t:>6}")).collect();
        println!("{:<64} {:>6} {}", w.key, w.candidates.len(), cells.join(" "));
        rows.push(CurveRow { workload: w.key.clone(), space: w.candidates.len(), trials_to_2pct: curve });
    }
    if let Some(path) = &args.json {
        crate::commands::write_json(path, &rows)?;
    }
    Ok(())
}

fn holdout(args: &ReplayArgs, data: &Dataset, names: &str) -> anyhow::Result<()> {
    let extra: Vec<String> = args.tuner.iter().filter(|t| *t != "random" && *t != "model").cloned().collect();
    println!("leave one workload out: {} workloads of {names}; {} seeds, medians", data.workloads.len(), args.seeds);
    println!(
        "{:<56} {:>6} {:>11} {:<16} {:>11} {:>7} {:>9}",
        "workload", "space", "random 5/2%", "tuner", "5%/2%", "gain 5%", "best/true"
    );
    let rows = tensortune_search::replay::holdout(
        data,
        &extra,
        args.workload.as_deref(),
        args.seeds,
        args.budget,
        args.batch,
    )?;
    anyhow::ensure!(
        !rows.is_empty(),
        "--workload {:?} matches no workload of {names}",
        args.workload.as_deref().unwrap_or("")
    );
    let label = |s: &Summary| {
        if s.tuner == "model" && s.transfer { "model+transfer".to_owned() } else { s.tuner.clone() }
    };
    for h in &rows {
        for (i, t) in h.tuners.iter().enumerate() {
            let cap = args.budget.min(t.space) + 1;
            let show = |v: usize| if v >= cap { "never".to_owned() } else { v.to_string() };
            let (workload, space, random) = if i == 0 {
                (h.random.workload.as_str(), h.random.space.to_string(), format!("{}/{}", h.random.to_5, h.random.to_2))
            } else {
                ("", String::new(), String::new())
            };
            println!(
                "{:<56} {:>6} {:>11} {:<16} {:>11} {:>6.1}x {:>9.3}",
                workload,
                space,
                random,
                label(t),
                format!("{}/{}", show(t.to_5), show(t.to_2)),
                h.gain_5(t),
                t.final_ratio
            );
        }
    }
    // Per tuner: the median and the lowest gain over the workloads, and on how many workloads it
    // came within 2% of the best within 100 trials.
    println!();
    println!("{:<16} {:>13} {:>11} {:>22}", "tuner", "median gain", "lowest", "within 2% in <=100");
    let names_of: Vec<String> = rows[0].tuners.iter().map(label).collect();
    for (i, name) in names_of.iter().enumerate() {
        let mut gains: Vec<f64> = rows.iter().filter_map(|h| h.tuners.get(i).map(|t| h.gain_5(t))).collect();
        gains.sort_by(f64::total_cmp);
        let within = rows.iter().filter(|h| h.tuners.get(i).is_some_and(|t| t.to_2 <= 100)).count();
        println!("{:<16} {:>12.1}x {:>10.1}x {:>18}/{}", name, gains[gains.len() / 2], gains[0], within, rows.len());
    }
    // Is the end-of-run "chance that an untried config is >= 2% faster" worth printing: what it
    // said against what the table shows, over every run of every workload.
    for (i, name) in names_of.iter().enumerate() {
        let chances: Vec<(f64, bool)> =
            rows.iter().filter_map(|h| h.tuners.get(i)).flat_map(|t| t.chances.iter().copied()).collect();
        if chances.is_empty() {
            continue;
        }
        let n = chances.len() as f64;
        let said = chances.iter().map(|c| c.0).sum::<f64>() / n;
        let was = chances.iter().filter(|c| c.1).count() as f64 / n;
        let brier = chances.iter().map(|(p, b)| (p - f64::from(u8::from(*b))).powi(2)).sum::<f64>() / n;
        println!(
            "{name}: at the end of a run, chance of a config >= 2% faster: said {:.0}% on average, was {:.0}% of {} runs (Brier {brier:.3})",
            said * 100.0,
            was * 100.0,
            chances.len()
        );
    }
    if let Some(path) = &args.json {
        let out: Vec<HoldoutRow> = rows
            .into_iter()
            .map(|h: Holdout| HoldoutRow {
                tuners: h.tuners.iter().map(|t| (Row::from(t.clone()), h.gain_5(t))).collect(),
                random: Row::from(h.random),
            })
            .collect();
        crate::commands::write_json(path, &out)?;
    }
    Ok(())
}
