//! The search's ground truth must be of the spaces the product searches: every template's current
//! version has shipped records under `testdata/` (measured by `scripts/sweep.sh`) of a version whose
//! space is today's (`Template::space_since`: older records may still hold for the configs they
//! measured, but they sample a smaller space), or a named, dated waiver below says why not. Bumping a template's version makes this fail until the
//! template is swept again (or waived), so the search bars can never pass on a space the product no
//! longer searches.

use std::collections::BTreeSet;
use std::io::BufRead;
use std::path::Path;

/// Templates without ground truth of their current version, with the day the waiver was written
/// and why. Each entry is a debt, not a default: a sweep of the template removes it.
const WAIVERS: &[(&str, u32, &str, &str)] = &[
    (
        "simt_gemm",
        2,
        "2026-11-27",
        "exact f32 only (f32,f32,f32): no tuner bar is stated for it and no union space holds it; \
         sweep it with suites of f32 matmuls when one is",
    ),
    ("simt_conv2d", 1, "2026-11-27", "exact f32 convolutions only, as simt_gemm"),
    (
        "wgmma_gemm",
        20,
        "2026-11-29",
        "v20 adds block_n 192 over three consumer warpgroups (or one) to v19's space, which union-v19 \
         (testdata/sweep-h200-union-v19-*) sampled the same day; sweep suites/sweeps/union-v19.json again",
    ),
    ("wgmma_conv2d", 20, "2026-11-29", "as wgmma_gemm: v20's 192-wide pixel tiles are not in union-v19's sample"),
    (
        "mma_ext_gemm",
        1,
        "2026-11-27",
        "tf32 and the packed types (s4, u4, b1): a space of its own, never in a union with the f16/bf16/i8 \
         templates; its sweep is the next one to run",
    ),
];

/// Every (template, version) that some shipped record file holds.
fn shipped() -> BTreeSet<(String, u32)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata");
    let mut out = BTreeSet::new();
    for entry in std::fs::read_dir(&dir).expect("search/testdata") {
        let path = entry.expect("an entry").path();
        if !path.to_string_lossy().ends_with(".jsonl.gz") {
            continue;
        }
        let file = std::fs::File::open(&path).expect("a record file");
        for line in std::io::BufReader::new(flate2::read::GzDecoder::new(file)).lines() {
            let line = line.expect("a line");
            let v: serde_json::Value = serde_json::from_str(&line).expect("a JSON record");
            let (Some(t), Some(ver)) = (v["template"].as_str(), v["template_version"].as_u64()) else {
                panic!("{}: a record without template and template_version", path.display());
            };
            out.insert((t.to_owned(), ver as u32));
        }
    }
    out
}

#[test]
fn every_current_template_version_has_shipped_ground_truth_or_a_dated_waiver() {
    let shipped = shipped();
    let mut missing = Vec::new();
    for t in tensortune_kernels::registry::all() {
        // Records of an older version count where the template says they still hold and its space
        // has not grown since.
        if shipped.iter().any(|(n, v)| n == t.name() && t.records_hold_for(*v) && *v >= t.space_since()) {
            assert!(
                !WAIVERS.iter().any(|w| w.0 == t.name()),
                "{} v{} has ground truth now: remove its waiver",
                t.name(),
                t.version()
            );
            continue;
        }
        match WAIVERS.iter().find(|w| w.0 == t.name()) {
            Some((_, v, _, _)) if *v == t.version() => {}
            Some((_, v, day, _)) => missing.push(format!(
                "{} is at v{} but its waiver ({day}) is for v{v}: sweep it (scripts/sweep.sh) or renew the waiver",
                t.name(),
                t.version()
            )),
            None => missing.push(format!(
                "{} v{} has no records of its space (v{} on) under search/testdata/ (shipped: {}); sweep it with scripts/sweep.sh",
                t.name(),
                t.version(),
                t.space_since(),
                shipped
                    .iter()
                    .filter(|(n, _)| n == t.name())
                    .map(|(n, v)| format!("{n} v{v}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }
    assert!(missing.is_empty(), "stale search ground truth:\n{}", missing.join("\n"));
    for (name, _, day, why) in WAIVERS {
        assert!(day.len() == 10 && !why.is_empty(), "waiver of {name} needs a date and a reason");
        assert!(tensortune_kernels::registry::by_name(name).is_ok(), "waiver of {name}: no such template");
    }
}
