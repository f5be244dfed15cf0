//! PyTorch's type promotion (torch.result_type), so `int + float` or
//! `f16 tensor * f32 scalar` give the dtype a PyTorch user expects.
//!
//! Operands rank by priority: tensors with dimensions, then zero-dim
//! tensors, then wrapped numbers (a Python scalar). The result takes the
//! highest category (bool < integer < float) among all operands; within
//! that category, the widest dtype among the operands of the highest
//! priority that reach it.

use crate::ir::DType;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Priority {
    WrappedNumber = 0,
    ZeroDim = 1,
    Dimensioned = 2,
}

fn category(d: DType) -> u8 {
    if d == DType::Bool {
        0
    } else if d.is_integer() {
        1
    } else {
        2
    }
}

/// The promotion of two dtypes of equal priority (torch.promote_types).
pub fn promote_types(a: DType, b: DType) -> DType {
    use DType::*;
    if a == b {
        return a;
    }
    match (a, b) {
        (Bool, x) | (x, Bool) => x,
        (U8, I8) | (I8, U8) => I32, // torch gives int16; we have no i16, so the next wider
        (F16, BF16) | (BF16, F16) => F32,
        (x, y) if category(x) == category(y) => {
            if x.size() >= y.size() {
                x
            } else {
                y
            }
        }
        (x, y) => {
            if category(x) > category(y) {
                x
            } else {
                y
            }
        }
    }
}

/// torch.result_type over operands with their priorities. Wrapped floats
/// arrive as f64 and wrapped ints as i64, as in PyTorch.
pub fn result_type(operands: &[(DType, Priority)]) -> DType {
    let top_category = operands
        .iter()
        .map(|(d, _)| category(*d))
        .max()
        .unwrap_or(2);
    // Highest priority present among operands reaching the top category.
    let best = operands
        .iter()
        .filter(|(d, _)| category(*d) == top_category)
        .map(|(_, p)| *p)
        .max()
        .unwrap_or(Priority::Dimensioned);
    let mut result: Option<DType> = None;
    for (d, p) in operands {
        if category(*d) == top_category && *p == best {
            result = Some(match result {
                None => *d,
                Some(r) => promote_types(r, *d),
            });
        }
    }
    let r = result.unwrap_or(DType::F32);
    // A wrapped number alone decides the category but not the width:
    // float scalar with int tensors -> the default float dtype (f32).
    if best == Priority::WrappedNumber
        && operands.iter().any(|(_, p)| *p != Priority::WrappedNumber)
    {
        return match top_category {
            2 => DType::F32,
            1 => DType::I64,
            _ => DType::Bool,
        };
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use DType::*;
    use Priority::*;

    #[test]
    fn matches_torch_result_type() {
        assert_eq!(result_type(&[(I64, Dimensioned), (F32, Dimensioned)]), F32);
        assert_eq!(
            result_type(&[(F16, Dimensioned), (F64, WrappedNumber)]),
            F16
        );
        assert_eq!(
            result_type(&[(I32, Dimensioned), (F64, WrappedNumber)]),
            F32
        );
        assert_eq!(
            result_type(&[(I32, Dimensioned), (I64, WrappedNumber)]),
            I32
        );
        assert_eq!(result_type(&[(BF16, Dimensioned), (F32, ZeroDim)]), BF16);
        assert_eq!(result_type(&[(I64, Dimensioned), (F16, ZeroDim)]), F16);
        assert_eq!(
            result_type(&[(Bool, Dimensioned), (Bool, Dimensioned)]),
            Bool
        );
        assert_eq!(
            result_type(&[(Bool, Dimensioned), (I64, WrappedNumber)]),
            I64
        );
        assert_eq!(result_type(&[(F16, Dimensioned), (BF16, Dimensioned)]), F32);
        assert_eq!(result_type(&[(F32, ZeroDim), (F64, ZeroDim)]), F64);
    }
}
