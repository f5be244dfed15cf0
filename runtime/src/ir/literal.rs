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
        DType::F16 => f16::from_f32(f32_round_to_odd(value))
            .to_le_bytes()
            .to_vec(),
        DType::BF16 => bf16::from_f32(f32_round_to_odd(value))
            .to_le_bytes()
            .to_vec(),
        DType::F32 => (value as f32).to_le_bytes().to_vec(),
        DType::F64 => value.to_le_bytes().to_vec(),
    }
}

/// `value` as f32 rounded to odd: truncated toward zero, with the lowest
/// mantissa bit set when inexact. A second rounding of this to a narrower
/// type (f16, bf16) then equals one correct rounding of `value`; rounding
/// to nearest twice would not be at ties.
fn f32_round_to_odd(value: f64) -> f32 {
    let nearest = value as f32;
    if !value.is_finite() || nearest as f64 == value || nearest.is_infinite() {
        return nearest;
    }
    let mut t = nearest;
    if (t as f64).abs() > value.abs() {
        // Rounded away from zero: step one ulp back toward zero.
        t = f32::from_bits(t.to_bits() - 1);
    }
    f32::from_bits(t.to_bits() | 1)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_constants_round_once() {
        // Just above the tie between 1 and 1 + 2^-10: must round up.
        let v = 1.0 + 2f64.powi(-11) + 2f64.powi(-40);
        assert_eq!(
            decode(DType::F16, &encode_scalar(DType::F16, v), 0),
            1.0 + 2f64.powi(-10)
        );
        // Exactly the tie: to even (1.0).
        let v = 1.0 + 2f64.powi(-11);
        assert_eq!(decode(DType::F16, &encode_scalar(DType::F16, v), 0), 1.0);
        let v = -(1.0 + 2f64.powi(-8) + 2f64.powi(-45));
        assert_eq!(
            decode(DType::BF16, &encode_scalar(DType::BF16, v), 0),
            -(1.0 + 2f64.powi(-7))
        );
        assert_eq!(
            decode(DType::BF16, &encode_scalar(DType::BF16, 0.1), 0),
            half::bf16::from_f32(0.1).to_f64()
        );
        assert!(decode(DType::F16, &encode_scalar(DType::F16, 1e6), 0).is_infinite());
        assert!(decode(DType::F16, &encode_scalar(DType::F16, f64::NAN), 0).is_nan());
    }
}
