//! Prints the fingerprint of `wmma_gemm` (see `tests/fingerprint/mod.rs`) and optionally writes
//! every sampled generated source into a folder:
//!
//! `cargo run --release -p tensortune-kernels --example gemm_fingerprint -- [ci|wide|summary] [SOURCES_DIR]`
//!
//! (`summary` prints the short form of the `ci` scope that `tests/gemm_unchanged.rs` compares with
//! `tests/data/wmma_gemm_v6.fingerprint`.)
//!
//! To compare this tree with another commit (wmma_gemm v6 was verified on the GPU at 1a86e09; the
//! analytic model, hence features and model_us, changed at e13ecd3, so compare those with 2e4387f):
//!
//! ```text
//! git worktree add /tmp/base 1a86e09 --detach
//! mkdir -p /tmp/base/kernels/tests/fingerprint
//! cp kernels/tests/fingerprint/mod.rs /tmp/base/kernels/tests/fingerprint/
//! cp kernels/examples/gemm_fingerprint.rs /tmp/base/kernels/examples/
//! (cd /tmp/base && cargo run --release -p tensortune-kernels --example gemm_fingerprint -- wide /tmp/fp-base > /tmp/fp-base.txt)
//! cargo run --release -p tensortune-kernels --example gemm_fingerprint -- wide /tmp/fp-new > /tmp/fp-new.txt
//! diff /tmp/fp-base.txt /tmp/fp-new.txt && diff -r /tmp/fp-base /tmp/fp-new
//! ```
//!
//! The `ci` scope is what `tests/gemm_unchanged.rs` checks against its golden file; regenerate
//! that file only from a tree whose kernels were verified on a GPU.

#[path = "../tests/fingerprint/mod.rs"]
mod fingerprint;

use fingerprint::Scope;

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let summary = args.get(1).map(String::as_str) == Some("summary");
    let scope = match args.get(1).map(String::as_str) {
        None | Some("ci") | Some("summary") => Scope::Ci,
        Some("wide") => Scope::Wide,
        Some(other) => {
            eprintln!("unknown scope {other:?}; expected ci, wide or summary");
            std::process::exit(2);
        }
    };
    let mut sources = Vec::new();
    let dir = args.get(2);
    let text = fingerprint::fingerprint(scope, dir.map(|_| &mut sources));
    if let Some(dir) = dir {
        std::fs::create_dir_all(dir)?;
        for (name, source) in &sources {
            std::fs::write(format!("{dir}/{name}"), source)?;
        }
        eprintln!("{} sources written to {dir}", sources.len());
    }
    if summary {
        print!("{}", fingerprint::summary(&text));
    } else {
        print!("{text}");
    }
    Ok(())
}
