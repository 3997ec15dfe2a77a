//! The learning curve of transfer without the CLI (as `tensortune replay --prior-sizes`):
//! `curve FILE [counts] [seeds] [budget] [filters] [json]`: per workload whose key starts with
//! one of `filters` (comma-separated prefixes; all when empty), the median over seeds of the
//! model tuner's trials to within 2% of the best with 0, 4, 8, 16 (`counts`) other workloads of
//! the file in its prior, each seed with its own random draw of them. Prints a table; writes the
//! rows as JSON to `json` when given. Batches of 16.
use tensortune_search::replay::{Dataset, learning_curve};

fn main() -> anyhow::Result<()> {
    let a: Vec<String> = std::env::args().collect();
    let file =
        a.get(1).ok_or_else(|| anyhow::anyhow!("usage: curve FILE [counts] [seeds] [budget] [filters] [json]"))?;
    let counts: Vec<usize> =
        a.get(2).map_or("0,4,8,16", String::as_str).split(',').map(str::parse).collect::<Result<_, _>>()?;
    let seeds: u64 = a.get(3).map(|s| s.parse()).transpose()?.unwrap_or(10);
    let budget: usize = a.get(4).map(|s| s.parse()).transpose()?.unwrap_or(300);
    anyhow::ensure!((1..=1000).contains(&seeds), "invalid seeds {seeds}; allowed 1 ..= 1000");
    anyhow::ensure!(budget >= 1, "invalid budget 0; it must be at least 1");
    let filters: Vec<&str> = a.get(5).map_or("", String::as_str).split(',').filter(|f| !f.is_empty()).collect();
    let data = Dataset::load(std::path::Path::new(file))?;
    let head: Vec<String> = counts.iter().map(|n| format!("{n:>6}")).collect();
    println!("{seeds} seeds, budget {budget}: median trials to 2% (budget + 1: never) by other workloads in the store");
    println!("{:<64} {:>6} {}", "workload", "space", head.join(" "));
    let mut rows = Vec::new();
    for w in data.workloads.iter().filter(|w| filters.is_empty() || filters.iter().any(|f| w.key.starts_with(f))) {
        let curve = learning_curve(&data, w, &counts, seeds, budget, 16)?;
        let cells: Vec<String> = curve.iter().map(|(_, t)| format!("{t:>6}")).collect();
        println!("{:<64} {:>6} {}", w.key, w.candidates.len(), cells.join(" "));
        rows.push(serde_json::json!({"workload": w.key, "space": w.candidates.len(), "trials_to_2pct": curve}));
    }
    if let Some(path) = a.get(6) {
        std::fs::write(path, serde_json::to_string_pretty(&rows)?)?;
    }
    Ok(())
}
