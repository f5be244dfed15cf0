//! Sort along one dimension, giving the sorted values and the i64 position
//! each came from. The sort is always stable (equal elements keep their
//! order, ascending or descending), so the `stable` flag needs no work.
//! NaN sorts as larger than every number (last ascending, first
//! descending), as in torch; -0.0 and 0.0 are equal.

use std::cmp::Ordering;

use half::{bf16, f16};

use super::HostTensor;
use crate::error::{Error, Result};
use crate::ir::{DType, TensorType};

/// The order elements sort in.
trait SortKey: Copy {
    fn order(&self, other: &Self) -> Ordering;
}

macro_rules! int_key {
    ($($t:ty),*) => {$(
        impl SortKey for $t {
            fn order(&self, other: &Self) -> Ordering {
                self.cmp(other)
            }
        }
    )*};
}
int_key!(u8, i8, i32, i64);

/// NaN above everything, NaNs equal to each other.
fn float_order<T: PartialOrd>(a: T, b: T, a_nan: bool, b_nan: bool) -> Ordering {
    match (a_nan, b_nan) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        (false, false) => a.partial_cmp(&b).unwrap_or(Ordering::Equal),
    }
}

macro_rules! float_key {
    ($($t:ty),*) => {$(
        impl SortKey for $t {
            fn order(&self, other: &Self) -> Ordering {
                float_order(*self, *other, self.is_nan(), other.is_nan())
            }
        }
    )*};
}
float_key!(f32, f64, f16, bf16);

/// Sort every lane of `values` (shape outer × n × inner) along n, in place,
/// and write each element's original position to `indices`.
fn sort_lanes<T: SortKey>(
    values: &mut [T],
    indices: &mut [i64],
    n: usize,
    inner: usize,
    descending: bool,
) {
    let mut lane: Vec<(T, i64)> = Vec::with_capacity(n);
    for (block, index_block) in values
        .chunks_exact_mut(n * inner)
        .zip(indices.chunks_exact_mut(n * inner))
    {
        for i in 0..inner {
            lane.clear();
            lane.extend((0..n).map(|k| (block[k * inner + i], k as i64)));
            if descending {
                lane.sort_by(|a, b| b.0.order(&a.0));
            } else {
                lane.sort_by(|a, b| a.0.order(&b.0));
            }
            for (k, &(v, from)) in lane.iter().enumerate() {
                block[k * inner + i] = v;
                index_block[k * inner + i] = from;
            }
        }
    }
}

pub fn sort(
    x: &HostTensor,
    dimension: usize,
    descending: bool,
    _stable: bool,
) -> Result<Vec<HostTensor>> {
    let dims = x.dims();
    if dimension >= dims.len() {
        return Err(Error::invalid(format!(
            "dimension {dimension} is not below rank {}",
            dims.len()
        )));
    }
    let mut values = x.clone();
    let mut indices = HostTensor::zeros(TensorType::new(DType::I64, dims));
    if x.numel() == 0 {
        return Ok(vec![values, indices]);
    }
    let n = dims[dimension] as usize;
    let inner = dims[dimension + 1..].iter().product::<u64>() as usize;
    let idx = indices.as_slice_mut::<i64>();
    match x.dtype() {
        DType::Bool | DType::U8 => {
            sort_lanes(values.as_slice_mut::<u8>(), idx, n, inner, descending)
        }
        DType::I8 => sort_lanes(values.as_slice_mut::<i8>(), idx, n, inner, descending),
        DType::I32 => sort_lanes(values.as_slice_mut::<i32>(), idx, n, inner, descending),
        DType::I64 => sort_lanes(values.as_slice_mut::<i64>(), idx, n, inner, descending),
        DType::F16 => sort_lanes(values.as_slice_mut::<f16>(), idx, n, inner, descending),
        DType::BF16 => sort_lanes(values.as_slice_mut::<bf16>(), idx, n, inner, descending),
        DType::F32 => sort_lanes(values.as_slice_mut::<f32>(), idx, n, inner, descending),
        DType::F64 => sort_lanes(values.as_slice_mut::<f64>(), idx, n, inner, descending),
    }
    Ok(vec![values, indices])
}

#[cfg(test)]
mod tests {
    use super::super::structural::tests::{ravel, unravel, values};
    use super::super::{eval, HostTensor};
    use crate::ir::{DType, Prim};

    /// Values with many ties, plus NaN and signed zeros for floats.
    fn input(dtype: DType, dims: &[u64], seed: u64) -> HostTensor {
        let n = dims.iter().product::<u64>() as usize;
        let mut v: Vec<f64> = values(dtype, n, seed)
            .iter()
            .map(|v| {
                if dtype == DType::Bool {
                    *v
                } else {
                    v % 7.0 - 2.0
                }
            })
            .collect();
        if dtype == DType::U8 {
            v.iter_mut().for_each(|x| *x += 2.0);
        }
        if dtype.is_float() {
            for (i, x) in v.iter_mut().enumerate() {
                match i % 11 {
                    3 => *x = f64::NAN,
                    5 => *x = -0.0,
                    7 => *x = f64::NEG_INFINITY,
                    _ => {}
                }
            }
        }
        HostTensor::from_f64(dtype, dims, &v).unwrap()
    }

    fn same(a: f64, b: f64) -> bool {
        (a.is_nan() && b.is_nan()) || a == b
    }

    #[test]
    fn sort_matches_a_stable_reference() {
        let cases: &[(&[u64], usize)] = &[
            (&[0], 0),
            (&[1], 0),
            (&[13], 0),
            (&[0, 3], 1),
            (&[4, 0], 0),
            (&[5, 17], 1),
            (&[5, 17], 0),
            (&[3, 4, 5], 1),
            (&[3, 4, 5], 2),
        ];
        let dtypes = [
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
        for dtype in dtypes {
            for descending in [false, true] {
                for (seed, &(dims, dim)) in cases.iter().enumerate() {
                    let x = input(dtype, dims, seed as u64);
                    let prim = Prim::Sort {
                        dimension: dim,
                        descending,
                        stable: true,
                    };
                    let out = eval(&prim, &[&x]).unwrap();
                    assert_eq!(out[1].dtype(), DType::I64);
                    for p in 0..x.numel() {
                        let index = unravel(p, dims);
                        if index[dim] != 0 {
                            continue;
                        }
                        // The reference: the lane, stably sorted in f64.
                        let mut lane: Vec<(f64, usize)> = (0..dims[dim] as usize)
                            .map(|k| {
                                let mut j = index.clone();
                                j[dim] = k;
                                (x.get_f64(ravel(&j, dims)), k)
                            })
                            .collect();
                        let key = |v: f64| if v.is_nan() { f64::INFINITY } else { v };
                        let order = |a: &(f64, usize), b: &(f64, usize)| {
                            let o = key(a.0).partial_cmp(&key(b.0)).unwrap();
                            // NaN above +inf.
                            o.then(a.0.is_nan().cmp(&b.0.is_nan()))
                        };
                        if descending {
                            lane.sort_by(|a, b| order(b, a));
                        } else {
                            lane.sort_by(order);
                        }
                        for (k, &(v, from)) in lane.iter().enumerate() {
                            let mut j = index.clone();
                            j[dim] = k;
                            let at = ravel(&j, dims);
                            assert!(
                                same(out[0].get_f64(at), v),
                                "{dtype} {dims:?} desc={descending} at {j:?}"
                            );
                            assert_eq!(
                                out[1].get_f64(at),
                                from as f64,
                                "{dtype} {dims:?} desc={descending} at {j:?}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn nan_is_largest_and_ties_keep_their_order() {
        let x = HostTensor::from_f64(
            DType::F32,
            &[6],
            &[1.0, f64::NAN, -0.0, 0.0, f64::INFINITY, 1.0],
        )
        .unwrap();
        let up = eval(
            &Prim::Sort {
                dimension: 0,
                descending: false,
                stable: false,
            },
            &[&x],
        )
        .unwrap();
        assert_eq!(up[1].as_slice::<i64>(), &[2, 3, 0, 5, 4, 1]);
        let down = eval(
            &Prim::Sort {
                dimension: 0,
                descending: true,
                stable: true,
            },
            &[&x],
        )
        .unwrap();
        assert_eq!(down[1].as_slice::<i64>(), &[1, 4, 0, 5, 2, 3]);
    }
}
