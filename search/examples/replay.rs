//! Replay comparison without the CLI: `replay FILE [seeds] [budget] [batch] [tuners] [filter]`.
use std::sync::Arc;
use tensortune_search::replay::{Dataset, summarise};

const USAGE: &str = "usage: replay FILE [seeds=20] [budget=1000] [batch=16] [tuners=random,model,transfer] [filter]
  FILE: records (.jsonl or .jsonl.gz, e.g. search/testdata/*.jsonl.gz), or several, comma-separated;
  each workload of the first in turn is tuned with every other workload of them all as the prior of
  `transfer` (the model with that prior; every shipped file: a fresh tracker's cold start);
  filter keeps the workloads whose key contains it (`a|b`: either; `!a|b`: neither). Prints trials to within 5% and 2% of the best.";

fn main() -> anyhow::Result<()> {
    let a: Vec<String> = std::env::args().collect();
    if a.len() < 2 || a[1] == "--help" || a[1] == "-h" {
        println!("{USAGE}");
        return Ok(());
    }
    let seeds: u64 = a.get(2).map(|s| s.parse()).transpose()?.unwrap_or(20);
    let budget: usize = a.get(3).map(|s| s.parse()).transpose()?.unwrap_or(1000);
    let batch: usize = a.get(4).map(|s| s.parse()).transpose()?.unwrap_or(16);
    let tuners = a.get(5).cloned().unwrap_or("random,model,transfer".into());
    let filter = a.get(6).cloned().unwrap_or_default();
    let files: Vec<&str> = a[1].split(',').collect();
    let data = Dataset::load_all(&files)?;
    let tuned: Vec<String> =
        Dataset::load(std::path::Path::new(files[0]))?.workloads.into_iter().map(|w| w.key).collect();
    for w in data.workloads.iter().filter(|w| tuned.contains(&w.key) && keeps(&filter, &w.key)) {
        let prior = Arc::new(data.prior_for(w));
        for t in tuners.split(',') {
            let (name, p) = if t == "transfer" { ("model", Some(prior.clone())) } else { (t, None) };
            // Random over the whole space, so that its medians are never capped (as the tests run it).
            let budget = if name == "random" { w.candidates.len() } else { budget };
            let s = summarise(w, name, p, seeds, budget, batch)?;
            println!(
                "{:<50} {:<7} transfer={:<5} space={:<5} to5={:<5} to2={:<5} final={:.3}",
                s.workload, s.tuner, s.transfer, s.space, s.to_5, s.to_2, s.final_ratio
            );
        }
    }
    Ok(())
}

/// Whether `filter` keeps the workload `key`: `a|b` keeps keys holding either, `!a|b` keys holding neither.
fn keeps(filter: &str, key: &str) -> bool {
    match filter.strip_prefix('!') {
        Some(rest) => !rest.split('|').any(|f| !f.is_empty() && key.contains(f)),
        None => filter.split('|').any(|f| key.contains(f)),
    }
}
