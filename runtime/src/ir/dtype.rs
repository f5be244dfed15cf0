//! Element types. The set is the one our frontends need: f32, bf16, f16,
//! f64, i64, i32, i8, u8 and bool (one byte, 0 or 1).

use std::fmt;

use crate::error::{Error, Result};

#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
#[repr(u32)]
pub enum DType {
    Bool = 0,
    U8 = 1,
    I8 = 2,
    I32 = 3,
    I64 = 4,
    F16 = 5,
    BF16 = 6,
    F32 = 7,
    F64 = 8,
}

pub const ALL_DTYPES: [DType; 9] = [
    DType::Bool,
    DType::U8,
    DType::I8,
    DType::I32,
    DType::I64,
    DType::F16,
    DType::BF16,
    DType::F32,
    DType::F64,
];

impl DType {
    pub fn size(self) -> usize {
        match self {
            DType::Bool | DType::U8 | DType::I8 => 1,
            DType::F16 | DType::BF16 => 2,
            DType::I32 | DType::F32 => 4,
            DType::I64 | DType::F64 => 8,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
    }

    pub fn is_integer(self) -> bool {
        matches!(self, DType::U8 | DType::I8 | DType::I32 | DType::I64)
    }

    pub fn is_signed(self) -> bool {
        matches!(self, DType::I8 | DType::I32 | DType::I64) || self.is_float()
    }

    /// Name as StableHLO writes it (i1 for bool, ui8 for u8).
    pub fn name(self) -> &'static str {
        match self {
            DType::Bool => "i1",
            DType::U8 => "ui8",
            DType::I8 => "i8",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
        }
    }

    pub fn from_name(name: &str) -> Result<DType> {
        ALL_DTYPES
            .iter()
            .copied()
            .find(|d| d.name() == name)
            .or(match name {
                "bool" => Some(DType::Bool),
                "u8" | "uint8" => Some(DType::U8),
                "int8" => Some(DType::I8),
                "int32" => Some(DType::I32),
                "int64" => Some(DType::I64),
                "float16" => Some(DType::F16),
                "bfloat16" => Some(DType::BF16),
                "float32" => Some(DType::F32),
                "float64" => Some(DType::F64),
                _ => None,
            })
            .ok_or_else(|| Error::invalid(format!("unknown dtype {name:?}")))
    }

    pub fn from_code(code: u32) -> Result<DType> {
        ALL_DTYPES
            .get(code as usize)
            .copied()
            .ok_or_else(|| Error::invalid(format!("unknown dtype code {code}")))
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_codes_are_stable() {
        for (i, d) in ALL_DTYPES.iter().enumerate() {
            assert_eq!(DType::from_name(d.name()).unwrap(), *d);
            assert_eq!(*d as u32, i as u32);
            assert_eq!(DType::from_code(i as u32).unwrap(), *d);
        }
        assert_eq!(DType::from_name("bfloat16").unwrap(), DType::BF16);
        assert!(DType::from_name("f8")
            .unwrap_err()
            .to_string()
            .contains("f8"));
    }
}
