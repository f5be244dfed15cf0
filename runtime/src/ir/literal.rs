//! Literal values: encoding host numbers as the little-endian bytes of a dtype.

use half::{bf16, f16};

use super::dtype::DType;

/// `value` cast to `dtype` as a C cast would (saturating for integers,
/// nearest for floats; nonzero is true for bool), as little-endian bytes.
pub fn encode_scalar(dtype: DType, value: f64) -> Vec<u8> {
    match dtype {
        DType::Bool => vec![(value != 0.0) as u8],
        DType::U8 => vec![value as u8],
        DType::I8 => (value as i8).to_le_bytes().to_vec(),
        DType::I32 => (value as i32).to_le_bytes().to_vec(),
        DType::I64 => (value as i64).to_le_bytes().to_vec(),
        DType::F16 => f16::from_f64(value).to_le_bytes().to_vec(),
        DType::BF16 => bf16::from_f64(value).to_le_bytes().to_vec(),
        DType::F32 => (value as f32).to_le_bytes().to_vec(),
        DType::F64 => value.to_le_bytes().to_vec(),
    }
}

/// Element `i` of little-endian `bytes` of `dtype`, as f64.
pub fn decode(dtype: DType, bytes: &[u8], i: usize) -> f64 {
    let s = dtype.size();
    let b = &bytes[i * s..(i + 1) * s];
    match dtype {
        DType::Bool => (b[0] != 0) as u8 as f64,
        DType::U8 => b[0] as f64,
        DType::I8 => b[0] as i8 as f64,
        DType::I32 => i32::from_le_bytes(b.try_into().unwrap()) as f64,
        DType::I64 => i64::from_le_bytes(b.try_into().unwrap()) as f64,
        DType::F16 => f16::from_le_bytes(b.try_into().unwrap()).to_f64(),
        DType::BF16 => bf16::from_le_bytes(b.try_into().unwrap()).to_f64(),
        DType::F32 => f32::from_le_bytes(b.try_into().unwrap()) as f64,
        DType::F64 => f64::from_le_bytes(b.try_into().unwrap()),
    }
}
