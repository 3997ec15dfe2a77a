//! Size of each template's valid space for workloads: `space KEY... [--sm80]`.
//!
//! `space --list TEMPLATE KEY [FILTER...]` prints every valid config of TEMPLATE for KEY instead,
//! one line each: the config, its grid, threads, shared memory, the blocks per SM its source
//! declares (`BLOCKS_PER_SM`, where it does) and the analytic time, fastest model first. FILTERs
//! (`"epilogue":"tma"`, say) keep the configs whose JSON holds every one of them: to pick configs
//! of a kind for a `hot` or A/B file before a GPU call.
use std::io::Write as _;

use tensortune_kernels::*;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let t = if args.iter().any(|a| a == "--sm80") { Target::sm80() } else { Target::sm90() };
    if args.first().map(String::as_str) == Some("--list") {
        if let Err(e) = list(&args[1..], &t) {
            eprintln!("space --list: {e}");
            std::process::exit(2);
        }
        return;
    }
    for key in args.iter().filter(|a| !a.starts_with("--")) {
        let w = match Workload::from_key(key) {
            Ok(w) => w,
            Err(e) => {
                println!("{key}: {e}");
                continue;
            }
        };
        for tpl in registry::templates_for(w.op()) {
            match template::valid_configs(tpl, &w, &t) {
                Ok(v) => println!("{key} {} {}", tpl.name(), v.len()),
                Err(e) => println!("{key} {}: {e}", tpl.name()),
            }
        }
    }
}

fn list(args: &[String], target: &Target) -> Result<()> {
    let [name, key, filters @ ..] = args else {
        return Err(Error::invalid("arguments", "expected --list TEMPLATE KEY [FILTER...]"));
    };
    let tpl = registry::by_name(name)?;
    let w = Workload::from_key(key)?;
    let filters: Vec<&String> = filters.iter().filter(|f| !f.starts_with("--")).collect();
    let mut rows = Vec::new();
    for (_, config) in template::valid_configs(tpl, &w, target)? {
        let json = config.to_json();
        if !filters.iter().all(|f| json.contains(f.as_str())) {
            continue;
        }
        let spec = tpl.generate(&w, &config, target)?;
        let per_sm = spec
            .source
            .lines()
            .find_map(|l| l.trim().strip_prefix("constexpr int BLOCKS_PER_SM = "))
            .map_or("-".to_string(), |v| v.trim_end_matches(';').to_string());
        let model = tpl.model_us(&w, &config, target).unwrap_or(f64::NAN);
        rows.push((model, json, spec.grid, spec.threads(), spec.smem_bytes, per_sm));
    }
    rows.sort_by(|a, b| a.0.total_cmp(&b.0));
    // Written, not println!'d: a reader that stops early (`| head`) ends the listing quietly.
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for (model, json, grid, threads, smem, per_sm) in &rows {
        let line = writeln!(out, "{model:9.2} us  grid {grid:?} threads {threads} smem {smem} per_sm {per_sm}  {json}");
        if line.is_err() {
            return Ok(());
        }
    }
    if out.flush().is_err() {
        return Ok(());
    }
    eprintln!("{} configs", rows.len());
    Ok(())
}
