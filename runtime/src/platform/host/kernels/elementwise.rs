//! Elementwise kernels (iota, unary, binary, compare, select, clamp,
//! convert) and the element-type plumbing the reduction and RNG kernels
//! share: typed views, the bool element, conversions, float and integer
//! arithmetic traits.
//!
//! Operands are contiguous and of one shape (broadcasting is a primitive of
//! its own), so every kernel is one loop over slices, monomorphized per
//! element type, with the op chosen outside the loop. f16 and bf16 are
//! widened to f32 in blocks, computed in f32 and rounded once on store.
//!
//! Semantics where StableHLO and IEEE leave a choice (PyTorch's otherwise):
//! - Integer add, sub, mul, neg and abs wrap. Integer division truncates,
//!   and division by zero does not trap: `x / 0 = 0` and `x % 0 = x`, so
//!   `x == (x / y) * y + x % y` holds for every pair; `MIN / -1 = MIN`.
//! - Float rem is C fmod (the sign of the dividend).
//! - Max, min and clamp propagate NaN (torch.maximum, torch.clamp); when
//!   clamp's min exceeds its max the result is max.
//! - Sign keeps ±0 and NaN. Round is half to even.
//! - Convert: float to integer truncates toward zero and saturates, NaN
//!   gives 0; integer to integer wraps (two's complement); anything to bool
//!   is `!= 0` (NaN is true); bool to a number is 0 or 1. Rounding to a
//!   float type is one round-to-nearest-even of the exact value, also from
//!   i64 and f64 to f16 and bf16.
//! - Iota's element is its index converted as Convert converts an i64.
//! - Bool elements are bytes 0 or 1; ops that read a bool as a truth value
//!   (not, select, convert) take any nonzero byte as true.

use std::borrow::Cow;
use std::ops::{Add, BitAnd, BitOr, BitXor, Div, Mul, Neg, Not, Rem, Sub};

use bytemuck::{Pod, Zeroable};
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use super::{Element, HostTensor};
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, CompareOp, DType, Prim, TensorType, UnaryOp};

// ---------------------------------------------------------------------------
// Typed views and element types.

/// A bool element: one byte.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Pod, Zeroable)]
#[repr(transparent)]
pub(super) struct Bool(pub u8);

fn check_size(t: &HostTensor) -> Result<()> {
    if t.bytes().len() as u64 != t.ty.nbytes() {
        return Err(Error::invalid(format!(
            "a tensor of type {} holds {} bytes, not {}",
            t.ty,
            t.bytes().len(),
            t.ty.nbytes()
        )));
    }
    Ok(())
}

fn check_view<T>(t: &HostTensor) -> Result<()> {
    check_size(t)?;
    if std::mem::size_of::<T>() != t.dtype().size() {
        return Err(Error::Internal(format!(
            "{} viewed as {}",
            t.ty,
            std::any::type_name::<T>()
        )));
    }
    Ok(())
}

/// The elements of `t` as `T`, which must have the size of `t`'s dtype.
pub(super) fn typed<T: Pod>(t: &HostTensor) -> Result<&[T]> {
    check_view::<T>(t)?;
    bytemuck::try_cast_slice(t.bytes())
        .map_err(|e| Error::Internal(format!("view of {}: {e}", t.ty)))
}

pub(super) fn typed_mut<T: Pod>(t: &mut HostTensor) -> Result<&mut [T]> {
    check_view::<T>(t)?;
    let ty = t.ty.clone();
    bytemuck::try_cast_slice_mut(t.bytes_mut())
        .map_err(|e| Error::Internal(format!("view of {ty}: {e}")))
}

/// Runs `$body` with `$T` naming the Rust element type of `$dtype`.
macro_rules! with_element_type {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            DType::Bool => {
                type $T = Bool;
                $body
            }
            DType::U8 => {
                type $T = u8;
                $body
            }
            DType::I8 => {
                type $T = i8;
                $body
            }
            DType::I32 => {
                type $T = i32;
                $body
            }
            DType::I64 => {
                type $T = i64;
                $body
            }
            DType::F16 => {
                type $T = f16;
                $body
            }
            DType::BF16 => {
                type $T = bf16;
                $body
            }
            DType::F32 => {
                type $T = f32;
                $body
            }
            DType::F64 => {
                type $T = f64;
                $body
            }
        }
    };
}

// ---------------------------------------------------------------------------
// Conversions.

/// Conversions with the semantics of `Convert` (see the module comment).
pub(super) trait Cast: Pod {
    fn from_i64(v: i64) -> Self;
    fn from_f32(v: f32) -> Self;
    fn from_f64(v: f64) -> Self;
    /// `self` converted to `D`.
    fn cast<D: Cast>(self) -> D;
}

macro_rules! cast_int {
    ($($t:ty),*) => {$(
        impl Cast for $t {
            #[inline(always)]
            fn from_i64(v: i64) -> Self {
                v as $t
            }
            #[inline(always)]
            fn from_f32(v: f32) -> Self {
                v as $t
            }
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            #[inline(always)]
            #[allow(clippy::unnecessary_cast)]
            fn cast<D: Cast>(self) -> D {
                D::from_i64(self as i64)
            }
        }
    )*};
}
cast_int!(u8, i8, i32, i64);

impl Cast for Bool {
    #[inline(always)]
    fn from_i64(v: i64) -> Self {
        Bool((v != 0) as u8)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        Bool((v != 0.0) as u8)
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        Bool((v != 0.0) as u8)
    }
    #[inline(always)]
    fn cast<D: Cast>(self) -> D {
        D::from_i64((self.0 != 0) as i64)
    }
}

impl Cast for f32 {
    #[inline(always)]
    fn from_i64(v: i64) -> Self {
        v as f32
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    #[inline(always)]
    fn cast<D: Cast>(self) -> D {
        D::from_f32(self)
    }
}

impl Cast for f64 {
    #[inline(always)]
    fn from_i64(v: i64) -> Self {
        v as f64
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v as f64
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v
    }
    #[inline(always)]
    fn cast<D: Cast>(self) -> D {
        D::from_f64(self)
    }
}

// Rounding to f16 or bf16 goes through f32 rounded to odd: an inexact
// result takes the neighbour whose last bit is 1. Rounding that once more
// to a format at least two bits narrower gives the correctly rounded
// result (round-to-odd, Boldo and Melquiond), where plain double rounding
// can be off at ties.
fn f32_round_odd_from_f64(v: f64) -> f32 {
    let r = v as f32;
    if !r.is_finite() || r as f64 == v || r.to_bits() & 1 == 1 {
        return r;
    }
    let away = v.abs() > (r as f64).abs();
    f32::from_bits(if away {
        r.to_bits() + 1
    } else {
        r.to_bits() - 1
    })
}

fn f32_round_odd_from_i64(v: i64) -> f32 {
    let r = v as f32;
    let (exact, got) = (v as i128, r as i128);
    if got == exact || r.to_bits() & 1 == 1 {
        return r;
    }
    let away = exact.abs() > got.abs();
    f32::from_bits(if away {
        r.to_bits() + 1
    } else {
        r.to_bits() - 1
    })
}

/// f16 and bf16: stored narrow, computed in f32.
pub(super) trait Half: Cast {
    fn widen(src: &[Self], dst: &mut [f32]);
    fn narrow(src: &[f32], dst: &mut [Self]);
    fn is_finite(self) -> bool;
}

macro_rules! half_impl {
    ($($t:ty),*) => {$(
        impl Cast for $t {
            #[inline(always)]
            fn from_i64(v: i64) -> Self {
                <$t>::from_f32(f32_round_odd_from_i64(v))
            }
            #[inline(always)]
            fn from_f32(v: f32) -> Self {
                <$t>::from_f32(v)
            }
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                <$t>::from_f32(f32_round_odd_from_f64(v))
            }
            #[inline(always)]
            fn cast<D: Cast>(self) -> D {
                D::from_f32(self.to_f32())
            }
        }
        impl Half for $t {
            fn widen(src: &[Self], dst: &mut [f32]) {
                src.convert_to_f32_slice(dst)
            }
            fn narrow(src: &[f32], dst: &mut [Self]) {
                dst.convert_from_f32_slice(src)
            }
            #[inline(always)]
            fn is_finite(self) -> bool {
                <$t>::is_finite(self)
            }
        }
    )*};
}
half_impl!(f16, bf16);

/// All of `x` widened to f32 (reductions over f16 and bf16 run on this).
/// Element types widened to f32 with `as` (what a pass computes in).
trait WidenAs: Element + Copy {
    fn widen_as(self) -> f32;
}

macro_rules! widen_as_impl {
    ($($t:ty),*) => {$(
        impl WidenAs for $t {
            #[inline(always)]
            fn widen_as(self) -> f32 {
                self as f32
            }
        }
    )*};
}
widen_as_impl!(i64, i32, i8, u8, f64);

fn widened<T: WidenAs>(t: &HostTensor) -> Vec<f32> {
    t.as_slice::<T>().iter().map(|&v| v.widen_as()).collect()
}

impl HostTensor {
    /// The elements as f32: borrowed for f32, converted by typed loops
    /// otherwise (a per-element decode by dtype cost about 1% of a Llama
    /// step, where i64 and bool operands of passes are converted each run).
    pub(crate) fn as_f32s(&self) -> Cow<'_, [f32]> {
        Cow::Owned(match self.dtype() {
            DType::F32 => return Cow::Borrowed(self.as_slice::<f32>()),
            DType::BF16 => widen_all(self.as_slice::<bf16>()),
            DType::F16 => widen_all(self.as_slice::<f16>()),
            DType::I64 => widened::<i64>(self),
            DType::I32 => widened::<i32>(self),
            DType::I8 => widened::<i8>(self),
            DType::U8 => widened::<u8>(self),
            DType::F64 => widened::<f64>(self),
            DType::Bool => self
                .as_slice::<u8>()
                .iter()
                .map(|&v| (v != 0) as u8 as f32)
                .collect(),
        })
    }
}

pub(super) fn widen_all<H: Half>(x: &[H]) -> Vec<f32> {
    let mut w = vec![0f32; x.len()];
    H::widen(x, &mut w);
    w
}

// ---------------------------------------------------------------------------
// Arithmetic traits.

/// f32 and f64: the types floats compute in.
pub(super) trait Real:
    Cast
    + PartialOrd
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Rem<Output = Self>
    + Neg<Output = Self>
{
    const ZERO: Self;
    const ONE: Self;
    const INFINITY: Self;
    const NEG_INFINITY: Self;
    fn to_f64(self) -> f64;
    fn exp(self) -> Self;
    fn exp_m1(self) -> Self;
    fn ln(self) -> Self;
    fn ln_1p(self) -> Self;
    fn sqrt(self) -> Self;
    fn tanh(self) -> Self;
    fn sin(self) -> Self;
    fn cos(self) -> Self;
    fn erf(self) -> Self;
    fn floor(self) -> Self;
    fn ceil(self) -> Self;
    fn round_ties_even(self) -> Self;
    fn abs(self) -> Self;
    fn powf(self, e: Self) -> Self;
    fn atan2(self, x: Self) -> Self;
    fn is_nan(self) -> bool;

    /// The larger, NaN if either is NaN.
    #[inline(always)]
    fn max_nan(self, o: Self) -> Self {
        if self > o || self.is_nan() {
            self
        } else {
            o
        }
    }
    /// The smaller, NaN if either is NaN.
    #[inline(always)]
    fn min_nan(self, o: Self) -> Self {
        if self < o || self.is_nan() {
            self
        } else {
            o
        }
    }
    /// -1, 0 or 1; ±0 and NaN are returned as they are.
    #[inline(always)]
    fn sign(self) -> Self {
        if self > Self::ZERO {
            Self::ONE
        } else if self < Self::ZERO {
            -Self::ONE
        } else {
            self
        }
    }
}

macro_rules! real_impl {
    ($t:ident, $erf:expr) => {
        impl Real for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            const INFINITY: Self = $t::INFINITY;
            const NEG_INFINITY: Self = $t::NEG_INFINITY;
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline(always)]
            fn exp(self) -> Self {
                $t::exp(self)
            }
            #[inline(always)]
            fn exp_m1(self) -> Self {
                $t::exp_m1(self)
            }
            #[inline(always)]
            fn ln(self) -> Self {
                $t::ln(self)
            }
            #[inline(always)]
            fn ln_1p(self) -> Self {
                $t::ln_1p(self)
            }
            #[inline(always)]
            fn sqrt(self) -> Self {
                $t::sqrt(self)
            }
            #[inline(always)]
            fn tanh(self) -> Self {
                $t::tanh(self)
            }
            #[inline(always)]
            fn sin(self) -> Self {
                $t::sin(self)
            }
            #[inline(always)]
            fn cos(self) -> Self {
                $t::cos(self)
            }
            #[inline(always)]
            fn erf(self) -> Self {
                $erf(self)
            }
            #[inline(always)]
            fn floor(self) -> Self {
                $t::floor(self)
            }
            #[inline(always)]
            fn ceil(self) -> Self {
                $t::ceil(self)
            }
            #[inline(always)]
            fn round_ties_even(self) -> Self {
                $t::round_ties_even(self)
            }
            #[inline(always)]
            fn abs(self) -> Self {
                $t::abs(self)
            }
            #[inline(always)]
            fn powf(self, e: Self) -> Self {
                $t::powf(self, e)
            }
            #[inline(always)]
            fn atan2(self, x: Self) -> Self {
                $t::atan2(self, x)
            }
            #[inline(always)]
            fn is_nan(self) -> bool {
                $t::is_nan(self)
            }
        }
    };
}
real_impl!(f32, erf_f32);
real_impl!(f64, erf_f64);

/// The integer element types, with the wrapping, non-trapping arithmetic
/// of the module comment.
pub(super) trait Int:
    Cast
    + Ord
    + Not<Output = Self>
    + BitAnd<Output = Self>
    + BitOr<Output = Self>
    + BitXor<Output = Self>
{
    const ZERO: Self;
    const ONE: Self;
    const MIN: Self;
    const MAX: Self;
    fn add_wrap(self, o: Self) -> Self;
    fn sub_wrap(self, o: Self) -> Self;
    fn mul_wrap(self, o: Self) -> Self;
    fn neg_wrap(self) -> Self;
    fn abs_wrap(self) -> Self;
    fn signum(self) -> Self;
    /// Truncating division; `x / 0 = 0`.
    #[inline(always)]
    fn div_total(self, o: Self) -> Self {
        if o == Self::ZERO {
            Self::ZERO
        } else {
            self.div_wrap(o)
        }
    }
    /// Remainder with the dividend's sign; `x % 0 = x`.
    #[inline(always)]
    fn rem_total(self, o: Self) -> Self {
        if o == Self::ZERO {
            self
        } else {
            self.rem_wrap(o)
        }
    }
    fn div_wrap(self, o: Self) -> Self;
    fn rem_wrap(self, o: Self) -> Self;
}

macro_rules! int_impl {
    ($t:ty, $abs:expr, $signum:expr) => {
        impl Int for $t {
            const ZERO: Self = 0;
            const ONE: Self = 1;
            const MIN: Self = <$t>::MIN;
            const MAX: Self = <$t>::MAX;
            #[inline(always)]
            fn add_wrap(self, o: Self) -> Self {
                self.wrapping_add(o)
            }
            #[inline(always)]
            fn sub_wrap(self, o: Self) -> Self {
                self.wrapping_sub(o)
            }
            #[inline(always)]
            fn mul_wrap(self, o: Self) -> Self {
                self.wrapping_mul(o)
            }
            #[inline(always)]
            fn neg_wrap(self) -> Self {
                self.wrapping_neg()
            }
            #[inline(always)]
            fn abs_wrap(self) -> Self {
                $abs(self)
            }
            #[inline(always)]
            fn signum(self) -> Self {
                $signum(self)
            }
            #[inline(always)]
            fn div_wrap(self, o: Self) -> Self {
                self.wrapping_div(o)
            }
            #[inline(always)]
            fn rem_wrap(self, o: Self) -> Self {
                self.wrapping_rem(o)
            }
        }
    };
}
int_impl!(u8, |v: u8| v, |v: u8| v.min(1));
int_impl!(i8, i8::wrapping_abs, i8::signum);
int_impl!(i32, i32::wrapping_abs, i32::signum);
int_impl!(i64, i64::wrapping_abs, i64::signum);

// ---------------------------------------------------------------------------
// erf, which std does not have.

const TWO_OVER_SQRT_PI: f64 = std::f64::consts::FRAC_2_SQRT_PI;
const ONE_OVER_SQRT_PI: f64 = std::f64::consts::FRAC_2_SQRT_PI * 0.5;

/// erf(x)·√π/2 = Σ (-1)^n x^(2n+1) / (n! (2n+1)): coefficients of x^(2n).
const ERF_TAYLOR: [f64; 19] = [
    1.0,
    -0.3333333333333333,
    0.1,
    -0.023809523809523808,
    0.004629629629629629,
    -0.0007575757575757576,
    0.00010683760683760684,
    -1.3227513227513228e-05,
    1.4589169000933706e-06,
    -1.4503852223150468e-07,
    1.3122532963802806e-08,
    -1.0892221037148573e-09,
    8.35070279514724e-11,
    -5.9477940136376354e-12,
    3.9554295164585257e-13,
    -2.466827010264457e-14,
    1.4483264643598138e-15,
    -8.032735012415773e-17,
    4.221407288807088e-18,
];

/// erf(x)·√π/2·e^(x²) = Σ x (2x²)^n / (2n+1)!!: coefficients 1/(2n+1)!!
/// of (2x²)^n. Every term is positive, so nothing cancels.
const ERF_POSITIVE: [f64; 40] = [
    1.0,
    0.3333333333333333,
    0.06666666666666667,
    0.009523809523809525,
    0.0010582010582010583,
    9.62000962000962e-05,
    7.4000074000074e-06,
    4.9333382666716e-07,
    2.901963686277412e-08,
    1.5273493085670588e-09,
    7.273091945557423e-11,
    3.1622138893727926e-12,
    1.264885555749117e-13,
    4.684761317589322e-15,
    1.6154349370997664e-16,
    5.211080442257311e-18,
    1.5791152855325184e-19,
    4.5117579586643385e-21,
    1.2193940428822536e-22,
    3.1266513920057783e-24,
    7.625979004892143e-26,
    1.7734834895098008e-27,
    3.9410744211328905e-29,
    8.38526472581466e-31,
    1.7112785154723796e-32,
    3.3554480695536855e-34,
    6.33103409349752e-36,
    1.1510971079086399e-37,
    2.019468610366035e-39,
    3.4228281531627713e-41,
    5.611193693709461e-43,
    8.906656656681684e-45,
    1.3702548702587206e-46,
    2.04515652277421e-48,
    2.9639949605423333e-50,
    4.174640789496244e-52,
    5.718686013008554e-54,
    7.624914684011405e-56,
    9.902486602612214e-58,
    1.2534793167863561e-59,
];

/// erfc(a)·e^(a²) on [1, 4] as a polynomial in t = (a - 2.5)/1.5, lowest
/// degree first: a Chebyshev fit (error about 2e-12) made for this file
/// with mpmath.
const ERFC_SCALED_1_TO_4: [f64; 17] = [
    0.2108063640611436,
    -0.111521020166433,
    0.05611049343905012,
    -0.027005297539129766,
    0.012489374163431244,
    -0.0055706939996416896,
    0.0024036437310381714,
    -0.0010059073126846983,
    0.0004091094785966628,
    -0.00016176248976652324,
    6.249842547895193e-05,
    -2.4069947374138474e-05,
    8.860847089031764e-06,
    -2.671312099623873e-06,
    9.59334995094123e-07,
    -6.36497045800298e-07,
    2.1340922384406343e-07,
];

#[inline(always)]
fn horner(coefficients: &[f64], y: f64) -> f64 {
    coefficients.iter().rev().fold(0.0, |s, &c| s * y + c)
}

/// e^(-x²), with x split so that the square is exact (x = hi + lo, hi of
/// 26 bits): rounding x² first would cost x² ulps.
#[inline(always)]
fn exp_neg_square(x: f64) -> f64 {
    let c = x * 134217729.0; // 2^27 + 1
    let hi = c - (c - x);
    let lo = x - hi;
    (-hi * hi).exp() * (-(2.0 * hi * lo + lo * lo)).exp()
}

/// erf in f64, within about 8 ulps (f32 rounds this, which is then
/// correctly rounded but for the rarest ties): the Taylor series below 1,
/// the positive series up to 2.5, the continued fraction of erfc up to 6,
/// and ±1 beyond (erf(6) rounds to 1).
pub(super) fn erf_f64(x: f64) -> f64 {
    let a = x.abs();
    if a < 1.0 {
        return TWO_OVER_SQRT_PI * (x * horner(&ERF_TAYLOR, x * x));
    }
    let r = if a < 2.5 {
        TWO_OVER_SQRT_PI * exp_neg_square(a) * (a * horner(&ERF_POSITIVE, 2.0 * a * a))
    } else if a < 6.0 {
        // erfc(a) = e^(-a²)/√π / (a + (1/2)/(a + (2/2)/(a + (3/2)/(a + ...))))
        let mut k = 0.0;
        for i in (1..=30).rev() {
            k = (i as f64 * 0.5) / (a + k);
        }
        1.0 - ONE_OVER_SQRT_PI * exp_neg_square(a) / (a + k)
    } else if a.is_nan() {
        return x;
    } else {
        1.0
    };
    r.copysign(x)
}

/// erf for f32, computed in f64 to about 1e-11 relative, so the rounded
/// result is almost always the correctly rounded one: the Taylor series
/// (13 terms) below 1, 1 - e^(-a²)·(the fit above) up to 4, and ±1 beyond
/// (erfc(4) is below half an f32 ulp of 1). Several times faster than
/// [`erf_f64`], which GELU on f32 activations would otherwise pay.
fn erf_f32(x: f32) -> f32 {
    let x = x as f64;
    let a = x.abs();
    let r = if a < 1.0 {
        TWO_OVER_SQRT_PI * (x * horner(&ERF_TAYLOR[..13], x * x))
    } else if a < 4.0 {
        (1.0 - (-a * a).exp() * horner(&ERFC_SCALED_1_TO_4, (a - 2.5) * (2.0 / 3.0))).copysign(x)
    } else if a.is_nan() {
        x
    } else {
        1f64.copysign(x)
    };
    r as f32
}

// ---------------------------------------------------------------------------
// Loops.

#[inline(always)]
fn map1<A: Copy, B>(x: &[A], out: &mut [B], f: impl Fn(A) -> B) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = f(v);
    }
}

#[inline(always)]
fn map2<A: Copy, B>(x: &[A], y: &[A], out: &mut [B], f: impl Fn(A, A) -> B) {
    for ((o, &a), &b) in out.iter_mut().zip(x).zip(y) {
        *o = f(a, b);
    }
}

/// f16/bf16 are processed in blocks of this many elements widened to f32.
const HALF_BLOCK: usize = 256;

/// Runs `f` on f32 copies of blocks of `x` and rounds its results into `out`.
fn half_map1<H: Half>(x: &[H], out: &mut [H], mut f: impl FnMut(&[f32], &mut [f32])) {
    let (mut a, mut r) = ([0f32; HALF_BLOCK], [0f32; HALF_BLOCK]);
    for (xs, os) in x.chunks(HALF_BLOCK).zip(out.chunks_mut(HALF_BLOCK)) {
        let n = xs.len();
        H::widen(xs, &mut a[..n]);
        f(&a[..n], &mut r[..n]);
        H::narrow(&r[..n], os);
    }
}

/// Runs `f` on f32 copies of blocks of `x` and `y`, writing `out` directly.
fn half_map2<H: Half, O>(
    x: &[H],
    y: &[H],
    out: &mut [O],
    mut f: impl FnMut(&[f32], &[f32], &mut [O]),
) {
    let (mut a, mut b) = ([0f32; HALF_BLOCK], [0f32; HALF_BLOCK]);
    for ((xs, ys), os) in x
        .chunks(HALF_BLOCK)
        .zip(y.chunks(HALF_BLOCK))
        .zip(out.chunks_mut(HALF_BLOCK))
    {
        let n = xs.len();
        H::widen(xs, &mut a[..n]);
        H::widen(ys, &mut b[..n]);
        f(&a[..n], &b[..n], os);
    }
}

// ---------------------------------------------------------------------------
// Iota.

pub fn iota(prim: &Prim, out: &TensorType) -> Result<HostTensor> {
    let Prim::Iota {
        dtype,
        dims,
        dimension,
    } = prim
    else {
        return Err(Error::invalid(format!(
            "the iota kernel cannot run {}",
            prim.name()
        )));
    };
    if out.dtype != *dtype || out.dims != *dims || *dimension >= dims.len() {
        return Err(Error::invalid(format!(
            "iota of {dtype}{dims:?} along {dimension} cannot give {out}"
        )));
    }
    let mut t = HostTensor::zeros(out.clone());
    let n = dims[*dimension] as usize;
    let inner = dims[dimension + 1..].iter().product::<u64>() as usize;
    with_element_type!(*dtype, T => iota_typed::<T>(typed_mut(&mut t)?, n, inner));
    Ok(t)
}

fn iota_typed<T: Cast>(out: &mut [T], n: usize, inner: usize) {
    if out.is_empty() {
        return;
    }
    for block in out.chunks_exact_mut(n * inner) {
        for (i, run) in block.chunks_exact_mut(inner).enumerate() {
            run.fill(T::from_i64(i as i64));
        }
    }
}

// ---------------------------------------------------------------------------
// Unary.

pub fn unary(op: UnaryOp, x: &HostTensor, out: &TensorType) -> Result<HostTensor> {
    let d = x.dtype();
    let want = if op == UnaryOp::IsFinite {
        TensorType::new(DType::Bool, x.dims())
    } else {
        x.ty.clone()
    };
    if *out != want {
        return Err(Error::invalid(format!(
            "{op:?} of {} gives {want}, not {out}",
            x.ty
        )));
    }
    let mut r = HostTensor::zeros(want);
    if op == UnaryOp::IsFinite {
        let o = typed_mut::<u8>(&mut r)?;
        match d {
            DType::F32 => map1(typed::<f32>(x)?, o, |v| v.is_finite() as u8),
            DType::F64 => map1(typed::<f64>(x)?, o, |v| v.is_finite() as u8),
            DType::F16 => map1(typed::<f16>(x)?, o, |v| Half::is_finite(v) as u8),
            DType::BF16 => map1(typed::<bf16>(x)?, o, |v| Half::is_finite(v) as u8),
            _ => o.fill(1),
        }
        return Ok(r);
    }
    match d {
        DType::F32 => unary_real::<f32>(op, typed(x)?, typed_mut(&mut r)?)?,
        DType::F64 => unary_real::<f64>(op, typed(x)?, typed_mut(&mut r)?)?,
        DType::F16 => unary_half::<f16>(op, typed(x)?, typed_mut(&mut r)?)?,
        DType::BF16 => unary_half::<bf16>(op, typed(x)?, typed_mut(&mut r)?)?,
        DType::U8 => unary_int::<u8>(op, typed(x)?, typed_mut(&mut r)?)?,
        DType::I8 => unary_int::<i8>(op, typed(x)?, typed_mut(&mut r)?)?,
        DType::I32 => unary_int::<i32>(op, typed(x)?, typed_mut(&mut r)?)?,
        DType::I64 => unary_int::<i64>(op, typed(x)?, typed_mut(&mut r)?)?,
        DType::Bool => match op {
            UnaryOp::Not => map1(typed::<u8>(x)?, typed_mut::<u8>(&mut r)?, |v| {
                (v == 0) as u8
            }),
            _ => return Err(unsupported(op, d)),
        },
    }
    Ok(r)
}

fn unsupported(op: impl std::fmt::Debug, d: DType) -> Error {
    Error::invalid(format!("{op:?} is not defined for {d}"))
}

fn unary_real<F: Real>(op: UnaryOp, x: &[F], out: &mut [F]) -> Result<()> {
    match op {
        UnaryOp::Neg => map1(x, out, |v| -v),
        UnaryOp::Abs => map1(x, out, F::abs),
        UnaryOp::Exp => map1(x, out, F::exp),
        UnaryOp::Expm1 => map1(x, out, F::exp_m1),
        UnaryOp::Log => map1(x, out, F::ln),
        UnaryOp::Log1p => map1(x, out, F::ln_1p),
        UnaryOp::Sqrt => map1(x, out, F::sqrt),
        UnaryOp::Rsqrt => map1(x, out, |v| F::ONE / v.sqrt()),
        UnaryOp::Tanh => map1(x, out, F::tanh),
        UnaryOp::Logistic => map1(x, out, |v| F::ONE / (F::ONE + (-v).exp())),
        UnaryOp::Sin => map1(x, out, F::sin),
        UnaryOp::Cos => map1(x, out, F::cos),
        UnaryOp::Erf => map1(x, out, F::erf),
        UnaryOp::Floor => map1(x, out, F::floor),
        UnaryOp::Ceil => map1(x, out, F::ceil),
        UnaryOp::Round => map1(x, out, F::round_ties_even),
        UnaryOp::Sign => map1(x, out, F::sign),
        UnaryOp::Not | UnaryOp::IsFinite => {
            return Err(Error::invalid(format!("{op:?} on floats")))
        }
    }
    Ok(())
}

fn unary_half<H: Half>(op: UnaryOp, x: &[H], out: &mut [H]) -> Result<()> {
    if matches!(op, UnaryOp::Not | UnaryOp::IsFinite) {
        return Err(Error::invalid(format!("{op:?} on floats")));
    }
    let mut result = Ok(());
    half_map1(x, out, |a, r| {
        if result.is_ok() {
            result = unary_real::<f32>(op, a, r);
        }
    });
    result
}

fn unary_int<I: Int>(op: UnaryOp, x: &[I], out: &mut [I]) -> Result<()> {
    match op {
        UnaryOp::Neg => map1(x, out, I::neg_wrap),
        UnaryOp::Abs => map1(x, out, I::abs_wrap),
        UnaryOp::Sign => map1(x, out, I::signum),
        UnaryOp::Not => map1(x, out, |v| !v),
        _ => {
            return Err(Error::invalid(format!(
                "{op:?} needs floating-point operands"
            )))
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Binary and compare.

fn same_type(x: &HostTensor, y: &HostTensor) -> Result<()> {
    if x.ty != y.ty {
        return Err(Error::invalid(format!(
            "operands {} and {} differ",
            x.ty, y.ty
        )));
    }
    Ok(())
}

pub fn binary(op: BinaryOp, x: &HostTensor, y: &HostTensor) -> Result<HostTensor> {
    same_type(x, y)?;
    let d = x.dtype();
    let mut r = HostTensor::zeros(x.ty.clone());
    match d {
        DType::F32 => binary_real::<f32>(op, typed(x)?, typed(y)?, typed_mut(&mut r)?)?,
        DType::F64 => binary_real::<f64>(op, typed(x)?, typed(y)?, typed_mut(&mut r)?)?,
        DType::F16 => binary_half::<f16>(op, typed(x)?, typed(y)?, typed_mut(&mut r)?)?,
        DType::BF16 => binary_half::<bf16>(op, typed(x)?, typed(y)?, typed_mut(&mut r)?)?,
        DType::U8 => binary_int::<u8>(op, typed(x)?, typed(y)?, typed_mut(&mut r)?)?,
        DType::I8 => binary_int::<i8>(op, typed(x)?, typed(y)?, typed_mut(&mut r)?)?,
        DType::I32 => binary_int::<i32>(op, typed(x)?, typed(y)?, typed_mut(&mut r)?)?,
        DType::I64 => binary_int::<i64>(op, typed(x)?, typed(y)?, typed_mut(&mut r)?)?,
        DType::Bool => {
            let (a, b, o) = (typed::<u8>(x)?, typed::<u8>(y)?, typed_mut::<u8>(&mut r)?);
            match op {
                BinaryOp::And | BinaryOp::Min => map2(a, b, o, |a, b| a & b),
                BinaryOp::Or | BinaryOp::Max => map2(a, b, o, |a, b| a | b),
                BinaryOp::Xor => map2(a, b, o, |a, b| a ^ b),
                _ => return Err(unsupported(op, d)),
            }
        }
    }
    Ok(r)
}

fn binary_real<F: Real>(op: BinaryOp, x: &[F], y: &[F], out: &mut [F]) -> Result<()> {
    match op {
        BinaryOp::Add => map2(x, y, out, |a, b| a + b),
        BinaryOp::Sub => map2(x, y, out, |a, b| a - b),
        BinaryOp::Mul => map2(x, y, out, |a, b| a * b),
        BinaryOp::Div => map2(x, y, out, |a, b| a / b),
        BinaryOp::Rem => map2(x, y, out, |a, b| a % b),
        BinaryOp::Pow => map2(x, y, out, F::powf),
        BinaryOp::Max => map2(x, y, out, F::max_nan),
        BinaryOp::Min => map2(x, y, out, F::min_nan),
        BinaryOp::Atan2 => map2(x, y, out, F::atan2),
        BinaryOp::And | BinaryOp::Or | BinaryOp::Xor => {
            return Err(Error::invalid(format!("{op:?} on floats")))
        }
    }
    Ok(())
}

fn binary_half<H: Half>(op: BinaryOp, x: &[H], y: &[H], out: &mut [H]) -> Result<()> {
    if matches!(op, BinaryOp::And | BinaryOp::Or | BinaryOp::Xor) {
        return Err(Error::invalid(format!("{op:?} on floats")));
    }
    let mut r = [0f32; HALF_BLOCK];
    let mut result = Ok(());
    half_map2(x, y, out, |a, b, o| {
        let n = a.len();
        if result.is_ok() {
            result = binary_real::<f32>(op, a, b, &mut r[..n]);
        }
        H::narrow(&r[..n], o);
    });
    result
}

fn binary_int<I: Int>(op: BinaryOp, x: &[I], y: &[I], out: &mut [I]) -> Result<()> {
    match op {
        BinaryOp::Add => map2(x, y, out, I::add_wrap),
        BinaryOp::Sub => map2(x, y, out, I::sub_wrap),
        BinaryOp::Mul => map2(x, y, out, I::mul_wrap),
        BinaryOp::Div => map2(x, y, out, I::div_total),
        BinaryOp::Rem => map2(x, y, out, I::rem_total),
        BinaryOp::Max => map2(x, y, out, Ord::max),
        BinaryOp::Min => map2(x, y, out, Ord::min),
        BinaryOp::And => map2(x, y, out, |a, b| a & b),
        BinaryOp::Or => map2(x, y, out, |a, b| a | b),
        BinaryOp::Xor => map2(x, y, out, |a, b| a ^ b),
        BinaryOp::Pow | BinaryOp::Atan2 => {
            return Err(Error::invalid(format!(
                "{op:?} needs floating-point operands"
            )))
        }
    }
    Ok(())
}

pub fn compare(op: CompareOp, x: &HostTensor, y: &HostTensor) -> Result<HostTensor> {
    same_type(x, y)?;
    let mut r = HostTensor::zeros(TensorType::new(DType::Bool, x.dims()));
    let o = typed_mut::<u8>(&mut r)?;
    match x.dtype() {
        DType::F16 => half_map2::<f16, u8>(typed(x)?, typed(y)?, o, |a, b, o| {
            compare_slices(op, a, b, o)
        }),
        DType::BF16 => half_map2::<bf16, u8>(typed(x)?, typed(y)?, o, |a, b, o| {
            compare_slices(op, a, b, o)
        }),
        d => with_element_type!(d, T => compare_slices::<T>(op, typed(x)?, typed(y)?, o)),
    }
    Ok(r)
}

#[inline(always)]
fn compare_slices<T: PartialOrd + Copy>(op: CompareOp, x: &[T], y: &[T], out: &mut [u8]) {
    match op {
        CompareOp::Eq => map2(x, y, out, |a, b| (a == b) as u8),
        CompareOp::Ne => map2(x, y, out, |a, b| (a != b) as u8),
        CompareOp::Lt => map2(x, y, out, |a, b| (a < b) as u8),
        CompareOp::Le => map2(x, y, out, |a, b| (a <= b) as u8),
        CompareOp::Gt => map2(x, y, out, |a, b| (a > b) as u8),
        CompareOp::Ge => map2(x, y, out, |a, b| (a >= b) as u8),
    }
}

// ---------------------------------------------------------------------------
// Select and clamp.

pub fn select(
    pred: &HostTensor,
    on_true: &HostTensor,
    on_false: &HostTensor,
) -> Result<HostTensor> {
    same_type(on_true, on_false)?;
    if pred.dtype() != DType::Bool || pred.dims() != on_true.dims() {
        return Err(Error::invalid(format!(
            "predicate {} must be bool of the operands' dims {:?}",
            pred.ty,
            on_true.dims()
        )));
    }
    let mut r = HostTensor::zeros(on_true.ty.clone());
    let p = typed::<u8>(pred)?;
    // Only the bits move, so one loop per element size serves every dtype.
    match on_true.dtype().size() {
        1 => select_bits::<u8>(p, on_true, on_false, &mut r)?,
        2 => select_bits::<u16>(p, on_true, on_false, &mut r)?,
        4 => select_bits::<u32>(p, on_true, on_false, &mut r)?,
        _ => select_bits::<u64>(p, on_true, on_false, &mut r)?,
    }
    Ok(r)
}

fn select_bits<T: Pod>(p: &[u8], a: &HostTensor, b: &HostTensor, r: &mut HostTensor) -> Result<()> {
    let (a, b) = (typed::<T>(a)?, typed::<T>(b)?);
    for (((o, &p), &a), &b) in typed_mut::<T>(r)?.iter_mut().zip(p).zip(a).zip(b) {
        *o = if p != 0 { a } else { b };
    }
    Ok(())
}

pub fn clamp(min: &HostTensor, x: &HostTensor, max: &HostTensor) -> Result<HostTensor> {
    for (t, name) in [(min, "min"), (max, "max")] {
        if t.dtype() != x.dtype() || !(t.dims().is_empty() || t.dims() == x.dims()) {
            return Err(Error::invalid(format!(
                "{name} must be a scalar or of x's type {}, got {}",
                x.ty, t.ty
            )));
        }
    }
    let mut r = HostTensor::zeros(x.ty.clone());
    let (lo, hi, out) = (min, max, &mut r);
    match x.dtype() {
        DType::F32 => clamp_typed::<f32>(lo, x, hi, out, clamp_real)?,
        DType::F64 => clamp_typed::<f64>(lo, x, hi, out, clamp_real)?,
        DType::F16 => clamp_half::<f16>(typed(lo)?, typed(x)?, typed(hi)?, typed_mut(out)?),
        DType::BF16 => clamp_half::<bf16>(typed(lo)?, typed(x)?, typed(hi)?, typed_mut(out)?),
        DType::U8 | DType::Bool => clamp_typed::<u8>(lo, x, hi, out, clamp_ord)?,
        DType::I8 => clamp_typed::<i8>(lo, x, hi, out, clamp_ord)?,
        DType::I32 => clamp_typed::<i32>(lo, x, hi, out, clamp_ord)?,
        DType::I64 => clamp_typed::<i64>(lo, x, hi, out, clamp_ord)?,
    }
    Ok(r)
}

fn clamp_typed<T: Pod>(
    lo: &HostTensor,
    x: &HostTensor,
    hi: &HostTensor,
    out: &mut HostTensor,
    f: impl Fn(T, T, T) -> T,
) -> Result<()> {
    clamp_slices(typed(lo)?, typed(x)?, typed(hi)?, typed_mut(out)?, f);
    Ok(())
}

#[inline(always)]
fn clamp_real<F: Real>(lo: F, v: F, hi: F) -> F {
    v.max_nan(lo).min_nan(hi)
}

#[inline(always)]
fn clamp_ord<T: Ord>(lo: T, v: T, hi: T) -> T {
    v.max(lo).min(hi)
}

/// `lo` and `hi` have x's length or are scalars (one element).
#[inline(always)]
fn clamp_slices<T: Copy>(lo: &[T], x: &[T], hi: &[T], out: &mut [T], f: impl Fn(T, T, T) -> T) {
    let n = x.len();
    let (lo_each, hi_each) = (lo.len() == n, hi.len() == n);
    let (Some(&l0), Some(&h0)) = (lo.first(), hi.first()) else {
        return; // n == 0
    };
    let it = out.iter_mut().zip(x);
    match (lo_each, hi_each) {
        (true, true) => it
            .zip(lo)
            .zip(hi)
            .for_each(|(((o, &v), &l), &h)| *o = f(l, v, h)),
        (true, false) => it.zip(lo).for_each(|((o, &v), &l)| *o = f(l, v, h0)),
        (false, true) => it.zip(hi).for_each(|((o, &v), &h)| *o = f(l0, v, h)),
        (false, false) => it.for_each(|(o, &v)| *o = f(l0, v, h0)),
    }
}

fn clamp_half<'a, H: Half>(lo: &'a [H], x: &[H], hi: &'a [H], out: &mut [H]) {
    let n = x.len();
    let mut bufs = [[0f32; HALF_BLOCK]; 4];
    let [bl, bx, bh, br] = &mut bufs;
    for (start, os) in (0..n).step_by(HALF_BLOCK).zip(out.chunks_mut(HALF_BLOCK)) {
        let m = os.len();
        let part = |s: &'a [H]| {
            if s.len() == n {
                &s[start..start + m]
            } else {
                s
            }
        };
        let (l, v, h) = (part(lo), &x[start..start + m], part(hi));
        H::widen(l, &mut bl[..l.len()]);
        H::widen(v, &mut bx[..m]);
        H::widen(h, &mut bh[..h.len()]);
        clamp_slices::<f32>(
            &bl[..l.len()],
            &bx[..m],
            &bh[..h.len()],
            &mut br[..m],
            clamp_real,
        );
        H::narrow(&br[..m], os);
    }
}

// ---------------------------------------------------------------------------
// Convert.

pub fn convert(x: &HostTensor, to: DType) -> Result<HostTensor> {
    let from = x.dtype();
    let mut r = HostTensor::zeros(TensorType::new(to, x.dims()));
    check_size(x)?;
    if from == to {
        r.bytes_mut().copy_from_slice(x.bytes());
        return Ok(r);
    }
    match (from, to) {
        // The common mixed-precision casts use the vectorized slice routines.
        (DType::F16, DType::F32) => f16::widen(typed(x)?, typed_mut(&mut r)?),
        (DType::BF16, DType::F32) => bf16::widen(typed(x)?, typed_mut(&mut r)?),
        (DType::F32, DType::F16) => f16::narrow(typed(x)?, typed_mut(&mut r)?),
        (DType::F32, DType::BF16) => bf16::narrow(typed(x)?, typed_mut(&mut r)?),
        _ => with_element_type!(from, S => with_element_type!(to, D => {
            map1(typed::<S>(x)?, typed_mut::<D>(&mut r)?, S::cast::<D>)
        })),
    }
    Ok(r)
}

#[cfg(test)]
pub(super) mod tests {
    //! Every op against an f64 (or exact integer) reference over shapes
    //! including rank 0 and zero-size, in every dtype the op takes. The
    //! helpers here serve the reduce and rng tests too.

    use super::*;

    pub const FLOATS: [DType; 4] = [DType::F16, DType::BF16, DType::F32, DType::F64];
    pub const INTS: [DType; 4] = [DType::U8, DType::I8, DType::I32, DType::I64];
    pub const ALL: [DType; 9] = [
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
    pub const SHAPES: &[&[u64]] = &[&[], &[0], &[5], &[3, 0, 2], &[2, 3, 4], &[2, 300]];

    pub fn numel(dims: &[u64]) -> usize {
        dims.iter().product::<u64>() as usize
    }

    /// `n` deterministic values in [lo, hi) (xorshift).
    pub fn values(n: usize, seed: u64, lo: f64, hi: f64) -> Vec<f64> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                lo + (hi - lo) * ((s >> 11) as f64 / (1u64 << 53) as f64)
            })
            .collect()
    }

    pub fn tensor(d: DType, dims: &[u64], v: &[f64]) -> HostTensor {
        HostTensor::from_f64(d, dims, v).unwrap()
    }

    /// `v` rounded to `d` by this module's conversion (tested on its own
    /// below against hand-worked ties).
    pub fn round_to(d: DType, v: f64) -> f64 {
        let mut t = HostTensor::zeros(TensorType::scalar(d));
        with_element_type!(d, T => typed_mut::<T>(&mut t).unwrap()[0] = T::from_f64(v));
        t.get_f64(0)
    }

    /// Integers of an integer dtype, wrapped into it.
    pub fn int_tensor(d: DType, dims: &[u64], v: &[i64]) -> HostTensor {
        let mut t = HostTensor::zeros(TensorType::new(d, dims));
        with_element_type!(d, T => {
            for (o, &v) in typed_mut::<T>(&mut t).unwrap().iter_mut().zip(v) {
                *o = T::from_i64(v);
            }
        });
        t
    }

    /// The elements of an integer or bool tensor, exactly.
    pub fn ints(t: &HostTensor) -> Vec<i64> {
        match t.dtype() {
            DType::Bool | DType::U8 => typed::<u8>(t).unwrap().iter().map(|&v| v as i64).collect(),
            DType::I8 => typed::<i8>(t).unwrap().iter().map(|&v| v as i64).collect(),
            DType::I32 => typed::<i32>(t).unwrap().iter().map(|&v| v as i64).collect(),
            DType::I64 => typed::<i64>(t).unwrap().to_vec(),
            d => panic!("{d} is not an integer dtype"),
        }
    }

    /// `v` wrapped into integer dtype `d`.
    pub fn wrap(d: DType, v: i128) -> i64 {
        match d {
            DType::Bool => (v != 0) as i64,
            DType::U8 => v as u8 as i64,
            DType::I8 => v as i8 as i64,
            DType::I32 => v as i32 as i64,
            _ => v as i64,
        }
    }

    /// Integers spread over `d`'s range (kept below 2^31 in magnitude for
    /// i64, so products stay exact in i128 and sums in f64).
    pub fn int_values(d: DType, n: usize, seed: u64) -> Vec<i64> {
        let (lo, hi) = match d {
            DType::Bool => (0.0, 2.0),
            DType::U8 => (0.0, 256.0),
            DType::I8 => (-128.0, 128.0),
            DType::I32 => (-2e9, 2e9),
            _ => (-2e9, 2e9),
        };
        values(n, seed, lo, hi)
            .iter()
            .map(|v| v.floor() as i64)
            .collect()
    }

    /// Relative and absolute tolerance for a result in `d` that f32 and
    /// f64 compute within `ulps`; f16 and bf16 get one ulp of their own
    /// (their f32 result is rounded once).
    pub fn tol(d: DType, ulps: f64) -> (f64, f64) {
        match d {
            DType::F64 => (ulps * f64::EPSILON, 1e-300),
            DType::F32 => (ulps * f32::EPSILON as f64, 1e-37),
            DType::F16 => (2f64.powi(-10), 2f64.powi(-24)),
            DType::BF16 => (2f64.powi(-7), 1e-37),
            _ => (0.0, 0.0),
        }
    }

    pub fn assert_close(got: &HostTensor, want: &[f64], (rel, abs): (f64, f64), what: &str) {
        let got = got.to_f64_vec();
        assert_eq!(got.len(), want.len(), "{what}: element count");
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            let ok = (g.is_nan() && w.is_nan()) || g == w || (g - w).abs() <= rel * w.abs() + abs;
            assert!(ok, "{what}: element {i}: got {g:e}, want {w:e}");
        }
    }

    // -- references ---------------------------------------------------------

    /// erf by Simpson's rule on 2/√π e^(-t²): slow, independent, and
    /// accurate to about 1e-12 relative on [-4, 4].
    fn erf_simpson(x: f64) -> f64 {
        let n = 2000;
        let h = x / n as f64;
        let f = |t: f64| (-t * t).exp();
        let mut s = f(0.0) + f(x);
        for i in 1..n {
            s += f(i as f64 * h) * if i % 2 == 1 { 4.0 } else { 2.0 };
        }
        s * h / 3.0 * TWO_OVER_SQRT_PI
    }

    /// (x, erf(x)) to 0.5 ulp, from a 200-bit evaluation.
    const ERF_TABLE: [(f64, f64); 23] = [
        (1e-300, 1.1283791670955126e-300),
        (1e-10, 1.1283791670955126e-10),
        (0.1, 0.1124629160182849),
        (0.5, 0.5204998778130465),
        (0.75, 0.7111556336535151),
        (0.999, 0.8422852702064969),
        (1.0, 0.8427007929497149),
        (1.3, 0.9340079449406524),
        (1.75, 0.9866716712191824),
        (2.0, 0.9953222650189527),
        (2.3, 0.9988568234026434),
        (2.4999, 0.9995928300996666),
        (2.5, 0.999593047982555),
        (2.75, 0.9998993780778803),
        (3.0, 0.9999779095030014),
        (3.9, 0.9999999652077514),
        (4.5, 0.9999999998033839),
        (5.5, 0.9999999999999927),
        (5.99, 1.0),
        (6.0, 1.0),
        (-0.3, -0.3286267594591274),
        (-1.5, -0.9661051464753108),
        (-3.7, -0.9999998328489421),
    ];

    #[test]
    fn erf_matches_a_high_precision_table() {
        for (x, want) in ERF_TABLE {
            let got = erf_f64(x);
            assert!(
                (got - want).abs() <= 8.0 * f64::EPSILON * want.abs(),
                "erf({x}) = {got:e}, want {want:e}"
            );
            let got32 = Real::erf(x as f32);
            let want32 = erf_f64(x as f32 as f64);
            assert!(
                (got32 as f64 - want32).abs() <= f32::EPSILON as f64 * want32.abs(),
                "f32 erf({x})"
            );
        }
        assert!(erf_f64(f64::NAN).is_nan());
        assert_eq!(erf_f64(f64::INFINITY), 1.0);
        assert_eq!(erf_f64(f64::NEG_INFINITY), -1.0);
        assert_eq!(erf_f64(-0.0).to_bits(), (-0.0f64).to_bits());
    }

    // -- iota ---------------------------------------------------------------

    #[test]
    fn iota_counts_along_its_dimension_in_every_dtype() {
        for d in ALL {
            for dims in [&[4u64][..], &[2, 3, 4], &[3, 0, 2], &[1, 5]] {
                for dim in 0..dims.len() {
                    let prim = Prim::Iota {
                        dtype: d,
                        dims: dims.to_vec(),
                        dimension: dim,
                    };
                    let out = iota(&prim, &TensorType::new(d, dims)).unwrap();
                    let strides = super::super::contiguous_strides(dims);
                    let want: Vec<f64> = (0..numel(dims))
                        .map(|i| round_to(d, ((i as u64 / strides[dim]) % dims[dim]) as f64))
                        .collect();
                    assert_close(
                        &out,
                        &want,
                        (0.0, 0.0),
                        &format!("iota {d}{dims:?} along {dim}"),
                    );
                }
            }
        }
        // Past 255 a u8 iota wraps, as Convert from i64 does.
        let prim = Prim::Iota {
            dtype: DType::U8,
            dims: vec![300],
            dimension: 0,
        };
        let out = iota(&prim, &TensorType::new(DType::U8, &[300])).unwrap();
        assert_eq!(out.get_f64(257), 1.0);
        let bad = Prim::Iota {
            dtype: DType::F32,
            dims: vec![3],
            dimension: 1,
        };
        assert!(iota(&bad, &TensorType::new(DType::F32, &[3])).is_err());
    }

    // -- unary --------------------------------------------------------------

    /// (op, input range, f64 reference, ulps; 0 means exact, compared with
    /// the reference rounded to the dtype).
    type FloatCase = (UnaryOp, f64, f64, fn(f64) -> f64, f64);

    fn quarter(v: f64) -> f64 {
        (v * 4.0).round() / 4.0
    }

    #[test]
    fn float_unary_ops_match_f64_references() {
        let cases: [FloatCase; 17] = [
            (UnaryOp::Neg, -10.0, 10.0, |v| -v, 0.0),
            (UnaryOp::Abs, -10.0, 10.0, f64::abs, 0.0),
            (UnaryOp::Exp, -10.0, 10.0, f64::exp, 2.0),
            (UnaryOp::Expm1, -2.0, 2.0, f64::exp_m1, 2.0),
            (UnaryOp::Log, 0.01, 100.0, f64::ln, 2.0),
            (UnaryOp::Log1p, -0.9, 10.0, f64::ln_1p, 2.0),
            (UnaryOp::Sqrt, 0.0, 100.0, f64::sqrt, 0.0),
            (UnaryOp::Rsqrt, 0.01, 100.0, |v| 1.0 / v.sqrt(), 2.0),
            (UnaryOp::Tanh, -5.0, 5.0, f64::tanh, 2.0),
            (
                UnaryOp::Logistic,
                -20.0,
                20.0,
                |v| 1.0 / (1.0 + (-v).exp()),
                3.0,
            ),
            (UnaryOp::Sin, -10.0, 10.0, f64::sin, 2.0),
            (UnaryOp::Cos, -10.0, 10.0, f64::cos, 2.0),
            (UnaryOp::Erf, -4.0, 4.0, erf_simpson, 2.0),
            (UnaryOp::Floor, -8.0, 8.0, f64::floor, 0.0),
            (UnaryOp::Ceil, -8.0, 8.0, f64::ceil, 0.0),
            (UnaryOp::Round, -8.0, 8.0, f64::round_ties_even, 0.0),
            (
                UnaryOp::Sign,
                -2.0,
                2.0,
                |v| if v == 0.0 { v } else { v.signum() },
                0.0,
            ),
        ];
        for &(op, lo, hi, reference, ulps) in &cases {
            for d in FLOATS {
                for (k, dims) in SHAPES.iter().enumerate() {
                    let mut v = values(numel(dims), k as u64 + 7, lo, hi);
                    if matches!(
                        op,
                        UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round | UnaryOp::Sign
                    ) {
                        v.iter_mut().for_each(|x| *x = quarter(*x)); // ties and zeros
                    }
                    let x = tensor(d, dims, &v);
                    let out = unary(op, &x, &x.ty).unwrap();
                    let what = format!("{:?} {}", op, x.ty);
                    let exact: Vec<f64> = x.to_f64_vec().iter().map(|&v| reference(v)).collect();
                    if ulps == 0.0 {
                        let want: Vec<f64> = exact.iter().map(|&w| round_to(d, w)).collect();
                        assert_close(&out, &want, (0.0, 0.0), &what);
                    } else {
                        let (rel, abs) = tol(d, ulps);
                        // f64 erf is checked against the table; Simpson is only good to ~1e-12.
                        let rel = if op == UnaryOp::Erf && d == DType::F64 {
                            1e-11
                        } else {
                            rel
                        };
                        assert_close(&out, &exact, (rel, abs), &what);
                    }
                }
            }
        }
    }

    #[test]
    fn float_unary_special_values() {
        let x = [
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            0.0,
            -0.0,
            2.5,
            -0.5,
            1.5,
        ];
        let cases: [(UnaryOp, [f64; 8]); 9] = [
            (
                UnaryOp::Exp,
                [
                    f64::NAN,
                    f64::INFINITY,
                    0.0,
                    1.0,
                    1.0,
                    2.5f64.exp(),
                    (-0.5f64).exp(),
                    1.5f64.exp(),
                ],
            ),
            (
                UnaryOp::Log,
                [
                    f64::NAN,
                    f64::INFINITY,
                    f64::NAN,
                    f64::NEG_INFINITY,
                    f64::NEG_INFINITY,
                    2.5f64.ln(),
                    f64::NAN,
                    1.5f64.ln(),
                ],
            ),
            (
                UnaryOp::Sqrt,
                [
                    f64::NAN,
                    f64::INFINITY,
                    f64::NAN,
                    0.0,
                    -0.0,
                    2.5f64.sqrt(),
                    f64::NAN,
                    1.5f64.sqrt(),
                ],
            ),
            (
                UnaryOp::Round,
                [
                    f64::NAN,
                    f64::INFINITY,
                    f64::NEG_INFINITY,
                    0.0,
                    -0.0,
                    2.0,
                    -0.0,
                    2.0,
                ],
            ),
            (
                UnaryOp::Sign,
                [f64::NAN, 1.0, -1.0, 0.0, -0.0, 1.0, -1.0, 1.0],
            ),
            (
                UnaryOp::Logistic,
                [
                    f64::NAN,
                    1.0,
                    0.0,
                    0.5,
                    0.5,
                    1.0 / (1.0 + (-2.5f64).exp()),
                    1.0 / (1.0 + 0.5f64.exp()),
                    1.0 / (1.0 + (-1.5f64).exp()),
                ],
            ),
            (
                UnaryOp::Tanh,
                [
                    f64::NAN,
                    1.0,
                    -1.0,
                    0.0,
                    -0.0,
                    2.5f64.tanh(),
                    (-0.5f64).tanh(),
                    1.5f64.tanh(),
                ],
            ),
            (
                UnaryOp::Erf,
                [
                    f64::NAN,
                    1.0,
                    -1.0,
                    0.0,
                    -0.0,
                    erf_f64(2.5),
                    erf_f64(-0.5),
                    erf_f64(1.5),
                ],
            ),
            (
                UnaryOp::Rsqrt,
                [
                    f64::NAN,
                    0.0,
                    f64::NAN,
                    f64::INFINITY,
                    f64::NEG_INFINITY,
                    1.0 / 2.5f64.sqrt(),
                    f64::NAN,
                    1.0 / 1.5f64.sqrt(),
                ],
            ),
        ];
        for d in FLOATS {
            let t = tensor(d, &[8], &x);
            for (op, want) in &cases {
                let out = unary(*op, &t, &t.ty).unwrap();
                let want: Vec<f64> = want.iter().map(|&w| round_to(d, w)).collect();
                assert_close(&out, &want, tol(d, 2.0), &format!("{op:?} {d} specials"));
                for (g, w) in out.to_f64_vec().iter().zip(&want) {
                    if *w == 0.0 {
                        assert_eq!(
                            g.is_sign_negative(),
                            w.is_sign_negative(),
                            "{op:?} {d}: sign of zero"
                        );
                    }
                }
            }
            let fin = unary(UnaryOp::IsFinite, &t, &TensorType::new(DType::Bool, &[8])).unwrap();
            assert_eq!(ints(&fin), [0, 0, 0, 1, 1, 1, 1, 1]);
        }
    }

    type IntFn = fn(i128) -> i128;
    pub(crate) type CompareFn = fn(f64, f64) -> bool;

    #[test]
    fn integer_and_bool_unary_ops_wrap() {
        for d in INTS {
            for (k, dims) in SHAPES.iter().enumerate() {
                let v = int_values(d, numel(dims), k as u64);
                let x = int_tensor(d, dims, &v);
                let cases: [(UnaryOp, IntFn); 4] = [
                    (UnaryOp::Neg, |v| -v),
                    (UnaryOp::Abs, i128::abs),
                    (UnaryOp::Sign, i128::signum),
                    (UnaryOp::Not, |v| !v),
                ];
                for (op, reference) in cases {
                    let out = unary(op, &x, &x.ty).unwrap();
                    let want: Vec<i64> = v
                        .iter()
                        .map(|&v| wrap(d, reference(wrap(d, v as i128) as i128)))
                        .collect();
                    assert_eq!(ints(&out), want, "{op:?} {}", x.ty);
                }
                let fin =
                    unary(UnaryOp::IsFinite, &x, &TensorType::new(DType::Bool, dims)).unwrap();
                assert!(ints(&fin).iter().all(|&b| b == 1));
            }
        }
        let m = int_tensor(DType::I64, &[3], &[i64::MIN, i64::MAX, -1]);
        assert_eq!(
            ints(&unary(UnaryOp::Neg, &m, &m.ty).unwrap()),
            [i64::MIN, -i64::MAX, 1]
        );
        assert_eq!(
            ints(&unary(UnaryOp::Abs, &m, &m.ty).unwrap()),
            [i64::MIN, i64::MAX, 1]
        );
        let b = int_tensor(DType::Bool, &[2], &[0, 1]);
        assert_eq!(ints(&unary(UnaryOp::Not, &b, &b.ty).unwrap()), [1, 0]);
        assert!(unary(UnaryOp::Neg, &b, &b.ty).is_err());
        assert!(unary(UnaryOp::Exp, &m, &m.ty).is_err());
        let f = tensor(DType::F32, &[1], &[1.0]);
        assert!(unary(UnaryOp::Not, &f, &f.ty).is_err());
        assert!(unary(UnaryOp::Exp, &f, &TensorType::new(DType::F32, &[2])).is_err());
    }

    // -- binary -------------------------------------------------------------

    #[test]
    fn float_binary_ops_match_f64_references() {
        type Case = (BinaryOp, fn(f64, f64) -> f64, f64);
        let cases: [Case; 9] = [
            (BinaryOp::Add, |a, b| a + b, 0.0),
            (BinaryOp::Sub, |a, b| a - b, 0.0),
            (BinaryOp::Mul, |a, b| a * b, 0.0),
            (BinaryOp::Div, |a, b| a / b, 0.0),
            (BinaryOp::Rem, |a, b| a % b, 0.0),
            (BinaryOp::Max, f64::max, 0.0),
            (BinaryOp::Min, f64::min, 0.0),
            (BinaryOp::Pow, f64::powf, 2.0),
            (BinaryOp::Atan2, f64::atan2, 2.0),
        ];
        for (op, reference, ulps) in cases {
            for d in FLOATS {
                for (k, dims) in SHAPES.iter().enumerate() {
                    let n = numel(dims);
                    let (xv, yv) = if op == BinaryOp::Pow {
                        (
                            values(n, k as u64, 0.1, 4.0),
                            values(n, k as u64 + 50, -3.0, 3.0),
                        )
                    } else {
                        (
                            values(n, k as u64, -10.0, 10.0),
                            values(n, k as u64 + 50, -10.0, 10.0),
                        )
                    };
                    let (x, y) = (tensor(d, dims, &xv), tensor(d, dims, &yv));
                    let out = binary(op, &x, &y).unwrap();
                    let exact: Vec<f64> = x
                        .to_f64_vec()
                        .iter()
                        .zip(y.to_f64_vec())
                        .map(|(&a, b)| reference(a, b))
                        .collect();
                    let what = format!("{op:?} {}", x.ty);
                    if ulps == 0.0 {
                        let want: Vec<f64> = exact.iter().map(|&w| round_to(d, w)).collect();
                        assert_close(&out, &want, (0.0, 0.0), &what);
                    } else {
                        assert_close(&out, &exact, tol(d, ulps), &what);
                    }
                }
            }
        }
    }

    #[test]
    fn float_binary_special_values() {
        let nan = f64::NAN;
        for d in FLOATS {
            let x = tensor(d, &[5], &[nan, 1.0, -7.5, 7.5, 0.0]);
            let y = tensor(d, &[5], &[1.0, nan, 2.0, -2.0, 0.0]);
            let max = binary(BinaryOp::Max, &x, &y).unwrap().to_f64_vec();
            let min = binary(BinaryOp::Min, &x, &y).unwrap().to_f64_vec();
            assert!(
                max[0].is_nan() && max[1].is_nan() && min[0].is_nan() && min[1].is_nan(),
                "{d}: NaN propagates"
            );
            assert_eq!(&max[2..], [2.0, 7.5, 0.0]);
            // fmod: the sign of the dividend.
            let rem = binary(BinaryOp::Rem, &x, &y).unwrap().to_f64_vec();
            assert_eq!(&rem[2..4], [-1.5, 1.5]);
            assert!(rem[4].is_nan());
            assert!(binary(BinaryOp::And, &x, &y).is_err());
        }
    }

    #[test]
    fn integer_binary_ops_wrap_and_never_trap() {
        type Case = (BinaryOp, fn(i128, i128) -> i128);
        let cases: [Case; 10] = [
            (BinaryOp::Add, |a, b| a + b),
            (BinaryOp::Sub, |a, b| a - b),
            (BinaryOp::Mul, |a, b| a * b),
            (BinaryOp::Div, |a, b| if b == 0 { 0 } else { a / b }),
            (BinaryOp::Rem, |a, b| if b == 0 { a } else { a % b }),
            (BinaryOp::Max, |a, b| a.max(b)),
            (BinaryOp::Min, |a, b| a.min(b)),
            (BinaryOp::And, |a, b| a & b),
            (BinaryOp::Or, |a, b| a | b),
            (BinaryOp::Xor, |a, b| a ^ b),
        ];
        for d in INTS {
            for (k, dims) in SHAPES.iter().enumerate() {
                let n = numel(dims);
                let xv = int_values(d, n, k as u64);
                // Small divisors, zero among them.
                let mut yv = int_values(d, n, k as u64 + 99);
                for (i, y) in yv.iter_mut().enumerate() {
                    if i % 3 == 0 {
                        *y = (i as i64 % 7) - 3;
                    }
                }
                let (x, y) = (int_tensor(d, dims, &xv), int_tensor(d, dims, &yv));
                let (xs, ys) = (ints(&x), ints(&y));
                for (op, reference) in cases {
                    let out = binary(op, &x, &y).unwrap();
                    let want: Vec<i64> = xs
                        .iter()
                        .zip(&ys)
                        .map(|(&a, &b)| wrap(d, reference(a as i128, b as i128)))
                        .collect();
                    assert_eq!(ints(&out), want, "{op:?} {}", x.ty);
                }
                assert!(binary(BinaryOp::Pow, &x, &y).is_err());
            }
        }
        let x = int_tensor(DType::I64, &[3], &[i64::MIN, i64::MIN, 7]);
        let y = int_tensor(DType::I64, &[3], &[-1, 0, 0]);
        assert_eq!(
            ints(&binary(BinaryOp::Div, &x, &y).unwrap()),
            [i64::MIN, 0, 0]
        );
        assert_eq!(
            ints(&binary(BinaryOp::Rem, &x, &y).unwrap()),
            [0, i64::MIN, 7]
        );
        let x = int_tensor(DType::I8, &[2], &[-128, -7]);
        let y = int_tensor(DType::I8, &[2], &[-1, 2]);
        assert_eq!(ints(&binary(BinaryOp::Div, &x, &y).unwrap()), [-128, -3]);
        assert_eq!(ints(&binary(BinaryOp::Rem, &x, &y).unwrap()), [0, -1]);
    }

    #[test]
    fn bool_binary_ops_are_logical() {
        let x = int_tensor(DType::Bool, &[4], &[0, 0, 1, 1]);
        let y = int_tensor(DType::Bool, &[4], &[0, 1, 0, 1]);
        for (op, want) in [
            (BinaryOp::And, [0, 0, 0, 1]),
            (BinaryOp::Or, [0, 1, 1, 1]),
            (BinaryOp::Xor, [0, 1, 1, 0]),
            (BinaryOp::Max, [0, 1, 1, 1]),
            (BinaryOp::Min, [0, 0, 0, 1]),
        ] {
            assert_eq!(ints(&binary(op, &x, &y).unwrap()), want, "{op:?}");
        }
        assert!(binary(BinaryOp::Add, &x, &y).is_err());
        let z = int_tensor(DType::Bool, &[3], &[0, 0, 1]);
        assert!(binary(BinaryOp::And, &x, &z).is_err());
    }

    // -- compare, select, clamp ---------------------------------------------

    /// Each compare op with what IEEE comparison says of it (also the
    /// loop engine's reference).
    pub(crate) const IEEE_COMPARES: [(CompareOp, CompareFn); 6] = [
        (CompareOp::Eq, |a, b| a == b),
        (CompareOp::Ne, |a, b| a != b),
        (CompareOp::Lt, |a, b| a < b),
        (CompareOp::Le, |a, b| a <= b),
        (CompareOp::Gt, |a, b| a > b),
        (CompareOp::Ge, |a, b| a >= b),
    ];

    #[test]
    fn compare_follows_ieee_in_every_dtype() {
        let ops = IEEE_COMPARES;
        for d in ALL {
            for (k, dims) in SHAPES.iter().enumerate() {
                let n = numel(dims);
                let (x, y) = if d.is_float() {
                    // Few distinct values, so ties are common; NaN among them.
                    let pick = |v: Vec<f64>| -> Vec<f64> {
                        v.iter()
                            .map(|&v| {
                                if v < 0.1 {
                                    f64::NAN
                                } else {
                                    (v * 4.0).floor() - 2.0
                                }
                            })
                            .collect()
                    };
                    (
                        tensor(d, dims, &pick(values(n, k as u64, 0.0, 1.0))),
                        tensor(d, dims, &pick(values(n, k as u64 + 3, 0.0, 1.0))),
                    )
                } else {
                    let small = |s: u64| -> Vec<i64> {
                        values(n, s, 0.0, 3.0)
                            .iter()
                            .map(|v| v.floor() as i64 - (d.is_signed() as i64))
                            .collect()
                    };
                    let small = |s| {
                        small(s)
                            .iter()
                            .map(|&v| if d == DType::Bool { v.clamp(0, 1) } else { v })
                            .collect::<Vec<_>>()
                    };
                    (
                        int_tensor(d, dims, &small(k as u64)),
                        int_tensor(d, dims, &small(k as u64 + 3)),
                    )
                };
                for (op, reference) in ops {
                    let out = compare(op, &x, &y).unwrap();
                    assert_eq!(out.ty, TensorType::new(DType::Bool, dims));
                    let want: Vec<f64> = x
                        .to_f64_vec()
                        .iter()
                        .zip(y.to_f64_vec())
                        .map(|(&a, b)| reference(a, b) as u8 as f64)
                        .collect();
                    assert_close(&out, &want, (0.0, 0.0), &format!("{op:?} {}", x.ty));
                }
            }
        }
        let a = tensor(DType::F32, &[2], &[-0.0, f64::NAN]);
        let b = tensor(DType::F32, &[2], &[0.0, f64::NAN]);
        assert_eq!(ints(&compare(CompareOp::Eq, &a, &b).unwrap()), [1, 0]);
        assert_eq!(ints(&compare(CompareOp::Ne, &a, &b).unwrap()), [0, 1]);
    }

    #[test]
    fn select_picks_per_element_in_every_dtype() {
        for d in ALL {
            for (k, dims) in SHAPES.iter().enumerate() {
                let n = numel(dims);
                let p: Vec<i64> = values(n, k as u64, 0.0, 2.0)
                    .iter()
                    .map(|v| v.floor() as i64)
                    .collect();
                let a = tensor(
                    d,
                    dims,
                    &values(n, 1, 0.0, 100.0)
                        .iter()
                        .map(|v| v.floor())
                        .collect::<Vec<_>>(),
                );
                let b = tensor(
                    d,
                    dims,
                    &values(n, 2, 0.0, 100.0)
                        .iter()
                        .map(|v| v.floor())
                        .collect::<Vec<_>>(),
                );
                let out = select(&int_tensor(DType::Bool, dims, &p), &a, &b).unwrap();
                let (av, bv) = (a.to_f64_vec(), b.to_f64_vec());
                let want: Vec<f64> = (0..n)
                    .map(|i| if p[i] != 0 { av[i] } else { bv[i] })
                    .collect();
                assert_close(&out, &want, (0.0, 0.0), &format!("select {}", a.ty));
            }
        }
        let a = tensor(DType::F32, &[2], &[1.0, 2.0]);
        assert!(select(&a, &a, &a).is_err());
        assert!(select(&int_tensor(DType::Bool, &[3], &[1, 0, 1]), &a, &a).is_err());
    }

    #[test]
    fn clamp_takes_scalar_or_full_bounds_and_propagates_nan() {
        for d in ALL {
            for (k, dims) in SHAPES.iter().enumerate() {
                let n = numel(dims);
                let (lo_v, hi_v, x_v) = if d == DType::Bool {
                    let bits = |s| {
                        values(n, s, 0.0, 2.0)
                            .iter()
                            .map(|v| v.floor())
                            .collect::<Vec<f64>>()
                    };
                    (bits(k as u64), bits(k as u64 + 1), bits(k as u64 + 2))
                } else {
                    let ints = |s, lo, hi| {
                        values(n, s, lo, hi)
                            .iter()
                            .map(|v| v.floor())
                            .collect::<Vec<f64>>()
                    };
                    (
                        ints(k as u64, 0.0, 40.0),
                        ints(k as u64 + 1, 30.0, 90.0),
                        ints(k as u64 + 2, 0.0, 120.0),
                    )
                };
                let x = tensor(d, dims, &x_v);
                let full = |v: &[f64]| tensor(d, dims, v);
                let scalar = |v: f64| tensor(d, &[], &[v]);
                let bounds = [
                    (full(&lo_v), full(&hi_v)),
                    (
                        scalar(20.0f64.min(if d == DType::Bool { 1.0 } else { 20.0 })),
                        full(&hi_v),
                    ),
                    (
                        full(&lo_v),
                        scalar(if d == DType::Bool { 0.0 } else { 50.0 }),
                    ),
                    (
                        scalar(if d == DType::Bool { 1.0 } else { 10.0 }),
                        scalar(if d == DType::Bool { 1.0 } else { 60.0 }),
                    ),
                ];
                for (lo, hi) in &bounds {
                    let out = clamp(lo, &x, hi).unwrap();
                    let at = |t: &HostTensor, i: usize| {
                        if t.numel() == 1 && n != 1 {
                            t.get_f64(0)
                        } else {
                            t.get_f64(i)
                        }
                    };
                    let want: Vec<f64> = (0..n)
                        .map(|i| x.get_f64(i).max(at(lo, i)).min(at(hi, i)))
                        .collect();
                    assert_close(
                        &out,
                        &want,
                        (0.0, 0.0),
                        &format!("clamp {} by {} and {}", x.ty, lo.ty, hi.ty),
                    );
                }
            }
        }
        for d in FLOATS {
            let x = tensor(d, &[4], &[f64::NAN, 5.0, -5.0, 0.5]);
            let out = clamp(&tensor(d, &[], &[0.0]), &x, &tensor(d, &[], &[1.0]))
                .unwrap()
                .to_f64_vec();
            assert!(out[0].is_nan());
            assert_eq!(&out[1..], [1.0, 0.0, 0.5]);
            let out = clamp(&tensor(d, &[], &[f64::NAN]), &x, &tensor(d, &[], &[1.0]))
                .unwrap()
                .to_f64_vec();
            assert!(out.iter().all(|v| v.is_nan()), "{d}: a NaN bound gives NaN");
            // min > max gives max, as torch.clamp does.
            let out = clamp(&tensor(d, &[], &[3.0]), &x, &tensor(d, &[], &[1.0]))
                .unwrap()
                .to_f64_vec();
            assert_eq!(&out[1..], [1.0, 1.0, 1.0]);
        }
        let x = tensor(DType::F32, &[2], &[1.0, 2.0]);
        assert!(clamp(&tensor(DType::F32, &[3], &[0.0; 3]), &x, &x).is_err());
        assert!(clamp(&tensor(DType::F64, &[], &[0.0]), &x, &x).is_err());
    }

    // -- convert ------------------------------------------------------------

    /// What Convert must give for an element holding `v`, from `from` to `to`.
    fn convert_reference(v: f64, from: DType, to: DType) -> f64 {
        if to == DType::Bool {
            return (v != 0.0) as u8 as f64;
        }
        if to.is_float() {
            return round_to(to, v);
        }
        let (min, max) = match to {
            DType::U8 => (0.0, 255.0),
            DType::I8 => (-128.0, 127.0),
            DType::I32 => (i32::MIN as f64, i32::MAX as f64),
            _ => (i64::MIN as f64, i64::MAX as f64),
        };
        if from.is_float() {
            if v.is_nan() {
                0.0
            } else {
                v.trunc().clamp(min, max)
            }
        } else {
            wrap(to, v as i128) as f64
        }
    }

    #[test]
    fn convert_between_every_pair_of_dtypes() {
        let floats = [
            -3e9,
            -300.7,
            -129.5,
            -128.0,
            -1.9,
            -0.5,
            -0.0,
            0.0,
            0.3,
            1.0,
            1.5,
            2.5,
            127.9,
            128.0,
            255.9,
            256.0,
            300.2,
            65504.0,
            70000.0,
            3e9,
            1e20,
            1e-20,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
        ];
        let integers: [i64; 16] = [
            -(1 << 40) - 1,
            -2147483648,
            -129,
            -128,
            -1,
            0,
            1,
            127,
            128,
            255,
            256,
            2049,
            65504,
            65520,
            2147483647,
            (1 << 40) + 3,
        ];
        for from in ALL {
            let x = if from.is_float() {
                tensor(from, &[floats.len() as u64], &floats)
            } else {
                int_tensor(from, &[integers.len() as u64], &integers)
            };
            for to in ALL {
                let out = convert(&x, to).unwrap();
                assert_eq!(out.ty, TensorType::new(to, x.dims()));
                let want: Vec<f64> = x
                    .to_f64_vec()
                    .iter()
                    .map(|&v| convert_reference(v, from, to))
                    .collect();
                assert_close(
                    &out,
                    &want,
                    (0.0, 0.0),
                    &format!("convert {} to {to}", x.ty),
                );
            }
        }
        for (from, to) in [
            (DType::F32, DType::I64),
            (DType::Bool, DType::F16),
            (DType::I8, DType::U8),
        ] {
            for dims in [&[][..], &[0], &[3, 0]] {
                let x = tensor(from, dims, &vec![1.0; numel(dims)]);
                assert_eq!(convert(&x, to).unwrap().ty, TensorType::new(to, dims));
            }
        }
    }

    #[test]
    fn conversions_to_half_types_round_once() {
        let p = |e: i32| 2f64.powi(e);
        // Just above an f16 tie (the 2^-40 is below what f16 keeps): up.
        assert_eq!(
            <f16 as Cast>::from_f64(1.0 + p(-11) + p(-40)).to_f64(),
            1.0 + p(-10)
        );
        assert_eq!(
            <bf16 as Cast>::from_f64(1.0 + p(-8) + p(-40)).to_f64(),
            1.0 + p(-7)
        );
        assert_eq!(
            <f16 as Cast>::from_f64(-(1.0 + p(-11) + p(-40))).to_f64(),
            -(1.0 + p(-10))
        );
        // Exact ties go to even.
        assert_eq!(<f16 as Cast>::from_f64(1.0 + p(-11)).to_f64(), 1.0);
        assert_eq!(
            <f16 as Cast>::from_f64(1.0 + 3.0 * p(-11)).to_f64(),
            1.0 + p(-9)
        );
        // i64 -> bf16: 2^40 + 2^32 + 1 is just above the tie between 2^40
        // and 2^40 + 2^33; through f32 it would round to the tie and then to 2^40.
        let v = (1i64 << 40) + (1 << 32) + 1;
        assert_eq!(<bf16 as Cast>::from_i64(v).to_f64(), p(40) + p(33));
        assert_eq!(<bf16 as Cast>::from_i64(-v).to_f64(), -(p(40) + p(33)));
        assert_eq!(<f16 as Cast>::from_i64(2051).to_f64(), 2052.0);
        assert_eq!(<f16 as Cast>::from_i64(65520).to_f64(), f64::INFINITY);
        assert_eq!(
            <f16 as Cast>::from_i64(i64::MIN).to_f64(),
            f64::NEG_INFINITY
        );
        assert_eq!(<bf16 as Cast>::from_i64(i64::MAX).to_f64(), p(63));
        // Overflow, underflow and specials.
        assert_eq!(<f16 as Cast>::from_f64(1e10).to_f64(), f64::INFINITY);
        assert_eq!(<bf16 as Cast>::from_f64(f64::MAX).to_f64(), f64::INFINITY);
        assert_eq!(
            <bf16 as Cast>::from_f64(1e-40).to_f64(),
            bf16::from_f32(1e-40).to_f64()
        );
        assert_eq!(<f16 as Cast>::from_f64(1e-10).to_f64(), 0.0);
        assert_eq!(<f16 as Cast>::from_f64(3.0 * p(-26)).to_f64(), p(-24)); // subnormal, above the tie
        assert!(<bf16 as Cast>::from_f64(f64::NAN).to_f64().is_nan());
        assert_eq!(<f16 as Cast>::from_f64(-0.0).to_bits(), 0x8000);
    }

    #[test]
    fn mismatched_operands_are_errors_not_panics() {
        let a = tensor(DType::F32, &[2], &[1.0, 2.0]);
        let b = tensor(DType::F64, &[2], &[1.0, 2.0]);
        assert!(binary(BinaryOp::Add, &a, &b).is_err());
        assert!(compare(CompareOp::Eq, &a, &b).is_err());
        let mut short = a.clone();
        short.ty = TensorType::new(DType::F32, &[3]);
        assert!(unary(UnaryOp::Neg, &short, &short.ty).is_err());
        assert!(convert(&short, DType::F64).is_err());
    }
}

#[cfg(test)]
mod throughput {
    //! Rough speed of the elementwise, reduction and RNG kernels. Run with
    //! `cargo test --release -p tpurt-runtime kernel_throughput -- --ignored --nocapture`.

    use std::time::Instant;

    use super::super::{reduce, rng};
    use super::*;
    use crate::ir::{ReduceOp, RngDistribution};

    /// Seconds per call of `f`, best of a few rounds.
    fn time(mut f: impl FnMut()) -> f64 {
        f();
        let mut best = f64::INFINITY;
        for _ in 0..5 {
            let start = Instant::now();
            f();
            best = best.min(start.elapsed().as_secs_f64());
        }
        best
    }

    #[test]
    #[ignore]
    fn kernel_throughput() {
        let n = 1usize << 22;
        let report =
            |what: &str, secs: f64| println!("{what:<36} {:>8.2} Gelem/s", n as f64 / secs / 1e9);
        for d in [DType::F32, DType::BF16, DType::F64, DType::I32] {
            let v: Vec<f64> = (0..n).map(|i| (i % 1000) as f64 * 0.01 - 5.0).collect();
            let x = HostTensor::from_f64(d, &[n as u64], &v).unwrap();
            report(
                &format!("{d} add"),
                time(|| drop(binary(BinaryOp::Add, &x, &x).unwrap())),
            );
            report(
                &format!("{d} max"),
                time(|| drop(binary(BinaryOp::Max, &x, &x).unwrap())),
            );
            report(
                &format!("{d} lt"),
                time(|| drop(compare(CompareOp::Lt, &x, &x).unwrap())),
            );
            if d.is_float() {
                report(
                    &format!("{d} exp"),
                    time(|| drop(unary(UnaryOp::Exp, &x, &x.ty).unwrap())),
                );
                report(
                    &format!("{d} erf"),
                    time(|| drop(unary(UnaryOp::Erf, &x, &x.ty).unwrap())),
                );
            }
            report(
                &format!("{d} convert to f32"),
                time(|| drop(convert(&x, DType::F32).unwrap())),
            );
            for (dims, dim) in [
                (&[1024u64, 4096][..], 1usize),
                (&[4096, 1024], 0),
                (&[64, 1024, 64], 1),
            ] {
                let x = HostTensor::from_bytes(TensorType::new(d, dims), x.bytes()).unwrap();
                let mut kept = dims.to_vec();
                kept.remove(dim);
                let out = TensorType::new(d, &kept);
                let secs = time(|| drop(reduce::reduce(ReduceOp::Sum, &[dim], &x, &out).unwrap()));
                report(&format!("{d} sum {dims:?} over {dim}"), secs);
                let secs = time(|| drop(reduce::reduce(ReduceOp::Max, &[dim], &x, &out).unwrap()));
                report(&format!("{d} max {dims:?} over {dim}"), secs);
            }
        }
        let s = HostTensor::from_slice(DType::I64, &[], &[7i64]).unwrap();
        for dist in [RngDistribution::Uniform, RngDistribution::Normal] {
            let out = TensorType::new(DType::F32, &[n as u64]);
            report(
                &format!("rng {dist:?} f32"),
                time(|| drop(rng::rng(dist, &s, &s, &out).unwrap())),
            );
        }
    }
}
