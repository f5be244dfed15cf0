//! Vectorizable f32 math for the loop engine: branch-free forms the
//! compiler turns into SIMD code, accurate to a few ulps (checked against
//! f64 in the tests). Used where libm would be called once per element.

/// e^x for f32: x = k ln2 + r with |r| <= ln2/2, e^r by a degree-7 Taylor
/// polynomial (error below 1e-8 relative on that range), times 2^k built
/// from exponent bits. Overflow gives inf, underflow 0, NaN stays NaN.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    const LN2_HI: f32 = 0.693_145_75; // ln 2 split in two for an exact k*ln2
    const LN2_LO: f32 = 1.428_606_8e-6;
    const INV_LN2: f32 = std::f32::consts::LOG2_E;
    // Round to nearest by adding and subtracting 1.5 * 2^23 (plain SSE2
    // arithmetic; `round` would be a libm call per element here).
    const SHIFT: f32 = 12_582_912.0;
    // Below the underflow threshold the result is 0 whatever is computed:
    // compute e^0 there instead, since 2^k for k near -150 is subnormal and
    // a multiply giving a subnormal costs many cycles on x86 (a masked
    // attention row of -inf ran 2.7x slower than one of zeros).
    let xc = if x < -103.97208 {
        0.0
    } else {
        x.clamp(-104.0, 89.0)
    };
    // mul_add: one fused instruction on x86-64-v3 (FMA) and aarch64, and
    // half the instructions of the polynomial.
    let shifted = xc.mul_add(INV_LN2, SHIFT);
    let k = shifted - SHIFT;
    let r = k.mul_add(-LN2_LO, k.mul_add(-LN2_HI, xc));
    // Taylor coefficients 1/n!, Horner's rule.
    let mut p: f32 = 1.0 / 5040.0;
    for c in [
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ] {
        p = p.mul_add(r, c);
    }
    // k as an integer, read from the mantissa of `shifted` (k is within
    // [-151, 129], so it sits in the low bits): `k as i32` would be a
    // saturating scalar conversion per element and stop vectorization.
    let ki = shifted.to_bits() as i32 - SHIFT.to_bits() as i32;
    // 2^k, split in two factors so k down to -150 stays representable.
    let k1 = ki >> 1; // floor(k / 2)
    let k2 = ki - k1;
    let s1 = f32::from_bits(((k1 + 127) as u32) << 23);
    let s2 = f32::from_bits(((k2 + 127) as u32) << 23);
    let y = p * s1 * s2;
    if x.is_nan() {
        x
    } else if x > 88.72284 {
        f32::INFINITY
    } else if x < -103.97208 {
        0.0
    } else {
        y
    }
}

/// erf for f32, one path for every element: erf(a)/a for a = |x| as a
/// ratio of two degree-5 polynomials in a² (our own fit on [0, 3.92],
/// relative error 1.9e-8; erf rounds to ±1 beyond), evaluated in f64,
/// each rounded to f32 for the division: within 3.2 ulps. In f32 the
/// polynomials' rounding reached 5 ulps. (The form before computed a
/// Taylor series and an erfc fit with an exp for every element and kept
/// one: a quarter of a fused GELU-dropout block's time.)
#[inline(always)]
pub fn erf_f32(x: f32) -> f32 {
    const P: [f64; 6] = [
        1.128_379_146_251_372_6,
        0.190_394_842_077_096_28,
        0.052_746_850_010_015_99,
        0.003_765_038_982_611_624,
        0.000_284_856_546_310_292_14,
        2.049_999_533_682_012e-6,
    ];
    const Q: [f64; 6] = [
        1.0,
        0.502_065_779_157_522_6,
        0.114_104_006_598_776_62,
        0.014_968_052_966_862_485,
        0.001_162_371_642_738_344,
        3.808_944_028_699_94e-5,
    ];
    let a = x.abs().min(3.92);
    let t = (a as f64) * (a as f64);
    let mut p = P[5];
    let mut q = Q[5];
    for k in (0..5).rev() {
        p = p.mul_add(t, P[k]);
        q = q.mul_add(t, Q[k]);
    }
    let r = ((p as f32) / (q as f32) * a).min(1.0).copysign(x);
    if x.is_nan() {
        x
    } else {
        r
    }
}

/// 1 / (1 + e^-x) with the fast exp.
#[inline(always)]
pub fn logistic_f32(x: f32) -> f32 {
    1.0 / (1.0 + exp_f32(-x))
}

/// tanh(x) = 1 - 2 / (e^(2x) + 1), with a series near 0 where that form
/// loses precision.
#[inline(always)]
pub fn tanh_f32(x: f32) -> f32 {
    let z = x * x;
    // The series to x^15 for |x| < 0.4 (the next term is below 1e-8
    // relative there); above, the exp form loses at most 1.6x to
    // cancellation.
    let mut small: f32 = -929_569.0 / 638_512_875.0;
    for c in [
        21_844.0 / 6_081_075.0,
        -1382.0 / 155_925.0,
        62.0 / 2835.0,
        -17.0 / 315.0,
        2.0 / 15.0,
        -1.0 / 3.0,
        1.0,
    ] {
        small = small.mul_add(z, c);
    }
    let small = x * small;
    let e = exp_f32(2.0 * x.clamp(-20.0, 20.0));
    let large = 1.0 - 2.0 / (e + 1.0);
    if x.abs() < 0.4 {
        small
    } else {
        large
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ulps(a: f32, b: f64) -> f64 {
        let b32 = b as f32;
        if a == b32 {
            return 0.0;
        }
        let ulp = (b32.abs() as f64).max(f32::MIN_POSITIVE as f64) * f32::EPSILON as f64;
        (a as f64 - b).abs() / ulp
    }

    fn erf64(x: f64) -> f64 {
        super::super::kernels::erf(x)
    }

    #[test]
    fn exp_underflows_to_zero_and_keeps_subnormal_results() {
        for x in [f32::NEG_INFINITY, f32::MIN, -1e30, -104.0, -103.98] {
            assert_eq!(exp_f32(x).to_bits(), 0, "{x}");
        }
        // Just above the threshold the result is subnormal, and close.
        for x in [-103.9f32, -100.0, -95.0, -88.0] {
            let (got, want) = (exp_f32(x) as f64, (x as f64).exp());
            assert!(
                got > 0.0 && (got - want).abs() <= want * 1e-3 + 1e-45,
                "{x}: {got} vs {want}"
            );
        }
        assert!(exp_f32(f32::NAN).is_nan());
        assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
    }

    #[test]
    fn fast_functions_are_within_a_few_ulps() {
        let mut worst = [0f64; 4];
        let mut x = -12.0f32;
        while x < 12.0 {
            worst[0] = worst[0].max(ulps(exp_f32(x), (x as f64).exp()));
            worst[1] = worst[1].max(
                ulps(erf_f32(x), erf64(x as f64)).min(1e9)
                    * ((erf64(x as f64).abs() > 1e-30) as u8 as f64),
            );
            worst[2] = worst[2].max(ulps(logistic_f32(x), 1.0 / (1.0 + (-(x as f64)).exp())));
            worst[3] = worst[3].max(ulps(tanh_f32(x), (x as f64).tanh()));
            x += 0.000_37;
        }
        assert!(worst[0] <= 2.0, "exp: {} ulps", worst[0]);
        assert!(worst[1] <= 4.0, "erf: {} ulps", worst[1]);
        assert!(worst[2] <= 4.0, "logistic: {} ulps", worst[2]);
        assert!(worst[3] <= 4.0, "tanh: {} ulps", worst[3]);
        assert_eq!(exp_f32(100.0), f32::INFINITY);
        assert_eq!(exp_f32(-200.0), 0.0);
        assert!(exp_f32(f32::NAN).is_nan() && erf_f32(f32::NAN).is_nan());
        assert_eq!(erf_f32(f32::INFINITY), 1.0);
        assert_eq!(tanh_f32(f32::NEG_INFINITY), -1.0);
        // Subnormal results of exp: within one subnormal step.
        for x in [-90.0f32, -100.0, -103.0] {
            let want = (x as f64).exp() as f32;
            assert!(
                (exp_f32(x).to_bits() as i64 - want.to_bits() as i64).abs() <= 1,
                "exp({x})"
            );
        }
    }
}
