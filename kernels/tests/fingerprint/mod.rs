//! A fingerprint of everything `wmma_gemm` exposes: its version, its knob space, the valid indices
//! of a set of workloads on a set of targets, and for a sample of configs the whole generated
//! `KernelSpec` (source digest, name, launch), the `check` outcome, the features and the analytic
//! time, all exactly (floats by their bits). Two trees that print the same fingerprint generate the
//! same kernels and feed the tuners the same numbers.
//!
//! Shared by `tests/gemm_unchanged.rs` (the CI scope against a golden file made at 2e4387f, whose
//! wmma_gemm v6 sources are those verified on the GPU at 1a86e09) and
//! `examples/gemm_fingerprint.rs` (the wide scope, and a dump of the sources, to diff a tree
//! against a checkout of any other commit). It uses only the `Template` trait and the workload
//! types, which 1a86e09 has too, so the same file runs there.

#![allow(dead_code, unreachable_pub)]

use std::fmt::Write as _;

use sha2::{Digest, Sha256};
use tensortune_kernels::template::valid_configs;
use tensortune_kernels::{DType, Layout, Matmul, Target, Template, Types, Workload, gemm::WmmaGemm};

/// How much of the space a fingerprint covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// What a test can afford: every type x layout once (the shapes rotate), every target.
    Ci,
    /// Every type combination x layout x shape on every target, more configs each.
    Wide,
}

/// The type combinations of the workloads: (input, accumulator, output).
const TYPES: [(DType, DType, DType); 6] = [
    (DType::F16, DType::F32, DType::F32),
    (DType::F16, DType::F32, DType::F16),
    (DType::F16, DType::F16, DType::F16),
    (DType::Bf16, DType::F32, DType::F32),
    (DType::Bf16, DType::F32, DType::Bf16),
    (DType::I8, DType::I32, DType::I32),
];

/// Shapes (m, n, k, alpha, beta): the first tuning shape, a ragged one with beta = 1, a square one
/// with a scaled epilogue, and a large one (many waves).
const SHAPES: [(u64, u64, u64, f64, f64); 4] =
    [(512, 64, 512, 1.0, 0.0), (200, 72, 272, 1.0, 1.0), (256, 256, 256, 2.0, -1.0), (4096, 4096, 4096, 1.0, 0.0)];

/// The targets: sm_80, sm_90 (H100/H200 limits), `sim`, and a Turing-class part without cp.async.
pub fn targets() -> Vec<Target> {
    let mut turing = Target::sm80();
    turing.class_key = "generic/sm75/40sm".into();
    turing.arch = 75;
    turing.sm_count = 40;
    turing.max_smem_per_block = 65_536;
    turing.smem_per_sm = 65_536;
    vec![Target::sm80(), Target::sm90(), Target::sim(), turing]
}

/// The workloads of a scope (every one is valid for wmma_gemm on sm_80 and newer).
pub fn workloads(scope: Scope) -> Vec<Workload> {
    let mut out = Vec::new();
    for (s, (m, n, k, alpha, beta)) in SHAPES.iter().enumerate() {
        for (t, (input, acc, output)) in TYPES.iter().enumerate() {
            for (l, layout) in Layout::ALL.iter().enumerate() {
                // CI: every type and every layout once, the shapes rotating.
                if scope == Scope::Ci && (t + l) % SHAPES.len() != s {
                    continue;
                }
                let types = Types::new(*input, *acc, Some(*output)).expect("a valid type combination");
                let mut w = Matmul::new(*m, *n, *k, *layout, types).expect("a valid shape");
                w.alpha = *alpha;
                w.beta = *beta;
                out.push(Workload::Matmul(w));
            }
        }
    }
    out
}

fn digest(text: &str) -> String {
    Sha256::digest(text.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

fn float_bits(v: f64) -> String {
    format!("{v}#{:016x}", v.to_bits())
}

/// The fingerprint, one fact per line; and, when `sources` is given, every generated source
/// sampled, named `{target}_{workload#}_{config index}.cu`.
pub fn fingerprint(scope: Scope, mut sources: Option<&mut Vec<(String, String)>>) -> String {
    let t = &WmmaGemm;
    let mut out = String::new();
    let _ = writeln!(out, "template {} version {} op {:?}", t.name(), t.version(), t.op());
    let space = t.space();
    let _ = writeln!(out, "space len {}", space.len());
    for knob in &space.knobs {
        let values: Vec<String> = knob.values.iter().map(|v| format!("{v:?}")).collect();
        let _ = writeln!(out, "knob {} [{}]", knob.name, values.join(", "));
    }
    let (samples, probes) = match scope {
        Scope::Ci => (6, 24),
        Scope::Wide => (40, 400),
    };
    let workloads = workloads(scope);
    // One thread per target (the valid-config walks dominate), joined in order.
    let parts: Vec<(String, Vec<(String, String)>)> = std::thread::scope(|s| {
        let handles: Vec<_> = targets()
            .into_iter()
            .map(|target| {
                let workloads = &workloads;
                let space = &space;
                let keep = sources.is_some();
                s.spawn(move || per_target(&target, workloads, space, samples, probes, scope, keep))
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("fingerprint thread")).collect()
    });
    for (text, mut srcs) in parts {
        out.push_str(&text);
        if let Some(s) = sources.as_deref_mut() {
            s.append(&mut srcs);
        }
    }
    out
}

/// The lines of one target (and its sources when `keep`).
fn per_target(
    target: &Target,
    workloads: &[Workload],
    space: &tensortune_kernels::Space,
    samples: usize,
    probes: usize,
    scope: Scope,
    keep: bool,
) -> (String, Vec<(String, String)>) {
    let t = &WmmaGemm;
    let mut out = String::new();
    let mut sources = Vec::new();
    let arch = target.class_key.replace('/', "_");
    for (wi, w) in workloads.iter().enumerate() {
        let key = w.key();
        let head = format!("{arch} w{wi} {key}");
        if let Err(e) = t.supports(w, target) {
            let _ = writeln!(out, "{head} unsupported: {e}");
            continue;
        }
        let valid = valid_configs(t, w, target).expect("valid configs");
        let indices: Vec<String> = valid.iter().map(|(i, _)| i.to_string()).collect();
        let _ = writeln!(out, "{head} valid {} digest {}", valid.len(), digest(&indices.join(",")));
        // In the wide scope every valid config of the first workload (512x64x512 f16 nn) on
        // every target; otherwise an even sample.
        let all = scope == Scope::Wide && wi == 0;
        let step = if all { 1 } else { (valid.len() / samples).max(1) };
        for (index, config) in valid.iter().step_by(step) {
            let spec = t.generate(w, config, target).expect("a valid config generates");
            let _ = writeln!(
                out,
                "{head} #{index} source {} name {} entry {} grid {:?} block {:?} smem {} workspace {} args {:?}",
                digest(&spec.source),
                spec.name,
                spec.entry,
                spec.grid,
                spec.block,
                spec.smem_bytes,
                spec.workspace_bytes,
                spec.args
            );
            let res = t.check(w, config, target).expect("a valid config checks");
            let _ = writeln!(out, "{head} #{index} check {res:?}");
            let features: Vec<String> = t
                .features(w, config, target)
                .expect("features")
                .iter()
                .map(|(name, v)| format!("{name}={}", float_bits(*v)))
                .collect();
            let _ = writeln!(out, "{head} #{index} features {}", features.join(" "));
            let model = t.model_us(w, config, target).expect("model");
            let _ = writeln!(out, "{head} #{index} model_us {}", float_bits(model));
            if keep {
                sources.push((format!("{arch}_w{wi:03}_{index:07}.cu"), spec.source));
            }
        }
        // The checked outcome (resources or the reason) of points spread over the whole space,
        // valid or not.
        let stride = space.len() / probes as u64;
        for p in 0..probes as u64 {
            let index = p * stride + (p * 7919) % stride.max(1);
            let config = space.config(index).expect("in range");
            let outcome = match t.check(w, &config, target) {
                Ok(r) => format!("{r:?}"),
                Err(e) => e.to_string(),
            };
            let _ = writeln!(out, "{head} probe #{index} {outcome}");
        }
    }
    (out, sources)
}

/// A short form of a fingerprint for a golden file: the lines about the template and its space as
/// they are, then per target and workload its `valid` line and a digest of all its lines.
pub fn summary(fingerprint: &str) -> String {
    let mut out = String::new();
    let mut group: Option<(String, Vec<&str>)> = None;
    let flush = |out: &mut String, group: &mut Option<(String, Vec<&str>)>| {
        if let Some((head, lines)) = group.take() {
            let _ = writeln!(out, "{head} lines {} digest {}", lines.len(), digest(&lines.join("\n")));
        }
    };
    for line in fingerprint.lines() {
        let mut words = line.split(' ');
        let (first, second) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
        if !second.starts_with('w') || !second[1..].chars().all(|c| c.is_ascii_digit()) {
            flush(&mut out, &mut group);
            let _ = writeln!(out, "{line}");
            continue;
        }
        let head = format!("{first} {second}");
        if group.as_ref().is_none_or(|(h, _)| *h != head) {
            flush(&mut out, &mut group);
            group = Some((head, Vec::new()));
        }
        if line.contains(" valid ") || line.contains(" unsupported: ") {
            let _ = writeln!(out, "{line}");
        }
        group.as_mut().expect("set above").1.push(line);
    }
    flush(&mut out, &mut group);
    out
}
