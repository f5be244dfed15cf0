//! Random numbers from a counter-based generator, Philox 4x32-10 (Salmon,
//! Moraes, Dror and Shaw, "Parallel random numbers: as easy as 1, 2, 3",
//! SC 2011): element i is a pure function of (seed, offset + i), so the
//! same (seed, offset) give the same numbers on every platform, in every
//! mode, and any slice of a draw can be drawn alone.
//!
//! The definition, which every platform's lowering of `Rng` reproduces bit
//! for bit (up to the last rounding of `ln` and `cos` for normals):
//!
//! - Key: k0 = the low 32 bits of seed, k1 = its high 32 bits (the i64's
//!   two's-complement bits read as a u64).
//! - Counter of element i (row-major index): the 128-bit integer
//!   offset + i (offset's bits read as a u64; no wrap-around), split into
//!   32-bit words c0 (lowest) .. c3.
//! - Philox 4x32-10: ten rounds of
//!   (c0, c1, c2, c3) <- (hi(M1·c2) ^ c1 ^ k0, lo(M1·c2), hi(M0·c0) ^ c3 ^ k1, lo(M0·c0))
//!   where hi and lo are the halves of the 64-bit product, M0 = 0xD2511F53,
//!   M1 = 0xCD9E8D57, and after each round (k0, k1) += (0x9E3779B9,
//!   0xBB67AE85) mod 2^32. The final (c0, c1, c2, c3) are the words w0..w3.
//! - Uniform f32 takes one word per element, so one Philox call serves
//!   four elements. Position c = offset + i (the 128-bit sum above) lies
//!   in group g = floor(c / 64) at r = c mod 64, and reads word
//!   j = floor(r / 16) of the Philox of block b = 16 g + (r mod 16), whose
//!   counter is (lo32(b), hi32(b), 0, 1) (b < 2^63). The 1 in the top
//!   word keeps these blocks apart from the per-element counters below
//!   (top word 0): without it an f32 uniform draw and a normal draw at
//!   other offsets read the same Philox outputs (the uniforms of counters
//!   [n, 2n) read blocks [n/4, n/2), which a normal draw at [0, n) had
//!   used), so a dropout mask drawn after an initialization could echo
//!   it. So a group's 64
//!   elements are the four words of its 16 blocks, word by word: sixteen
//!   blocks run in vector lanes and each word lands as one run, with no
//!   shuffling. The value is (wj >> 8) · 2^-24, in [0, 1). (One call per
//!   element, this definition's first form, made uniforms the costliest
//!   part of a fused dropout; four elements per call with a block's words
//!   side by side cost as much again in shuffles.)
//! - Uniform f64: ((w0 << 21) | (w1 >> 11)) · 2^-53 as a 53-bit integer
//!   (w0 supplies the high 32 bits) of element i's own counter c, in [0, 1).
//! - Uniform f16 and bf16: the f32 uniform rounded to nearest-even, then
//!   lowered to the largest value below 1 if it rounded up to 1.
//! - Normal, every dtype: computed in f64 and rounded once to the dtype,
//!   u1 = (((w0 << 21) | (w1 >> 11)) + 1) · 2^-53, in (0, 1],
//!   u2 = ((w2 << 21) | (w3 >> 11)) · 2^-53, in [0, 1),
//!   z = sqrt(-2 ln u1) · cos(2π u2) (Box-Muller, the cosine half only).

use half::{bf16, f16};

use super::elementwise::{typed, typed_mut, Cast};
use super::HostTensor;
use crate::error::{Error, Result};
use crate::ir::{DType, RngDistribution, TensorType};

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

/// Philox 4x32 with 10 rounds.
#[inline(always)]
fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let [mut c0, mut c1, mut c2, mut c3] = counter;
    let [mut k0, mut k1] = key;
    for round in 0..10 {
        if round > 0 {
            k0 = k0.wrapping_add(W0);
            k1 = k1.wrapping_add(W1);
        }
        let p0 = M0 as u64 * c0 as u64;
        let p1 = M1 as u64 * c2 as u64;
        (c0, c1, c2, c3) = (
            (p1 >> 32) as u32 ^ c1 ^ k0,
            p1 as u32,
            (p0 >> 32) as u32 ^ c3 ^ k1,
            p0 as u32,
        );
    }
    [c0, c1, c2, c3]
}

/// The four words of element `i`.
#[inline(always)]
fn words(key: [u32; 2], offset: u64, i: usize) -> [u32; 4] {
    // offset + i as a 128-bit sum: both are below 2^64, so c2 is the carry.
    let c = offset.wrapping_add(i as u64);
    let carry = (c < offset) as u32;
    philox4x32_10([c as u32, (c >> 32) as u32, carry, 0], key)
}

/// The f32 uniform of one Philox word.
#[inline(always)]
fn uniform_f32(w: u32) -> f32 {
    (w >> 8) as f32 * (1.0 / (1u32 << 24) as f32)
}

/// Elements per group: the four words of sixteen blocks.
const GROUP: usize = 64;
const LANES: usize = 16;

/// The uniforms of group `g`, word by word: `out[16 j + k]` is word j of
/// block 16 g + k. The sixteen blocks share their high counter word (16 g
/// is a multiple of 16), so the lanes differ in the low word alone.
#[inline(always)]
fn group(key: [u32; 2], g: u64, out: &mut [f32]) {
    let b = g << 4;
    let (lo, hi) = (b as u32, (b >> 32) as u32);
    let mut words = [[0f32; LANES]; 4];
    for k in 0..LANES {
        let w = philox4x32_10([lo | k as u32, hi, 0, 1], key);
        for (run, &w) in words.iter_mut().zip(&w) {
            run[k] = uniform_f32(w);
        }
    }
    for (run, w) in out.chunks_exact_mut(LANES).zip(&words) {
        run.copy_from_slice(w);
    }
}

/// Uniform [0, 1) f32 draws for elements `first..first + out.len()` of a
/// draw with `seed` and `offset`: the loop engine's entry point and the
/// `rng` kernel's, so both give the same numbers. Inlined, so it runs in
/// the caller's AVX-512 copy (`cpu::dispatch`).
#[inline(always)]
pub fn uniform_f32_run(seed: u64, offset: u64, first: u64, out: &mut [f32]) {
    let key = [seed as u32, (seed >> 32) as u32];
    let c = offset as u128 + first as u128;
    let mut g = (c >> 6) as u64;
    let mut r = (c % GROUP as u128) as usize;
    let mut out = out;
    while !out.is_empty() {
        if r == 0 && out.len() >= GROUP {
            let (whole, rest) = out.split_at_mut(GROUP);
            group(key, g, whole);
            out = rest;
        } else {
            // A group begun before `first` or ending after the last element.
            let mut all = [0f32; GROUP];
            group(key, g, &mut all);
            let k = (GROUP - r).min(out.len());
            out[..k].copy_from_slice(&all[r..r + k]);
            out = std::mem::take(&mut out)[k..].as_mut();
            r = 0;
        }
        g += 1;
    }
}

/// 53 bits: `hi` gives the top 32, the top 21 bits of `lo` the rest.
#[inline(always)]
fn bits53(hi: u32, lo: u32) -> u64 {
    ((hi as u64) << 21) | ((lo as u64) >> 11)
}

const TWO_POW_MINUS_53: f64 = 1.0 / (1u64 << 53) as f64;

#[inline(always)]
fn uniform_f64(w: [u32; 4]) -> f64 {
    bits53(w[0], w[1]) as f64 * TWO_POW_MINUS_53
}

#[inline(always)]
fn normal_f64(w: [u32; 4]) -> f64 {
    let u1 = (bits53(w[0], w[1]) + 1) as f64 * TWO_POW_MINUS_53;
    let u2 = bits53(w[2], w[3]) as f64 * TWO_POW_MINUS_53;
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// `u`, or the largest value below one if `u` rounded up to one.
#[inline(always)]
fn below_one<H: bytemuck::Pod + PartialOrd>(u: H, one: H) -> H {
    if u < one {
        u
    } else {
        let bits: u16 = bytemuck::cast(one);
        bytemuck::cast(bits - 1)
    }
}

fn scalar_u64(t: &HostTensor, name: &str) -> Result<u64> {
    if t.ty != TensorType::scalar(DType::I64) {
        return Err(Error::invalid(format!(
            "{name} must be an i64 scalar, got {}",
            t.ty
        )));
    }
    Ok(typed::<i64>(t)?[0] as u64)
}

pub fn rng(
    distribution: RngDistribution,
    seed: &HostTensor,
    offset: &HostTensor,
    out: &TensorType,
) -> Result<HostTensor> {
    let seed = scalar_u64(seed, "seed")?;
    let offset = scalar_u64(offset, "offset")?;
    let key = [seed as u32, (seed >> 32) as u32];
    let mut r = HostTensor::zeros(out.clone());
    match (distribution, out.dtype) {
        (RngDistribution::Uniform, DType::F32) => {
            let out = typed_mut::<f32>(&mut r)?;
            crate::platform::host::cpu::dispatch!(uniform_f32_run(seed, offset, 0, out))
        }
        (RngDistribution::Uniform, DType::F64) => {
            fill(typed_mut::<f64>(&mut r)?, key, offset, uniform_f64)
        }
        (RngDistribution::Uniform, DType::F16) => {
            halves(typed_mut::<f16>(&mut r)?, seed, offset, |u| {
                below_one(f16::from_f32(u), f16::ONE)
            })
        }
        (RngDistribution::Uniform, DType::BF16) => {
            halves(typed_mut::<bf16>(&mut r)?, seed, offset, |u| {
                below_one(bf16::from_f32(u), bf16::ONE)
            })
        }
        (RngDistribution::Normal, DType::F32) => {
            fill(typed_mut::<f32>(&mut r)?, key, offset, |w| {
                normal_f64(w) as f32
            })
        }
        (RngDistribution::Normal, DType::F64) => {
            fill(typed_mut::<f64>(&mut r)?, key, offset, normal_f64)
        }
        (RngDistribution::Normal, DType::F16) => {
            fill(typed_mut::<f16>(&mut r)?, key, offset, |w| {
                <f16 as Cast>::from_f64(normal_f64(w))
            })
        }
        (RngDistribution::Normal, DType::BF16) => {
            fill(typed_mut::<bf16>(&mut r)?, key, offset, |w| {
                <bf16 as Cast>::from_f64(normal_f64(w))
            })
        }
        (_, d) => {
            return Err(Error::invalid(format!(
                "draws floating-point numbers, not {d}"
            )))
        }
    }
    Ok(r)
}

/// Half-precision uniforms: the f32 uniforms, a piece at a time, rounded.
fn halves<T>(out: &mut [T], seed: u64, offset: u64, round: impl Fn(f32) -> T) {
    let mut buf = [0f32; 1024];
    for (p, piece) in out.chunks_mut(buf.len()).enumerate() {
        let u = &mut buf[..piece.len()];
        crate::platform::host::cpu::dispatch!(uniform_f32_run(seed, offset, (p * 1024) as u64, u));
        for (o, &v) in piece.iter_mut().zip(u.iter()) {
            *o = round(v);
        }
    }
}

fn fill<T>(out: &mut [T], key: [u32; 2], offset: u64, f: impl Fn([u32; 4]) -> T) {
    for (i, o) in out.iter_mut().enumerate() {
        *o = f(words(key, offset, i));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scalar(v: i64) -> HostTensor {
        HostTensor::from_slice(DType::I64, &[], &[v]).unwrap()
    }

    fn draw(distribution: RngDistribution, d: DType, n: u64, seed: i64, offset: i64) -> Vec<f64> {
        rng(
            distribution,
            &scalar(seed),
            &scalar(offset),
            &TensorType::new(d, &[n]),
        )
        .unwrap()
        .to_f64_vec()
    }

    const FLOATS: [DType; 4] = [DType::F16, DType::BF16, DType::F32, DType::F64];
    const BOTH: [RngDistribution; 2] = [RngDistribution::Uniform, RngDistribution::Normal];

    #[test]
    fn philox_matches_the_random123_known_answers() {
        assert_eq!(
            philox4x32_10([0; 4], [0; 2]),
            [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]
        );
        assert_eq!(
            philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]
        );
        assert_eq!(
            philox4x32_10(
                [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344],
                [0xa4093822, 0x299f31d0]
            ),
            [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]
        );
    }

    /// Values from an independent implementation of the definition in the
    /// module comment (a short Python script), so the comment and the code
    /// agree; a change here changes every user's random numbers.
    /// An f32 uniform draw reads Philox outputs that no per-element draw
    /// (normal, f64 uniform) reads: the uniforms of counters [n, 2n), laid
    /// four to a block over blocks [n/4, n/2), match none of the words of
    /// blocks [0, n), which a normal draw at offset 0 used (every one of
    /// them matched before the top-word tag).
    #[test]
    fn f32_uniforms_share_no_philox_words_with_per_element_draws() {
        let (seed, n) = (42i64, 1024usize);
        let key = [seed as u32, (seed >> 32) as u32];
        let used: std::collections::HashSet<u32> = (0..n)
            .flat_map(|b| words(key, 0, b))
            .map(|w| uniform_f32(w).to_bits())
            .collect();
        let u = draw(
            RngDistribution::Uniform,
            DType::F32,
            n as u64,
            seed,
            n as i64,
        );
        let shared = u
            .iter()
            .filter(|&&x| used.contains(&(x as f32).to_bits()))
            .count();
        // 1024 values against 4096 of 2^24: a chance match or two at most.
        assert!(shared < 8, "{shared} of {n} shared");
    }

    #[test]
    fn draws_follow_the_documented_definition() {
        let u32s = draw(RngDistribution::Uniform, DType::F32, 3, 42, 7);
        assert_eq!(
            u32s,
            [0.8506280779838562, 0.8510293960571289, 0.43557101488113403]
        );
        let u64s = draw(RngDistribution::Uniform, DType::F64, 3, 42, 7);
        assert_eq!(
            u64s,
            [0.3583605106473168, 0.5480090743243605, 0.26634456971573595]
        );
        let n64 = draw(RngDistribution::Normal, DType::F64, 3, 42, 7);
        let want = [1.2079763596247322, 0.9107377447826178, -0.31922567631441223];
        for (g, w) in n64.iter().zip(want) {
            assert!((g - w).abs() <= 4.0 * f64::EPSILON * w.abs(), "{g} vs {w}");
        }
        assert_eq!(
            words([u32::MAX, u32::MAX], u64::MAX - 1, 0),
            [0xc3a19c70, 0x1cc25234, 0x5540df20, 0x99da46ae]
        );
        // Past u64::MAX the counter carries into c2 rather than wrapping.
        assert_eq!(
            words([u32::MAX, u32::MAX], u64::MAX - 1, 2),
            [0xa74236ed, 0x7e853102, 0x4c324aa2, 0x4212cad6]
        );
        // f32 uniforms: element c reads word (c mod 64) / 16 of block
        // 16 (c / 64) + c mod 16; positions 16, 17 and 48, 49 read words 1
        // and 3 of blocks 0 and 1.
        let u = draw(RngDistribution::Uniform, DType::F32, 2, 42, 16);
        assert_eq!(u, [0.5938701629638672, 0.35381215810775757]);
        let u = draw(RngDistribution::Uniform, DType::F32, 64, 42, 0);
        assert_eq!(u[48..50], [0.7850700616836548, 0.5736904144287109]);
        let u = draw(RngDistribution::Uniform, DType::F32, 3, -1, -2);
        assert_eq!(
            u,
            [0.7177761197090149, 0.6827231645584106, 0.6693233251571655]
        );
        // Positions 2^64 - 3 .. 2^64 + 4: the carry makes the group 2^58.
        let u = draw(RngDistribution::Uniform, DType::F32, 8, 5, -3);
        assert_eq!(
            u,
            [
                0.5474029779434204,
                0.05205869674682617,
                0.3025364279747009,
                0.052629292011260986,
                0.7157074809074402,
                0.597711443901062,
                0.7703291177749634,
                0.07315653562545776
            ]
        );
    }

    #[test]
    fn same_inputs_same_numbers_and_offsets_shift_the_stream() {
        for d in FLOATS {
            for dist in BOTH {
                let a = draw(dist, d, 64, 1234, 100);
                assert_eq!(
                    a,
                    draw(dist, d, 64, 1234, 100),
                    "{d} {dist:?}: deterministic"
                );
                let shifted = draw(dist, d, 54, 1234, 110);
                assert_eq!(
                    &a[10..],
                    &shifted[..],
                    "{d} {dist:?}: offset + i is the counter"
                );
                let other_seed = draw(dist, d, 64, 1235, 100);
                let other_offset = draw(dist, d, 64, 1234, 164);
                let same = |b: &[f64]| a.iter().zip(b).filter(|(x, y)| x == y).count();
                // f16/bf16 have few values, so a few collisions are expected.
                assert!(
                    same(&other_seed) < 16 && same(&other_offset) < 16,
                    "{d} {dist:?}: streams differ"
                );
            }
        }
        // The shape does not matter, only the row-major index.
        let flat = draw(RngDistribution::Normal, DType::F32, 12, 5, 0);
        let t = rng(
            RngDistribution::Normal,
            &scalar(5),
            &scalar(0),
            &TensorType::new(DType::F32, &[3, 4]),
        )
        .unwrap();
        assert_eq!(t.to_f64_vec(), flat);
    }

    #[test]
    fn any_piece_of_an_f32_draw_is_drawn_alone() {
        // The loop engine draws a chunk at a time from any position: a
        // group begun before the piece, whole groups, a group cut short.
        for offset in [0u64, 5, 64, u64::MAX - 70] {
            let mut all = vec![0f32; 300];
            uniform_f32_run(77, offset, 0, &mut all);
            for first in [0usize, 1, 15, 16, 63, 64, 100] {
                for len in [0usize, 1, 5, 64, 130] {
                    let mut piece = vec![0f32; len];
                    uniform_f32_run(77, offset, first as u64, &mut piece);
                    assert_eq!(
                        piece,
                        all[first..first + len],
                        "offset {offset} first {first} len {len}"
                    );
                }
            }
        }
    }

    #[test]
    fn uniforms_stay_below_one_in_every_dtype() {
        // The largest f32 uniform rounds to 1 in f16 and bf16; it is lowered.
        let top = u32::MAX;
        assert_eq!(uniform_f32(top) as f64, 1.0 - 2f64.powi(-24));
        assert_eq!(
            below_one(f16::from_f32(uniform_f32(top)), f16::ONE).to_f64(),
            1.0 - 2f64.powi(-11)
        );
        assert_eq!(
            below_one(bf16::from_f32(uniform_f32(top)), bf16::ONE).to_f64(),
            1.0 - 2f64.powi(-8)
        );
        assert_eq!(uniform_f64([u32::MAX; 4]), 1.0 - 2f64.powi(-53));
        assert_eq!(uniform_f64([0; 4]), 0.0);
        // u1 is never 0, so the normal is finite for the extreme words.
        assert!(normal_f64([0; 4]).is_finite() && normal_f64([u32::MAX; 4]).is_finite());
        for d in FLOATS {
            let u = draw(RngDistribution::Uniform, d, 20_000, 9, 0);
            assert!(u.iter().all(|&v| (0.0..1.0).contains(&v)), "{d}");
        }
    }

    fn mean_var(v: &[f64]) -> (f64, f64) {
        let n = v.len() as f64;
        let mean = v.iter().sum::<f64>() / n;
        (
            mean,
            v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n,
        )
    }

    #[test]
    fn moments_of_100k_draws() {
        // Tolerances are about 5 standard errors.
        for d in [DType::F32, DType::F64, DType::BF16] {
            let (m, v) = mean_var(&draw(RngDistribution::Uniform, d, 100_000, 77, 3));
            assert!(
                (m - 0.5).abs() < 0.005 && (v - 1.0 / 12.0).abs() < 0.002,
                "{d} uniform: {m} {v}"
            );
            let z = draw(RngDistribution::Normal, d, 100_000, 77, 3);
            let (m, v) = mean_var(&z);
            assert!(
                m.abs() < 0.016 && (v - 1.0).abs() < 0.03,
                "{d} normal: {m} {v}"
            );
            let tail = z.iter().filter(|x| x.abs() > 1.96).count() as f64 / z.len() as f64;
            assert!((tail - 0.05).abs() < 0.004, "{d} normal tail: {tail}");
        }
    }

    #[test]
    fn bad_operands_are_errors() {
        let f = HostTensor::from_f64(DType::F32, &[], &[1.0]).unwrap();
        let out = TensorType::new(DType::F32, &[4]);
        assert!(rng(RngDistribution::Uniform, &f, &scalar(0), &out).is_err());
        assert!(rng(RngDistribution::Uniform, &scalar(0), &f, &out).is_err());
        assert!(rng(
            RngDistribution::Normal,
            &scalar(0),
            &scalar(0),
            &TensorType::new(DType::I32, &[4])
        )
        .is_err());
        for dims in [&[][..], &[0], &[2, 0]] {
            let t = rng(
                RngDistribution::Normal,
                &scalar(0),
                &scalar(0),
                &TensorType::new(DType::F16, dims),
            )
            .unwrap();
            assert_eq!(t.ty, TensorType::new(DType::F16, dims));
        }
    }
}
