//! Vectorizable f32 math for the loop engine: branch-free forms the
//! compiler turns into SIMD code, accurate to a few ulps (checked against
//! f64 in the tests). Used where libm would be called once per element.
//! erf (and GELU over it) picks its coefficients per lane from a table,
//! which the compiler would do with gathers, so its runs are written out
//! for AVX-512 and AVX2, with the scalar form for the rest and the same
//! bits from every path.

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

/// erf(a)/a for a = |x| on eight intervals [i/2, (i+1)/2): row k holds
/// each interval's coefficient of (a - c_i)^k, c_i the interval's middle.
/// Our own fit, made and checked by `scripts/fit_erf.py` (evaluated as
/// below: within 1.16 ulps of erf on a grid of 1e-6 over [0, 4.5]).
const ERF_TABLE: [[f32; 8]; 7] = [
    [
        1.1053056, 0.9482075, 0.7383201, 0.5638124, 0.44379434, 0.36359978, 0.30769098, 0.26666665,
    ],
    [
        -0.18116549,
        -0.4070351,
        -0.4014393,
        -0.2920214,
        -0.19406754,
        -0.1320049,
        -0.09466517,
        -0.07111087,
    ],
    [
        -0.33535096,
        -0.10021747,
        0.08463001,
        0.11409438,
        0.07910997,
        0.047415506,
        0.029098554,
        0.018962016,
    ],
    [
        0.10469176,
        0.16932423,
        0.06634181,
        -0.013673203,
        -0.025507824,
        -0.016239464,
        -0.00889319,
        -0.0050543468,
    ],
    [
        0.089017585,
        -0.02486117,
        -0.057977043,
        -0.019674616,
        0.0028525556,
        0.0047204453,
        0.0026483089,
        0.0013441572,
    ],
    [
        -0.034969617,
        -0.037270684,
        0.008085701,
        0.014862087,
        0.003571809,
        -0.00067467865,
        -0.00071711396,
        -0.00035565643,
    ],
    [
        -0.017978664,
        0.014211515,
        0.00998808,
        -0.0033321108,
        -0.0028165823,
        -0.00035910174,
        0.00013647207,
        8.924354e-05,
    ],
];

/// Where erf rounds to ±1 in f32 (erfc(4) is half an f32 ulp of 1).
const ERF_TOP: f32 = 4.0;

/// erf for f32: a · g_i(a - c_i) for a = |x| below 4 (see `ERF_TABLE`),
/// ±1 beyond, NaN kept; within 1.2 ulps, all in f32. This is the scalar
/// form; [`erf_run`] and [`gelu_run`] compute the same bits with the
/// coefficients picked by a lane shuffle (a table read per lane would be
/// a gather, slower than the polynomial). The form before, a rational fit
/// evaluated in f64 (3.2 ulps), took 28% of a fused
/// GELU-dropout-residual-layer_norm block's time.
#[inline(always)]
pub fn erf_f32(x: f32) -> f32 {
    let a = x.abs().min(ERF_TOP);
    let i = ((a * 2.0) as i32).min(7) as usize;
    let z = a - (i as f32).mul_add(0.5, 0.25);
    let mut p = ERF_TABLE[6][i];
    for row in ERF_TABLE[..6].iter().rev() {
        p = p.mul_add(z, row[i]);
    }
    let r = if a >= ERF_TOP { 1.0 } else { (p * a).min(1.0) };
    if x.is_nan() {
        x
    } else {
        r.copysign(x)
    }
}

/// `out[j] = erf(x[j])`, as [`erf_f32`], bit for bit.
pub fn erf_run(out: &mut [f32], x: &[f32]) {
    run(out, x, None, Form::Erf);
}

/// GELU's exact form as the op library writes it,
/// `out[j] = (erf(v · c) + 1) · (v · h)` for `v = x[j]`, or
/// `v = x[j] + bias[j]` with a bias, each op rounded to f32 as on its own
/// (as [`erf_f32`] and plain f32 arithmetic give, bit for bit).
pub fn gelu_run(out: &mut [f32], x: &[f32], bias: Option<&[f32]>, c: f32, h: f32) {
    run(out, x, bias, Form::Gelu { c, h });
}

/// What a run computes from each element.
#[derive(Clone, Copy)]
enum Form {
    Erf,
    Gelu { c: f32, h: f32 },
}

impl Form {
    #[inline(always)]
    fn one(self, v: f32) -> f32 {
        match self {
            Form::Erf => erf_f32(v),
            Form::Gelu { c, h } => (erf_f32(v * c) + 1.0) * (v * h),
        }
    }
}

/// 16 lanes at a time with AVX-512, else 8 with AVX2, the rest one by
/// one; every path gives the same bits (the same operations, fused
/// multiply-adds included).
/// (`bias`, when given, is added to `x` first.)
fn run(out: &mut [f32], x: &[f32], bias: Option<&[f32]>, form: Form) {
    let n = out
        .len()
        .min(x.len())
        .min(bias.map_or(usize::MAX, <[f32]>::len));
    let (out, x, bias) = (&mut out[..n], &x[..n], bias.map(|b| &b[..n]));
    #[cfg(target_arch = "x86_64")]
    let done = if super::cpu::avx512() {
        // SAFETY: the CPU has AVX-512 F, BW, DQ and VL (checked by `avx512`).
        unsafe { x86::run16(out, x, bias, form) }
    } else {
        x86::run8(out, x, bias, form)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let done = 0;
    for (j, o) in out.iter_mut().enumerate().skip(done) {
        let v = match bias {
            Some(b) => x[j] + b[j],
            None => x[j],
        };
        *o = form.one(v);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{Form, ERF_TABLE, ERF_TOP};
    use std::arch::x86_64::*;

    /// `erf_f32` on 16 lanes.
    #[inline(always)]
    fn erf16(x: __m512, table: &[__m512; 7]) -> __m512 {
        // SAFETY (every intrinsic below): register arithmetic only, in
        // functions compiled for AVX-512 F, BW, DQ and VL.
        unsafe {
            let sign = _mm512_set1_ps(-0.0);
            let top = _mm512_set1_ps(ERF_TOP);
            let one = _mm512_set1_ps(1.0);
            // min(NaN, top) is top, as f32::min gives.
            let a = _mm512_min_ps(_mm512_andnot_ps(sign, x), top);
            let i = _mm512_min_epi32(
                _mm512_cvttps_epi32(_mm512_mul_ps(a, _mm512_set1_ps(2.0))),
                _mm512_set1_epi32(7),
            );
            let c = _mm512_fmadd_ps(
                _mm512_cvtepi32_ps(i),
                _mm512_set1_ps(0.5),
                _mm512_set1_ps(0.25),
            );
            let z = _mm512_sub_ps(a, c);
            let mut p = _mm512_permutexvar_ps(i, table[6]);
            for k in (0..6).rev() {
                p = _mm512_fmadd_ps(p, z, _mm512_permutexvar_ps(i, table[k]));
            }
            let r = _mm512_min_ps(_mm512_mul_ps(p, a), one);
            let r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_GE_OQ>(a, top), r, one);
            // r >= 0: copysign is an or of x's sign.
            let r = _mm512_or_ps(r, _mm512_and_ps(x, sign));
            _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x), r, x)
        }
    }

    /// `Form::one` on 16 lanes of `out` and `x` at a time; returns how
    /// many elements it did (a multiple of 16).
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl")]
    pub(super) fn run16(out: &mut [f32], x: &[f32], bias: Option<&[f32]>, form: Form) -> usize {
        // SAFETY: loads of `ERF_TABLE`'s rows (8 f32s each) and of 16
        // f32s of `x` and `bias`, stores of 16 of `out`, all inside those
        // slices (`j + 16 <= n`, n their shortest length); the rest is
        // register arithmetic.
        unsafe {
            let table: [__m512; 7] = std::array::from_fn(|k| {
                _mm512_broadcast_f32x8(_mm256_loadu_ps(ERF_TABLE[k].as_ptr()))
            });
            let n = out
                .len()
                .min(x.len())
                .min(bias.map_or(usize::MAX, <[f32]>::len));
            let load = |j: usize| match bias {
                Some(b) => _mm512_add_ps(
                    _mm512_loadu_ps(x.as_ptr().add(j)),
                    _mm512_loadu_ps(b.as_ptr().add(j)),
                ),
                None => _mm512_loadu_ps(x.as_ptr().add(j)),
            };
            let mut j = 0;
            match form {
                Form::Erf => {
                    while j + 16 <= n {
                        let v = load(j);
                        _mm512_storeu_ps(out.as_mut_ptr().add(j), erf16(v, &table));
                        j += 16;
                    }
                }
                Form::Gelu { c, h } => {
                    let (c, h, one) = (_mm512_set1_ps(c), _mm512_set1_ps(h), _mm512_set1_ps(1.0));
                    while j + 16 <= n {
                        let v = load(j);
                        let e = erf16(_mm512_mul_ps(v, c), &table);
                        let g = _mm512_mul_ps(_mm512_add_ps(e, one), _mm512_mul_ps(v, h));
                        _mm512_storeu_ps(out.as_mut_ptr().add(j), g);
                        j += 16;
                    }
                }
            }
            j
        }
    }

    /// `erf_f32` on 8 lanes.
    #[cfg(all(target_feature = "avx2", target_feature = "fma"))]
    #[inline(always)]
    fn erf8(x: __m256, table: &[__m256; 7]) -> __m256 {
        // SAFETY (every intrinsic below): register arithmetic only; the
        // build enables AVX2 and FMA (x86-64-v3).
        unsafe {
            let sign = _mm256_set1_ps(-0.0);
            let top = _mm256_set1_ps(ERF_TOP);
            let one = _mm256_set1_ps(1.0);
            let a = _mm256_min_ps(_mm256_andnot_ps(sign, x), top);
            let i = _mm256_min_epi32(
                _mm256_cvttps_epi32(_mm256_mul_ps(a, _mm256_set1_ps(2.0))),
                _mm256_set1_epi32(7),
            );
            let c = _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(i),
                _mm256_set1_ps(0.5),
                _mm256_set1_ps(0.25),
            );
            let z = _mm256_sub_ps(a, c);
            let mut p = _mm256_permutevar8x32_ps(table[6], i);
            for k in (0..6).rev() {
                p = _mm256_fmadd_ps(p, z, _mm256_permutevar8x32_ps(table[k], i));
            }
            let r = _mm256_min_ps(_mm256_mul_ps(p, a), one);
            let r = _mm256_blendv_ps(r, one, _mm256_cmp_ps::<_CMP_GE_OQ>(a, top));
            let r = _mm256_or_ps(r, _mm256_and_ps(x, sign));
            _mm256_blendv_ps(r, x, _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x))
        }
    }

    /// As `run16`, 8 lanes at a time (0 without AVX2 and FMA in the build).
    pub(super) fn run8(out: &mut [f32], x: &[f32], bias: Option<&[f32]>, form: Form) -> usize {
        #[cfg(all(target_feature = "avx2", target_feature = "fma"))]
        // SAFETY: as in `run16`, with 8 f32s a load or store.
        unsafe {
            let table: [__m256; 7] =
                std::array::from_fn(|k| _mm256_loadu_ps(ERF_TABLE[k].as_ptr()));
            let n = out
                .len()
                .min(x.len())
                .min(bias.map_or(usize::MAX, <[f32]>::len));
            let load = |j: usize| match bias {
                Some(b) => _mm256_add_ps(
                    _mm256_loadu_ps(x.as_ptr().add(j)),
                    _mm256_loadu_ps(b.as_ptr().add(j)),
                ),
                None => _mm256_loadu_ps(x.as_ptr().add(j)),
            };
            let mut j = 0;
            match form {
                Form::Erf => {
                    while j + 8 <= n {
                        let v = load(j);
                        _mm256_storeu_ps(out.as_mut_ptr().add(j), erf8(v, &table));
                        j += 8;
                    }
                }
                Form::Gelu { c, h } => {
                    let (c, h, one) = (_mm256_set1_ps(c), _mm256_set1_ps(h), _mm256_set1_ps(1.0));
                    while j + 8 <= n {
                        let v = load(j);
                        let e = erf8(_mm256_mul_ps(v, c), &table);
                        let g = _mm256_mul_ps(_mm256_add_ps(e, one), _mm256_mul_ps(v, h));
                        _mm256_storeu_ps(out.as_mut_ptr().add(j), g);
                        j += 8;
                    }
                }
            }
            j
        }
        #[cfg(not(all(target_feature = "avx2", target_feature = "fma")))]
        {
            let _ = (out, x, bias, form);
            0
        }
    }
}

/// 1 / (1 + e^-x) with the fast exp.
#[inline(always)]
pub fn logistic_f32(x: f32) -> f32 {
    1.0 / (1.0 + exp_f32(-x))
}

/// `out = x · logistic(x)`, times `scale` when given: SiLU and a gated
/// MLP's product after it (`Inst::Silu`), each op rounded to f32 as on
/// its own, so the bits of the separate passes. Inlined into the loop
/// engine's AVX-512 pass, where the compiler vectorizes it (branch-free).
#[inline(always)]
pub fn silu_run(out: &mut [f32], x: &[f32], scale: Option<&[f32]>) {
    match scale {
        None => {
            for (o, &v) in out.iter_mut().zip(x) {
                *o = v * logistic_f32(v);
            }
        }
        Some(u) => {
            for ((o, &v), &w) in out.iter_mut().zip(x).zip(u) {
                *o = (v * logistic_f32(v)) * w;
            }
        }
    }
}

/// SiLU's backward, `out = (t · s) · (1 + x · (1 - s))` with
/// `s = logistic(x)` (`Inst::SiluGrad`), each op rounded to f32 in that
/// order, as the separate passes do.
#[inline(always)]
pub fn silu_grad_run(out: &mut [f32], x: &[f32], t: &[f32]) {
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(t) {
        let s = logistic_f32(v);
        *o = (g * s) * (1.0 + v * (1.0 - s));
    }
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
    fn erf_is_within_one_and_a_half_ulps_on_a_fine_grid() {
        // Steps of 2^-17 over [0, 4.5]: every interval's edges and middle.
        let mut worst = (0f64, 0f32);
        for k in 0..(4.5 * 131072.0) as u32 {
            let x = k as f32 / 131072.0;
            let e = ulps(erf_f32(x), erf64(x as f64));
            if e > worst.0 {
                worst = (e, x);
            }
            assert_eq!(
                erf_f32(-x).to_bits(),
                (-erf_f32(x)).to_bits(),
                "erf is odd at {x}"
            );
        }
        assert!(worst.0 <= 1.5, "erf: {} ulps at {}", worst.0, worst.1);
        assert_eq!(erf_f32(4.0), 1.0);
        assert_eq!(erf_f32(-1e30), -1.0);
        assert_eq!(erf_f32(-0.0).to_bits(), (-0.0f32).to_bits());
        // Tiny values: 2/sqrt(pi) x, relative accuracy kept.
        assert!(ulps(erf_f32(1e-30), std::f64::consts::FRAC_2_SQRT_PI * 1e-30) <= 1.0);
    }

    /// Values that reach every branch of erf: signs, zeros, NaNs,
    /// infinities, subnormals, interval edges and the values next to them,
    /// and the range beyond 4.
    fn erf_inputs() -> Vec<f32> {
        let mut x = vec![
            0.0,
            -0.0,
            f32::NAN,
            -f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MIN_POSITIVE,
            1e-40,
            f32::MAX,
            -f32::MAX,
        ];
        for k in 0..=10 {
            let edge = k as f32 * 0.5;
            for e in [edge, -edge] {
                x.extend([e.next_down(), e, e.next_up()]);
            }
        }
        let mut s = 0x1234_5678u32;
        for _ in 0..997 {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            x.push((s as f32 / u32::MAX as f32 - 0.5) * 14.0);
        }
        x
    }

    #[test]
    fn erf_and_gelu_runs_give_the_scalar_bits_on_every_path() {
        let x = erf_inputs();
        let forms = [
            Form::Erf,
            Form::Gelu {
                c: std::f32::consts::FRAC_1_SQRT_2,
                h: 0.5,
            },
        ];
        for form in forms {
            for bias in [
                None,
                Some(x.iter().rev().map(|v| v * 0.5).collect::<Vec<f32>>()),
            ] {
                let bias = bias.as_deref();
                let want: Vec<u32> = x
                    .iter()
                    .enumerate()
                    .map(|(j, &v)| form.one(bias.map_or(v, |b| v + b[j])).to_bits())
                    .collect();
                let check = |out: &[f32], upto: usize, path: &str| {
                    for j in 0..upto {
                        assert_eq!(
                            out[j].to_bits(),
                            want[j],
                            "{path}: input {:e} gave {:e}, the scalar form {:e}",
                            x[j],
                            out[j],
                            f32::from_bits(want[j])
                        );
                    }
                };
                let mut out = vec![0f32; x.len()];
                run(&mut out, &x, bias, form);
                check(&out, x.len(), "run");
                #[cfg(target_arch = "x86_64")]
                {
                    let mut out = vec![0f32; x.len()];
                    let done = x86::run8(&mut out, &x, bias, form);
                    assert!(done == 0 || done + 8 > x.len(), "run8 did {done}");
                    check(&out, done, "8 lanes");
                    if crate::platform::host::cpu::avx512() {
                        let mut out = vec![0f32; x.len()];
                        // SAFETY: the CPU has AVX-512 (checked just above).
                        let done = unsafe { x86::run16(&mut out, &x, bias, form) };
                        assert!(done + 16 > x.len(), "run16 did {done}");
                        check(&out, done, "16 lanes");
                    }
                }
            }
        }
        let mut out = vec![0f32; 3];
        gelu_run(
            &mut out,
            &[-1.5, 0.0, 2.0],
            Some(&[0.5, 0.0, 0.0]),
            std::f32::consts::FRAC_1_SQRT_2,
            0.5,
        );
        for (got, x) in out.iter().zip([-1.0f64, 0.0, 2.0]) {
            let want = 0.5 * x * (1.0 + erf64(x / std::f64::consts::SQRT_2));
            assert!((*got as f64 - want).abs() <= 1e-6, "gelu({x}) = {got}");
        }
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
        assert!(worst[1] <= 1.5, "erf: {} ulps", worst[1]);
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
