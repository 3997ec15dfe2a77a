//! Small typed emitters for generated CUDA C++: a header of named constants and types that fills
//! the holes of a fixed kernel body (`src/cuda/*.cu`).

use std::fmt::{self, Write as _};

/// Device helpers every generated kernel includes.
pub const COMMON: &str = include_str!("cuda/common.cuh");

/// The block-level WMMA GEMM (pipeline, warps, epilogue, split-K) that `wmma_gemm` and
/// `wmma_conv2d` share: a template with named holes (see [`fill_holes`]) that each fills from its
/// own fills file. Follows [`COMMON`].
pub const WMMA_CORE: &str = include_str!("cuda/wmma_core.cu");

/// What every generated source starts with. The rest of a source is one self-contained block in
/// its own namespace, so the blocks of several kernels can share one translation unit (the compile
/// tests batch them to parse the headers once).
pub const PREAMBLE: &str = "#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n#include <mma.h>\nusing namespace nvcuda;\n\n\
// Fault injection (worker tests only): a statement run first in every generated kernel.\n\
#ifndef TT_FAULT_HOOK\n#define TT_FAULT_HOOK\n#endif\n\n";

/// Fills the holes of `template` from `fills`. In `template`, a line `// @hole(name)` (after
/// indentation) is replaced by the lines of fill `name`, and lines starting with `//@` are notes
/// that are dropped. `fills` is a sequence of `// @fill(name)` lines, each followed by its lines up
/// to the next one (text before the first is a note). A template file and its fills are fixed
/// text compiled into the crate, so a hole without a fill, or a fill without a hole, is a bug:
/// it panics (the tests of every template catch it).
pub fn fill_holes(template: &str, fills: &str) -> String {
    let mut named: Vec<(&str, String, bool)> = Vec::new();
    for line in fills.split_inclusive('\n') {
        if let Some(name) = marker(line, "// @fill(") {
            named.push((name, String::new(), false));
        } else if let Some((_, text, _)) = named.last_mut() {
            text.push_str(line);
        }
    }
    let mut out = String::with_capacity(template.len() + fills.len());
    for line in template.split_inclusive('\n') {
        if line.starts_with("//@") {
            continue;
        }
        match marker(line, "// @hole(") {
            Some(name) => {
                let fill = named.iter_mut().find(|(n, _, _)| *n == name);
                let (_, text, used) = fill.unwrap_or_else(|| panic!("hole {name:?} has no fill"));
                out.push_str(text);
                *used = true;
            }
            None => out.push_str(line),
        }
    }
    if let Some((name, _, _)) = named.iter().find(|(_, _, used)| !used) {
        panic!("fill {name:?} has no hole");
    }
    out
}

/// The name in a marker line `{prefix}name)`, indentation allowed.
fn marker<'a>(line: &'a str, prefix: &str) -> Option<&'a str> {
    line.trim().strip_prefix(prefix)?.strip_suffix(')')
}

/// A C++ identifier made from arbitrary text (non-alphanumerics become `_`).
pub fn ident(text: &str) -> String {
    let mut out: String = text.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    if out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    out
}

/// A C++ literal of a scalar in the epilogue's type.
#[derive(Clone, Copy, Debug)]
pub enum Scalar {
    /// A float literal (`1.5f`).
    Float(f64),
    /// An integer literal.
    Int(i64),
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            // `{:?}` keeps a decimal point (1.0), so the literal is a float; f32 rounding is intended.
            Scalar::Float(v) => write!(f, "{v:?}f"),
            Scalar::Int(v) => write!(f, "{v}"),
        }
    }
}

/// The generated part of a kernel: includes, typedefs, `#define`s and the `cfg` namespace.
#[derive(Default)]
pub struct Header {
    includes: Vec<String>,
    comments: Vec<String>,
    typedefs: Vec<(String, String)>,
    defines: Vec<(String, String)>,
    consts: Vec<(String, String, String)>,
}

impl Header {
    /// `#include <name>` after [`PREAMBLE`] (headers only some kernels need, such as
    /// `cuda_fp8.h`, so that the sources of the others stay as they were).
    pub fn include(&mut self, name: &str) -> &mut Self {
        self.includes.push(name.into());
        self
    }

    /// A comment line at the top.
    pub fn comment(&mut self, text: impl Into<String>) -> &mut Self {
        self.comments.push(text.into());
        self
    }

    /// `typedef ty name;` at global scope.
    pub fn typedef(&mut self, name: &str, ty: &str) -> &mut Self {
        self.typedefs.push((name.into(), ty.into()));
        self
    }

    /// `#define name value`.
    pub fn define(&mut self, name: &str, value: impl fmt::Display) -> &mut Self {
        self.defines.push((name.into(), value.to_string()));
        self
    }

    /// `constexpr int name = value;` in namespace `cfg`.
    pub fn int(&mut self, name: &str, value: i64) -> &mut Self {
        self.consts.push(("int".into(), name.into(), value.to_string()));
        self
    }

    /// `constexpr bool name = value;` in namespace `cfg`.
    pub fn flag(&mut self, name: &str, value: bool) -> &mut Self {
        self.consts.push(("bool".into(), name.into(), value.to_string()));
        self
    }

    /// `constexpr ty name = value;` in namespace `cfg`.
    pub fn value(&mut self, ty: &str, name: &str, value: impl fmt::Display) -> &mut Self {
        self.consts.push((ty.into(), name.into(), value.to_string()));
        self
    }

    /// `typedef ty name;` in namespace `cfg`.
    pub fn cfg_type(&mut self, name: &str, ty: &str) -> &mut Self {
        self.consts.push(("typedef".into(), name.into(), ty.into()));
        self
    }

    /// The whole source: [`PREAMBLE`], then a block in namespace `ns` holding the header and each
    /// part in order. `#define`s are undone at the end of the block.
    pub fn source(&self, ns: &str, parts: &[&str]) -> String {
        let mut s = String::from(PREAMBLE);
        for name in &self.includes {
            let _ = writeln!(s, "#include <{name}>");
        }
        for c in &self.comments {
            let _ = writeln!(s, "// {c}");
        }
        for (name, value) in &self.defines {
            let _ = writeln!(s, "#define {name} {value}");
        }
        let _ = writeln!(s, "namespace {ns} {{");
        for (name, ty) in &self.typedefs {
            let _ = writeln!(s, "typedef {ty} {name};");
        }
        s.push_str("\nnamespace cfg {\n");
        for (ty, name, value) in &self.consts {
            if ty == "typedef" {
                let _ = writeln!(s, "typedef {value} {name};");
            } else {
                let _ = writeln!(s, "constexpr {ty} {name} = {value};");
            }
        }
        s.push_str("}  // namespace cfg\n\n");
        for part in parts {
            s.push_str(part);
            s.push('\n');
        }
        let _ = writeln!(s, "}}  // namespace {ns}");
        for (name, _) in &self.defines {
            let _ = writeln!(s, "#undef {name}");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emits_named_holes() {
        let mut h = Header::default();
        h.comment("x").typedef("T_IN", "half").define("KERNEL_NAME", "k1").int("BM", 64).flag("CP", true);
        h.value("T_EPI", "ALPHA", Scalar::Float(1.0)).cfg_type("L", "wmma::row_major");
        let s = h.source("ns1", &["BODY"]);
        assert!(s.starts_with(PREAMBLE) && s.contains("namespace ns1 {") && s.ends_with("#undef KERNEL_NAME\n"));
        for want in [
            "// x",
            "typedef half T_IN;",
            "#define KERNEL_NAME k1",
            "constexpr int BM = 64;",
            "constexpr bool CP = true;",
            "constexpr T_EPI ALPHA = 1.0f;",
            "typedef wmma::row_major L;",
            "BODY",
        ] {
            assert!(s.contains(want), "missing {want:?}");
        }
        assert_eq!(ident("a.b-1"), "a_b_1");
        assert_eq!(Scalar::Float(-0.5).to_string(), "-0.5f");
    }

    #[test]
    fn holes_take_their_fills() {
        let template = "//@ a note\nfirst\n  // @hole(a)\nmiddle\n// @hole(empty)\nlast\n";
        let fills = "//@ about these fills\n// @fill(a)\n  one\n  two\n// @fill(empty)\n";
        assert_eq!(fill_holes(template, fills), "first\n  one\n  two\nmiddle\nlast\n");
    }

    #[test]
    #[should_panic(expected = "hole \"b\" has no fill")]
    fn a_hole_without_a_fill_is_a_bug() {
        fill_holes("// @hole(b)\n", "// @fill(a)\nx\n");
    }

    #[test]
    #[should_panic(expected = "fill \"c\" has no hole")]
    fn a_fill_without_a_hole_is_a_bug() {
        fill_holes("x\n", "// @fill(c)\nx\n");
    }
}
