//! What the host CPU offers beyond the build's baseline.
//!
//! x86-64 builds assume x86-64-v3 (AVX2 and FMA, `.cargo/config.toml`).
//! Most server CPUs since 2017 also have AVX-512: twice the lanes per
//! instruction. The host kernels that are bound by arithmetic (the loop
//! engine's passes, attention's softmax) are compiled a second time with
//! AVX-512 enabled and pick that copy at run time when the CPU has it.
//! Both copies run the same Rust code, element for element in the same
//! order, so results do not depend on which one ran.
//!
//! `TPURT_HOST_AVX512=0` keeps the baseline copy (for comparing the two;
//! another value, or unset, uses AVX-512 where the CPU has it).

/// Whether the AVX-512 copies may run: the CPU has AVX-512 F, BW, DQ and
/// VL (checked once) and `TPURT_HOST_AVX512` is not `0`.
#[cfg(target_arch = "x86_64")]
pub fn avx512() -> bool {
    static AVX512: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVX512.get_or_init(|| {
        let off = std::env::var("TPURT_HOST_AVX512").is_ok_and(|v| v.trim() == "0");
        !off && std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512dq")
            && std::arch::is_x86_feature_detected!("avx512vl")
    })
}

/// Runs `$body` (an expression) from a function compiled for AVX-512 when
/// [`avx512`] says so, else as it is. Everything `$body` calls that is
/// `#[inline(always)]` is compiled into that function, so its loops
/// vectorize 16 f32 lanes wide. `$body` must not return early. The
/// closure holding `$body` is inlined into that function at the
/// compiler's discretion: a large body (the loop engine's) may stay a
/// closure of its own, compiled without AVX-512, so such code gets a
/// `#[target_feature]` function of its own instead (`Pass::range_in_wide`).
macro_rules! dispatch {
    ($body:expr) => {{
        #[cfg(target_arch = "x86_64")]
        {
            #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl")]
            #[inline]
            fn wide<R>(f: impl FnOnce() -> R) -> R {
                f()
            }
            if $crate::platform::host::cpu::avx512() {
                // SAFETY: the CPU has the features `wide` is compiled for
                // (checked at run time by `avx512`).
                unsafe { wide(|| $body) }
            } else {
                $body
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            $body
        }
    }};
}
pub(crate) use dispatch;

#[cfg(test)]
mod tests {
    #[test]
    fn both_copies_give_the_same_bits() {
        // A loop the compiler vectorizes: the AVX-512 copy (where the CPU
        // has it) and the baseline give the same results, bit for bit.
        let x: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.37).sin() * 20.0).collect();
        let run = |x: &[f32]| -> Vec<f32> {
            x.iter()
                .map(|&v| crate::platform::host::vmath::exp_f32(v))
                .collect()
        };
        let wide = dispatch!(run(&x));
        let plain = run(&x);
        assert_eq!(
            wide.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            plain.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
    }
}
