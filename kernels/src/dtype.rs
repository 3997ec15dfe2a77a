//! Element types and their spellings (name, CUDA C++, WMMA fragment element).

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

use crate::error::Error;

/// An element type of an operand, accumulator or output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// IEEE binary16.
    F16,
    /// bfloat16.
    Bf16,
    /// Signed 8-bit integer.
    I8,
    /// IEEE binary32.
    F32,
    /// Signed 32-bit integer.
    I32,
}

/// One table for the spellings, so a new type is added in one place.
const TABLE: &[(DType, &str, &str, u32)] = &[
    (DType::F16, "f16", "half", 2),
    (DType::Bf16, "bf16", "__nv_bfloat16", 2),
    (DType::I8, "i8", "signed char", 1),
    (DType::F32, "f32", "float", 4),
    (DType::I32, "i32", "int", 4),
];

impl DType {
    /// Every type, in table order.
    pub const ALL: [DType; 5] = [DType::F16, DType::Bf16, DType::I8, DType::F32, DType::I32];

    fn row(self) -> &'static (DType, &'static str, &'static str, u32) {
        TABLE.iter().find(|r| r.0 == self).expect("every dtype has a row")
    }

    /// Short name used in keys, flags and JSON (`f16`, `bf16`, `i8`, `f32`, `i32`).
    pub fn name(self) -> &'static str {
        self.row().1
    }

    /// The CUDA C++ type.
    pub fn cuda(self) -> &'static str {
        self.row().2
    }

    /// Size of one element in bytes.
    pub fn bytes(self) -> u32 {
        self.row().3
    }

    /// Whether the type is an integer type.
    pub fn is_int(self) -> bool {
        matches!(self, DType::I8 | DType::I32)
    }

    /// Unit roundoff of the type (half an ulp at 1.0); 0 for integers, whose arithmetic here is exact.
    pub fn unit_roundoff(self) -> f64 {
        match self {
            DType::F16 => 2f64.powi(-11),
            DType::Bf16 => 2f64.powi(-8),
            DType::F32 => 2f64.powi(-24),
            DType::I8 | DType::I32 => 0.0,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.to_ascii_lowercase();
        let alias = match lower.as_str() {
            "half" | "fp16" | "float16" => "f16",
            "bfloat16" => "bf16",
            "int8" => "i8",
            "float" | "fp32" | "float32" => "f32",
            "int32" | "int" => "i32",
            other => other,
        };
        TABLE.iter().find(|r| r.1 == alias).map(|r| r.0).ok_or_else(|| {
            Error::invalid("dtype", format!("unknown dtype {s:?}; expected one of f16, bf16, i8, f32, i32"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for d in DType::ALL {
            assert_eq!(d.name().parse::<DType>().unwrap(), d);
        }
        assert_eq!("FP16".parse::<DType>().unwrap(), DType::F16);
        let err = "f64".parse::<DType>().unwrap_err().to_string();
        assert!(err.contains("dtype") && err.contains("\"f64\""), "{err}");
    }
}
