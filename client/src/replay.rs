//! `tensortune replay`: tuners against recorded measurements. For each workload of the record file
//! and each tuner, the medians over seeds of the trials needed to come within 5% and 2% of the
//! best recorded time, and of the best found over the true best.

use std::sync::Arc;

use anyhow::Context;
use serde::Serialize;
use tensortune_search::replay::{Dataset, Summary, summarise};

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
    let data = Dataset::load(&args.records).with_context(|| format!("cannot replay {}", args.records.display()))?;
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
        args.records.display()
    );
    if let Some(path) = &args.json {
        crate::commands::write_json(path, &rows)?;
    }
    Ok(())
}
