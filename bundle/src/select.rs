//! Which entry of a bundle answers a problem on a GPU: the entry of exactly that problem, else
//! the nearest tuned shape of the same types and layout (filter geometry for conv2d), flagged.
//!
//! The distance is tensortune's (`Workload::shape_distance`): the sum over the free dimensions of
//! |ln(a / b)|, plus 0.001 when a matmul's epilogue scales differ. A nearest entry is compiled for
//! its own shape: it tells which tuned config is closest; launching it computes its shape, not
//! the asked one.

use crate::manifest::{Entry, Manifest, Problem};

/// The entry chosen for a problem.
#[derive(Clone, Copy, Debug)]
pub struct Selection<'a> {
    /// Its position in the manifest.
    pub index: usize,
    /// The entry.
    pub entry: &'a Entry,
    /// Whether it is of another shape (or epilogue) than the one asked: the nearest tuned one.
    pub nearest: bool,
    /// The shape distance (0 for an exact entry).
    pub distance: f64,
    /// Whether it was tuned on a GPU with as many SMs as this one (else on another part of the
    /// same architecture: it runs correctly, its time may differ).
    pub same_sm_count: bool,
}

/// How far `tuned` is from `asked`, or `None` when a kernel of one says nothing about the other.
pub fn distance(asked: &Problem, tuned: &Problem) -> Option<f64> {
    let ln = |a: u64, b: u64| ((a as f64) / (b as f64)).ln().abs();
    match (*asked, *tuned) {
        (
            Problem::Matmul { m, n, k, layout, input, accumulator, output, alpha, beta, epilogue },
            Problem::Matmul {
                m: m2,
                n: n2,
                k: k2,
                layout: l2,
                input: i2,
                accumulator: a2,
                output: o2,
                alpha: al2,
                beta: b2,
                epilogue: e2,
            },
            // As for conv2d: a fused kernel computes something else than a plain one.
        ) if (layout, input, accumulator, output, epilogue) == (l2, i2, a2, o2, e2) => {
            let scales = if (alpha, beta) == (al2, b2) { 0.0 } else { 1e-3 };
            Some(ln(m, m2) + ln(n, n2) + ln(k, k2) + scales)
        }
        (
            Problem::Conv2d { n, h, w, c, k, r, s, pad, stride, dilation, input, accumulator, output, epilogue },
            Problem::Conv2d {
                n: n2,
                h: h2,
                w: w2,
                c: c2,
                k: k2,
                r: r2,
                s: s2,
                pad: p2,
                stride: st2,
                dilation: d2,
                input: i2,
                accumulator: a2,
                output: o2,
                epilogue: e2,
            },
            // A fused kernel computes something else than a plain one: never each other's nearest.
        ) if (r, s, pad, stride, dilation, input, accumulator, output, epilogue)
            == (r2, s2, p2, st2, d2, i2, a2, o2, e2) =>
        {
            Some(ln(n, n2) + ln(h, h2) + ln(w, w2) + ln(c, c2) + ln(k, k2))
        }
        _ => None,
    }
}

/// The entry for `problem` on a GPU of compute capability `arch` with `sm_count` SMs: among the
/// entries with a cubin for `arch` (or, in a bundle exported without cubins, tuned on `arch`),
/// the smallest distance first, then one tuned with the same SM count, then the fastest. `None`
/// when no entry of a comparable problem runs on the GPU.
pub fn select<'a>(manifest: &'a Manifest, problem: &Problem, arch: u32, sm_count: u32) -> Option<Selection<'a>> {
    let runs_here = |e: &Entry| if e.cubins.is_empty() { e.device.arch == arch } else { e.cubin_for(arch).is_some() };
    manifest
        .kernels
        .iter()
        .enumerate()
        .filter(|(_, e)| runs_here(e))
        .filter_map(|(index, entry)| {
            let distance = distance(problem, &entry.problem)?;
            let same_sm_count = entry.device.sm_count == sm_count;
            Some(Selection { index, entry, nearest: distance > 0.0, distance, same_sm_count })
        })
        .min_by(|a, b| {
            a.distance
                .total_cmp(&b.distance)
                .then(b.same_sm_count.cmp(&a.same_sm_count))
                .then(a.entry.time_us.total_cmp(&b.entry.time_us))
                .then(a.index.cmp(&b.index))
        })
}
