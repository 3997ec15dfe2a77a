//! Fused matmul epilogues and FP8 input scales: what is done to each output element between the
//! product and the store, in cuBLASLt's order:
//!
//! `D[m, n] = act(alpha * sa * sb * scale[m] * sum + beta * C[m, n] + bias[m])`
//!
//! - `sa`, `sb`: per-tensor scales of A and B (FP8 inputs, `scale=tensor`), read from the device
//!   (cuBLASLt's `CUBLASLT_MATMUL_DESC_A_SCALE_POINTER` / `B_SCALE_POINTER`);
//! - `scale[m]`: a per-row alpha (per output channel of a framework's linear layer, whose TN GEMM
//!   has M = output features): the dequantization of i8 or FP8 weights quantized per channel
//!   (cuBLASLt's `CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_HOST`);
//! - `bias[m]`: one value per row of column-major D, in the output type (`CUBLASLT_EPILOGUE_BIAS`:
//!   "bias vector length must match matrix D rows");
//! - `act`: ReLU, GELU in its tanh form (`CUBLASLT_EPILOGUE_RELU`, `_GELU`), or exact GELU, the
//!   erf form `x/2 (1 + erf(x / sqrt 2))` (PyTorch's `nn.GELU()` default, BERT's), which cuBLASLt
//!   has no epilogue for: its baseline is cuBLASLt's product and an elementwise kernel.
//!
//! Keys spell the epilogue as `epi=` and its parts joined by `+` in this order
//! (`epi=scale+bias+gelu`), and the input scales as `scale=tensor`; a plain matmul's key has
//! neither, so keys made before epilogues existed are unchanged.
//!
//! The measurement data of the vectors is fixed ([`bias_value`], [`scale_value`],
//! [`TENSOR_SCALES`]): exact in every output type, so the check stays exact before rounding.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// The activation applied last.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Activation {
    /// None.
    #[default]
    None,
    /// max(x, 0).
    Relu,
    /// GELU, tanh form: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), as cuBLASLt's.
    Gelu,
    /// GELU, exact (erf) form: 0.5 x (1 + erf(x / sqrt 2)), PyTorch's `nn.GELU()` default. Keys
    /// spell it `gelu_erf`; `gelu` stays the tanh form.
    #[serde(rename = "gelu_erf")]
    GeluErf,
}

impl Activation {
    /// The key spelling (`none`, `relu`, `gelu`, `gelu_erf`).
    pub fn name(self) -> &'static str {
        match self {
            Activation::None => "none",
            Activation::Relu => "relu",
            Activation::Gelu => "gelu",
            Activation::GeluErf => "gelu_erf",
        }
    }

    /// The activation's code in generated kernels (`EPI_ACT`): 0 none, 1 ReLU, 2 GELU (tanh), 3
    /// GELU (erf).
    pub fn code(self) -> i64 {
        match self {
            Activation::None => 0,
            Activation::Relu => 1,
            Activation::Gelu => 2,
            Activation::GeluErf => 3,
        }
    }
}

/// A matmul's fused epilogue beyond alpha and beta.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Epilogue {
    /// Multiply row m by `scale[m]` (f32, M values).
    #[serde(default)]
    pub scale: bool,
    /// Add `bias[m]` (output type, M values).
    #[serde(default)]
    pub bias: bool,
    /// The activation.
    #[serde(default)]
    pub activation: Activation,
}

/// The parts of an epilogue as keys spell them, in key order.
pub const PARTS: [&str; 5] = ["scale", "bias", "relu", "gelu", "gelu_erf"];

impl Epilogue {
    /// The plain epilogue (alpha and beta only).
    pub const NONE: Epilogue = Epilogue { scale: false, bias: false, activation: Activation::None };

    /// Whether nothing beyond alpha and beta is fused.
    pub fn is_none(&self) -> bool {
        *self == Epilogue::NONE
    }

    /// Whether the kernel reads per-row vectors (scale or bias).
    pub fn reads_vectors(&self) -> bool {
        self.scale || self.bias
    }

    /// The key spelling (`scale+bias+gelu`; `none` for the plain epilogue).
    pub fn name(&self) -> String {
        let mut parts = Vec::new();
        if self.scale {
            parts.push("scale");
        }
        if self.bias {
            parts.push("bias");
        }
        if self.activation != Activation::None {
            parts.push(self.activation.name());
        }
        if parts.is_empty() { "none".into() } else { parts.join("+") }
    }

    /// The activation on one value, in f64 (the reference's).
    pub fn activate(&self, x: f64) -> f64 {
        match self.activation {
            Activation::None => x,
            Activation::Relu => x.max(0.0),
            Activation::Gelu => gelu_tanh(x),
            Activation::GeluErf => gelu_erf(x),
        }
    }

    /// The whole epilogue on one element in f64, with `alpha` and `beta`.
    pub fn apply(&self, alpha: f64, beta: f64, e: Element) -> f64 {
        let s = if self.scale { e.row_scale } else { 1.0 };
        let b = if self.bias { e.bias } else { 0.0 };
        self.activate(alpha * e.ab_scale * s * e.sum + beta * e.c + b)
    }
}

/// What the epilogue of one output element reads.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Element {
    /// The exact product sum.
    pub sum: f64,
    /// C at the element.
    pub c: f64,
    /// The product of the input scales (1 without them).
    pub ab_scale: f64,
    /// The per-row scale at its row (ignored unless the epilogue has it).
    pub row_scale: f64,
    /// The bias at its row (ignored unless the epilogue has it).
    pub bias: f64,
}

impl fmt::Display for Epilogue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

impl FromStr for Epilogue {
    type Err = Error;

    /// Parses `scale+bias+gelu` (any order, each part once, at most one activation); `none` or
    /// an empty string is the plain epilogue.
    fn from_str(s: &str) -> Result<Epilogue> {
        let mut e = Epilogue::NONE;
        if s.is_empty() || s.eq_ignore_ascii_case("none") {
            return Ok(e);
        }
        let allowed = || format!("allowed: {} joined by '+', e.g. bias+gelu", PARTS.join(", "));
        for part in s.split('+') {
            let twice = || Error::invalid("epilogue", format!("{s:?} names {part:?} twice"));
            match part.to_ascii_lowercase().as_str() {
                "scale" if e.scale => return Err(twice()),
                "scale" => e.scale = true,
                "bias" if e.bias => return Err(twice()),
                "bias" => e.bias = true,
                act @ ("relu" | "gelu" | "gelu_erf") => {
                    if e.activation != Activation::None {
                        return Err(Error::invalid(
                            "epilogue",
                            format!("{s:?} has two activations; at most one of relu, gelu, gelu_erf"),
                        ));
                    }
                    e.activation = match act {
                        "relu" => Activation::Relu,
                        "gelu" => Activation::Gelu,
                        _ => Activation::GeluErf,
                    };
                }
                _ => return Err(Error::invalid("epilogue", format!("unknown part {part:?} in {s:?}; {}", allowed()))),
            }
        }
        Ok(e)
    }
}

/// How an FP8 matmul's inputs are scaled before the product.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InputScale {
    /// Not scaled.
    #[default]
    None,
    /// One f32 scale per tensor (A's and B's), read from the device at run time.
    Tensor,
}

impl InputScale {
    /// Key spelling (`none`, `tensor`).
    pub fn name(self) -> &'static str {
        match self {
            InputScale::None => "none",
            InputScale::Tensor => "tensor",
        }
    }
}

impl FromStr for InputScale {
    type Err = Error;

    fn from_str(s: &str) -> Result<InputScale> {
        match s.to_ascii_lowercase().as_str() {
            "none" | "" => Ok(InputScale::None),
            "tensor" => Ok(InputScale::Tensor),
            _ => Err(Error::invalid("scale", format!("unknown input scaling {s:?}; allowed: none, tensor"))),
        }
    }
}

/// GELU in its tanh form, in f64.
pub fn gelu_tanh(x: f64) -> f64 {
    const K: f64 = 0.797_884_560_802_865_4; // sqrt(2 / pi)
    0.5 * x * (1.0 + (K * (x + 0.044715 * x * x * x)).tanh())
}

/// GELU in its exact (erf) form, in f64.
pub fn gelu_erf(x: f64) -> f64 {
    0.5 * x * (1.0 + erf(x * std::f64::consts::FRAC_1_SQRT_2))
}

/// The error function in f64, to about 1e-15 (std has none): its Maclaurin series below |x| = 2.5
/// (the terms peak near 2^6 there, so about 2 of f64's 16 digits go to cancellation), and
/// 1 - erfc(x) from erfc's continued fraction beyond, where it converges in a few dozen terms.
pub fn erf(x: f64) -> f64 {
    let a = x.abs();
    let value = if a < 2.5 {
        // erf(x) = 2/sqrt(pi) * sum_n (-1)^n x^(2n+1) / (n! (2n+1)).
        let (mut term, mut sum, x2) = (a, a, a * a);
        for n in 1..60 {
            term *= -x2 / n as f64;
            let next = term / (2 * n + 1) as f64;
            sum += next;
            if next.abs() < 1e-17 * sum.abs() {
                break;
            }
        }
        std::f64::consts::FRAC_2_SQRT_PI * sum
    } else {
        // erfc(a) = exp(-a^2)/sqrt(pi) * 1/(a + (1/2)/(a + 1/(a + (3/2)/(a + 2/(a + ...))))),
        // evaluated from the tail (60 levels: exact to f64 for a >= 2.5).
        let mut f = a;
        for n in (1..=60).rev() {
            f = a + (n as f64 / 2.0) / f;
        }
        1.0 - (-a * a).exp() / (std::f64::consts::PI.sqrt() * f)
    };
    value.copysign(x)
}

/// The per-tensor scales (A's, B's) every measurement uses: powers of two, so that scaling is
/// exact, and unequal with a product other than 1, so that a kernel that drops or swaps one of
/// them fails the check.
pub const TENSOR_SCALES: [f32; 2] = [0.5, 0.25];

/// The bias of row `m` in every measurement: a multiple of 1/8 in [-1, 1] (exact in every output
/// type), varying along M so that a kernel reading the wrong row fails the check.
pub fn bias_value(m: u64) -> f64 {
    ((m * 5 + 3) % 17) as f64 / 8.0 - 1.0
}

/// The per-row scale of row `m` in every measurement: a power of two in 1/4 ..= 2.
pub fn scale_value(m: u64) -> f64 {
    [0.5, 2.0, 1.0, 0.25][((m * 3 + 1) % 4) as usize]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_in_key_order() {
        for text in [
            "none",
            "bias",
            "relu",
            "gelu",
            "gelu_erf",
            "bias+relu",
            "bias+gelu",
            "bias+gelu_erf",
            "scale",
            "scale+bias+gelu",
            "scale+relu",
        ] {
            let e: Epilogue = text.parse().unwrap();
            assert_eq!(e.name(), text);
        }
        let e: Epilogue = "GELU+bias".parse().unwrap();
        assert_eq!(e.name(), "bias+gelu");
        assert!(Epilogue::NONE.is_none() && "".parse::<Epilogue>().unwrap().is_none());
        assert!(!"gelu".parse::<Epilogue>().unwrap().reads_vectors());
        assert!("scale".parse::<Epilogue>().unwrap().reads_vectors());
    }

    #[test]
    fn bad_epilogues_name_the_field_and_the_parts() {
        for (text, says) in [
            ("bias+silu", "allowed: scale, bias, relu, gelu, gelu_erf"),
            ("relu+gelu", "two activations"),
            ("gelu+gelu_erf", "two activations"),
            ("bias+bias", "twice"),
            ("bias+", "unknown part \"\""),
        ] {
            let e = text.parse::<Epilogue>().unwrap_err();
            assert_eq!(e.field(), Some("epilogue"), "{e}");
            assert!(e.to_string().contains(says), "{text}: {e}");
        }
        let e = "row".parse::<InputScale>().unwrap_err();
        assert_eq!(e.field(), Some("scale"));
        assert!(e.to_string().contains("allowed: none, tensor"), "{e}");
    }

    #[test]
    fn gelu_is_the_tanh_form() {
        // The tanh form at 1 is 0.841192; the erf form would give 0.841345.
        assert!((gelu_tanh(1.0) - 0.841_191_990_608_276_8).abs() < 1e-12, "{}", gelu_tanh(1.0));
        assert!((gelu_tanh(-1.0) - (-0.158_808_009_391_723_2)).abs() < 1e-12);
        assert_eq!(gelu_tanh(0.0), 0.0);
        assert!((gelu_tanh(10.0) - 10.0).abs() < 1e-12 && gelu_tanh(-10.0).abs() < 1e-12);
    }

    #[test]
    fn exact_gelu_is_the_erf_form() {
        // erf at points of its tables (Abramowitz and Stegun 7.1), both branches and the sign.
        for (x, want) in [
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (2.0, 0.995_322_265_018_952_7),
            (2.5, 0.999_593_047_982_555),
            (3.0, 0.999_977_909_503_001_4),
        ] {
            assert!((erf(x) - want).abs() < 1e-15, "erf({x}) = {} not {want}", erf(x));
            assert_eq!(erf(-x), -erf(x));
        }
        // erfc(4) = 1.5417e-8: 1 - erf(4) within f64's spacing at 1.
        assert!((1.0 - erf(4.0) - 1.541_725_790_028_002e-8).abs() < 2.3e-16, "{}", 1.0 - erf(4.0));
        assert_eq!(erf(30.0), 1.0);
        // At 1 the erf form gives 0.841345, the tanh form 0.841192 (the forms differ by at most
        // 4.7e-4, near |x| = 2.7).
        assert!((gelu_erf(1.0) - 0.841_344_746_068_542_9).abs() < 1e-15, "{}", gelu_erf(1.0));
        assert!((gelu_erf(-1.0) - (-0.158_655_253_931_457_05)).abs() < 1e-15);
        assert_eq!(gelu_erf(0.0), 0.0);
        // 1 + erf(x) cancels there: about 1e-16 absolute, as the f32 kernels far exceed.
        assert!((gelu_erf(-3.0) - (-0.004_049_694_094_890_31)).abs() < 1e-14, "{}", gelu_erf(-3.0));
        let e = Element { sum: 1.0, c: 0.0, ab_scale: 1.0, row_scale: 1.0, bias: 0.0 };
        assert_eq!("gelu_erf".parse::<Epilogue>().unwrap().apply(1.0, 0.0, e), gelu_erf(1.0));
        assert_eq!(Activation::GeluErf.code(), 3);
        assert_eq!(serde_json::to_string(&Activation::GeluErf).unwrap(), "\"gelu_erf\"");
    }

    #[test]
    fn every_epilogue_applies_in_cublaslt_order() {
        // sum 3, alpha 2, beta 0.5 with C = -4, input scales 0.125, row scale 2, bias -1:
        // 2 * 0.125 * 2 * 3 + 0.5 * -4 - 1 = -1.5 before the activation.
        let e = Element { sum: 3.0, c: -4.0, ab_scale: 0.125, row_scale: 2.0, bias: -1.0 };
        let run = |text: &str| text.parse::<Epilogue>().unwrap().apply(2.0, 0.5, e);
        assert_eq!(run("none"), 2.0 * 0.125 * 3.0 - 2.0);
        assert_eq!(run("bias"), 2.0 * 0.125 * 3.0 - 2.0 - 1.0);
        assert_eq!(run("scale"), 2.0 * 0.125 * 2.0 * 3.0 - 2.0);
        assert_eq!(run("scale+bias"), -1.5);
        assert_eq!(run("scale+bias+relu"), 0.0);
        assert_eq!(run("scale+bias+gelu"), gelu_tanh(-1.5));
        assert_eq!(run("relu"), 0.0_f64.max(2.0 * 0.125 * 3.0 - 2.0));
        assert_eq!(run("bias+gelu"), gelu_tanh(-2.25));
        // The activation sees the residual (beta C) and the bias, as cuBLASLt's does.
        let e = Element { sum: 1.0, c: -3.0, ab_scale: 1.0, row_scale: 1.0, bias: 0.0 };
        assert_eq!("relu".parse::<Epilogue>().unwrap().apply(1.0, 1.0, e), 0.0);
        // ResNet's block end (beta 1): relu(conv + residual + bias), the residual before the ReLU.
        let e = Element { sum: 1.5, c: -2.0, ab_scale: 1.0, row_scale: 1.0, bias: 0.25 };
        assert_eq!("bias+relu".parse::<Epilogue>().unwrap().apply(1.0, 1.0, e), 0.0);
        let e = Element { c: 2.0, ..e };
        assert_eq!("bias+relu".parse::<Epilogue>().unwrap().apply(1.0, 1.0, e), 3.75);
    }

    #[test]
    fn the_vectors_are_exact_and_vary() {
        for m in 0..64 {
            let b = bias_value(m);
            assert!((-1.0..=1.0).contains(&b) && (b * 8.0).fract() == 0.0, "{b}");
            let s = scale_value(m);
            assert!(s.log2().fract() == 0.0 && (0.25..=2.0).contains(&s), "{s}");
        }
        assert_ne!(bias_value(0), bias_value(1));
        assert_ne!(scale_value(0), scale_value(1));
        assert_ne!(TENSOR_SCALES[0], TENSOR_SCALES[1]);
        assert_ne!(TENSOR_SCALES[0] * TENSOR_SCALES[1], 1.0);
    }
}
