//! wmma_gemm v6 was verified on a GPU (every type combination and layout correct, timings recorded
//! and shipped as replay data): what it generates, which configs are valid, and the features and
//! analytic times the tuners see must not change without a version bump and a new GPU check. The
//! golden file is the summary of the fingerprint (see `fingerprint/mod.rs`) made at 2e4387f: its
//! kernel sources are those of 1a86e09, where v6 was verified; its features and analytic times
//! include the load-latency floor of e13ecd3 and the smooth bound (`Tiling::bound_us`) that
//! followed it (regenerated then, with the full `ci` fingerprint differing only in features and
//! model_us lines).
//!
//! On a mismatch, diff the full fingerprints and sources of the two trees with
//! `examples/gemm_fingerprint.rs` (its doc has the commands).

mod fingerprint;

#[test]
fn wmma_gemm_v6_generates_what_was_verified() {
    let golden = include_str!("data/wmma_gemm_v6.fingerprint");
    let now = fingerprint::summary(&fingerprint::fingerprint(fingerprint::Scope::Ci, None));
    let golden: Vec<&str> = golden.lines().collect();
    let now: Vec<&str> = now.lines().collect();
    let differing: Vec<String> = golden
        .iter()
        .zip(&now)
        .filter(|(g, n)| g != n)
        .take(10)
        .map(|(g, n)| format!("  was: {g}\n  now: {n}"))
        .collect();
    assert!(
        differing.is_empty() && golden.len() == now.len(),
        "wmma_gemm differs from the verified v6 ({} lines were, {} are); first differences:\n{}\n\
         run examples/gemm_fingerprint.rs in both trees to see what changed",
        golden.len(),
        now.len(),
        differing.join("\n")
    );
}
