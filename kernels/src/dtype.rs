//! Element types and their spellings (name, CUDA C++, bit width).
//!
//! Two kinds of entry go beyond a storage format, because they change what a kernel computes and
//! so must give different workload keys:
//! - `tf32`: f32 in memory, multiplied on the tensor cores as TF32 (10 mantissa bits). Its
//!   results differ from exact f32, so its records never mix with `f32`'s.
//! - `b1xor`, `b1and`: one-bit elements whose products are XOR or AND (the two `popc` ops of the
//!   binary tensor cores); the sum of a row pair is the popcount of the combined bits.
//!
//! Sub-byte types (`s4`, `u4`, `b1xor`, `b1and`) are packed along K: a 32-bit word holds
//! 32 / bits elements, the first in the lowest bits. Sizes come from [`DType::bits`].

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
    /// f32 in memory, TF32 tensor-core math.
    Tf32,
    /// Signed 4-bit integer, packed.
    S4,
    /// Unsigned 4-bit integer, packed.
    U4,
    /// One bit, packed; products are XOR (popcount of a ^ b).
    B1Xor,
    /// One bit, packed; products are AND (popcount of a & b).
    B1And,
    /// 8-bit float, 4 exponent and 3 mantissa bits (OCP FP8 E4M3: finite, no infinities).
    E4m3,
    /// 8-bit float, 5 exponent and 2 mantissa bits (OCP FP8 E5M2).
    E5m2,
}

/// One table for the spellings, so a new type is added in one place.
/// Columns: the type, its name, its CUDA C++ storage type (for packed types the 32-bit word that
/// holds several elements), its width in bits.
const TABLE: &[(DType, &str, &str, u32)] = &[
    (DType::F16, "f16", "half", 16),
    (DType::Bf16, "bf16", "__nv_bfloat16", 16),
    (DType::I8, "i8", "signed char", 8),
    (DType::F32, "f32", "float", 32),
    (DType::I32, "i32", "int", 32),
    (DType::Tf32, "tf32", "float", 32),
    (DType::S4, "s4", "unsigned", 4),
    (DType::U4, "u4", "unsigned", 4),
    (DType::B1Xor, "b1xor", "unsigned", 1),
    (DType::B1And, "b1and", "unsigned", 1),
    (DType::E4m3, "e4m3", "__nv_fp8_e4m3", 8),
    (DType::E5m2, "e5m2", "__nv_fp8_e5m2", 8),
];

impl DType {
    /// Every type, in table order.
    pub const ALL: [DType; 12] = [
        DType::F16,
        DType::Bf16,
        DType::I8,
        DType::F32,
        DType::I32,
        DType::Tf32,
        DType::S4,
        DType::U4,
        DType::B1Xor,
        DType::B1And,
        DType::E4m3,
        DType::E5m2,
    ];

    fn row(self) -> &'static (DType, &'static str, &'static str, u32) {
        TABLE.iter().find(|r| r.0 == self).expect("every dtype has a row")
    }

    /// Short name used in keys, flags and JSON (`f16`, `bf16`, `i8`, `f32`, `i32`, `tf32`, `s4`,
    /// `u4`, `b1xor`, `b1and`).
    pub fn name(self) -> &'static str {
        self.row().1
    }

    /// The CUDA C++ type of one element, or for a packed type of the 32-bit word holding 32 /
    /// [`DType::bits`] of them.
    pub fn cuda(self) -> &'static str {
        self.row().2
    }

    /// Width of one element in bits.
    pub fn bits(self) -> u32 {
        self.row().3
    }

    /// Size of one element in whole bytes, for types of at least 8 bits (every type a byte-
    /// addressed template accepts). A packed type answers 1, so no division by it fails; sizes of
    /// buffers of any type come from [`DType::storage_bytes`].
    pub fn bytes(self) -> u32 {
        (self.bits() / 8).max(1)
    }

    /// Bytes of `elements` elements (packed for sub-byte types, rounded up to a whole byte).
    pub fn storage_bytes(self, elements: u64) -> u64 {
        (elements * self.bits() as u64).div_ceil(8)
    }

    /// Whether elements are packed several to a byte (`s4`, `u4`, `b1xor`, `b1and`).
    pub fn is_packed(self) -> bool {
        self.bits() < 8
    }

    /// Elements a packed operand's K must be a multiple of: what one sub-byte WMMA step takes
    /// (m8n8k32 for 4-bit, m8n8k128 for 1-bit); 1 for other types.
    pub fn k_multiple(self) -> u64 {
        match self.bits() {
            4 => 32,
            1 => 128,
            _ => 1,
        }
    }

    /// Whether the type is one of the 8-bit floats (`e4m3`, `e5m2`): inputs only, whose CUDA
    /// types need `cuda_fp8.h`.
    pub fn is_fp8(self) -> bool {
        matches!(self, DType::E4m3 | DType::E5m2)
    }

    /// Whether the type is an integer type (sub-byte types included).
    pub fn is_int(self) -> bool {
        matches!(self, DType::I8 | DType::I32 | DType::S4 | DType::U4 | DType::B1Xor | DType::B1And)
    }

    /// Unit roundoff of the type (half an ulp at 1.0); 0 for integers, whose arithmetic here is exact.
    pub fn unit_roundoff(self) -> f64 {
        match self {
            DType::F16 => 2f64.powi(-11),
            DType::Bf16 => 2f64.powi(-8),
            DType::F32 => 2f64.powi(-24),
            DType::Tf32 => 2f64.powi(-11),
            DType::E4m3 => 2f64.powi(-4),
            DType::E5m2 => 2f64.powi(-3),
            DType::I8 | DType::I32 | DType::S4 | DType::U4 | DType::B1Xor | DType::B1And => 0.0,
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
            "int4" => "s4",
            "uint4" => "u4",
            "fp8" | "float8" => {
                return Err(Error::invalid(
                    "dtype",
                    format!(
                        "{s:?} needs its format: e4m3 (4 exponent bits, range 448) or e5m2 (5 exponent bits, range 57344)"
                    ),
                ));
            }
            "float8_e4m3fn" | "fp8e4m3" => "e4m3",
            "float8_e5m2" | "fp8e5m2" => "e5m2",
            "b1" | "bit" => {
                return Err(Error::invalid(
                    "dtype",
                    format!("{s:?} needs its product op: b1xor (popcount of a ^ b) or b1and (popcount of a & b)"),
                ));
            }
            other => other,
        };
        TABLE.iter().find(|r| r.1 == alias).map(|r| r.0).ok_or_else(|| {
            let names: Vec<&str> = TABLE.iter().map(|r| r.1).collect();
            Error::invalid("dtype", format!("unknown dtype {s:?}; expected one of {}", names.join(", ")))
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
        assert!(err.contains("dtype") && err.contains("\"f64\"") && err.contains("b1xor"), "{err}");
        let err = "fp8".parse::<DType>().unwrap_err().to_string();
        assert!(err.contains("e4m3") && err.contains("e5m2"), "{err}");
        assert_eq!("float8_e4m3fn".parse::<DType>().unwrap(), DType::E4m3);
        assert!(DType::E5m2.is_fp8() && !DType::I8.is_fp8() && !DType::E4m3.is_int());
        let err = "b1".parse::<DType>().unwrap_err().to_string();
        assert!(err.contains("b1xor") && err.contains("b1and"), "{err}");
    }

    #[test]
    fn sizes_count_bits() {
        assert_eq!((DType::S4.bits(), DType::B1Xor.bits(), DType::Tf32.bits()), (4, 1, 32));
        assert_eq!(DType::S4.storage_bytes(4096 * 4096), 4096 * 4096 / 2);
        assert_eq!(DType::B1And.storage_bytes(128), 16);
        assert_eq!(DType::B1Xor.storage_bytes(3), 1);
        assert_eq!(DType::F16.storage_bytes(10), 20);
        for d in DType::ALL {
            assert_eq!(d.is_packed(), d.bits() < 8);
            if !d.is_packed() {
                assert_eq!(d.bytes() * 8, d.bits());
            }
        }
        assert_eq!((DType::U4.k_multiple(), DType::B1And.k_multiple(), DType::F32.k_multiple()), (32, 128, 1));
    }
}
