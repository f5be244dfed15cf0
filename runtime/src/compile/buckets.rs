//! Shape buckets: a dynamic dimension (a sequence length, a batch size) is
//! rounded up to one of a few sizes so that a run of different lengths
//! compiles a few executables instead of one per length. Padding the data
//! to the bucket and masking the padding is the op library's job.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// How a dimension of size `n` is rounded up. Every policy maps 0 to 0 (an
/// empty dimension needs no padding) and never maps `n` below `n`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum BucketPolicy {
    /// No bucketing: every size is its own bucket.
    Exact,
    /// Powers of two from `min` (itself a power of two): 1..=min -> min,
    /// then the next power of two at or above `n`.
    PowersOfTwo { min: u64 },
    /// Ascending, distinct, non-zero sizes: `n` goes to the first size at
    /// or above it; beyond the last, to the next multiple of the last.
    Sizes(Vec<u64>),
}

impl Default for BucketPolicy {
    /// Powers of two from 8: 1..=8 -> 8, 9..=16 -> 16, 17..=32 -> 32, ...
    fn default() -> Self {
        BucketPolicy::PowersOfTwo { min: 8 }
    }
}

impl BucketPolicy {
    /// Powers of two from `min` rounded up to a power of two (0 counts as 1).
    pub fn powers_of_two(min: u64) -> Self {
        let min = min.max(1).checked_next_power_of_two().unwrap_or(1 << 63);
        BucketPolicy::PowersOfTwo { min }
    }

    /// A user list of bucket sizes, in any order; duplicates are merged.
    /// Empty lists and a size of 0 are errors.
    pub fn sizes(mut sizes: Vec<u64>) -> Result<Self> {
        if sizes.is_empty() {
            return Err(Error::invalid("a bucket list needs at least one size"));
        }
        if sizes.contains(&0) {
            return Err(Error::invalid("a bucket size must be at least 1"));
        }
        sizes.sort_unstable();
        sizes.dedup();
        Ok(BucketPolicy::Sizes(sizes))
    }

    /// The policy a `TPURT_SHAPE_BUCKETS` value names: `pow2` (powers of
    /// two from 8), `pow2:MIN` (from MIN, rounded up to a power of two),
    /// `exact` or `off` (no bucketing), or a comma-separated list of sizes
    /// (`32,128,512`). Anything else is an error naming the variable.
    pub fn parse(value: &str) -> Result<Self> {
        let bad = |why: &str| {
            Error::invalid(format!(
                "TPURT_SHAPE_BUCKETS={value:?}: {why}; expected 'pow2', 'pow2:MIN', 'exact', 'off' or a list of sizes such as '32,128,512'"
            ))
        };
        let v = value.trim();
        match v {
            "pow2" => return Ok(Self::default()),
            "exact" | "off" => return Ok(BucketPolicy::Exact),
            _ => {}
        }
        if let Some(min) = v.strip_prefix("pow2:") {
            let min: u64 = min
                .trim()
                .parse()
                .map_err(|_| bad("the minimum is not a whole number"))?;
            if min == 0 {
                return Err(bad("the minimum must be at least 1"));
            }
            return Ok(Self::powers_of_two(min));
        }
        let sizes = v
            .split(',')
            .map(|s| s.trim().parse::<u64>())
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|_| bad("a size is not a whole number"))?;
        Self::sizes(sizes).map_err(|e| bad(&e.to_string()))
    }

    /// The bucket of a dimension of size `n`: the size to pad `n` up to.
    /// Where rounding up would overflow u64, `n` is its own bucket.
    pub fn bucket(&self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        match self {
            BucketPolicy::Exact => n,
            BucketPolicy::PowersOfTwo { min } => {
                n.max(*min).checked_next_power_of_two().unwrap_or(n)
            }
            BucketPolicy::Sizes(sizes) => {
                // A hand-built list may be unsorted; `sizes` sorts, this
                // stays correct either way.
                let fitting = sizes.iter().copied().filter(|&s| s >= n).min();
                match (fitting, sizes.iter().copied().max()) {
                    (Some(s), _) => s,
                    (None, Some(last)) if last > 0 => {
                        n.div_ceil(last).checked_mul(last).unwrap_or(n)
                    }
                    _ => n,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn default_policy_maps_sequence_lengths_to_few_buckets() {
        let policy = BucketPolicy::default();
        let buckets: BTreeSet<u64> = (1..=2048).map(|n| policy.bucket(n)).collect();
        assert!(
            buckets.len() <= 12,
            "{} buckets: {buckets:?}",
            buckets.len()
        );
        assert_eq!(
            buckets.into_iter().collect::<Vec<_>>(),
            vec![8, 16, 32, 64, 128, 256, 512, 1024, 2048]
        );
        assert_eq!(policy.bucket(1), 8);
        assert_eq!(policy.bucket(8), 8);
        assert_eq!(policy.bucket(9), 16);
        assert_eq!(policy.bucket(16), 16);
        assert_eq!(policy.bucket(17), 32);
        assert_eq!(policy.bucket(0), 0);
        assert_eq!(policy.bucket(u64::MAX), u64::MAX);
        for n in 1..=5000 {
            assert!(policy.bucket(n) >= n);
        }
    }

    #[test]
    fn powers_of_two_minimum_is_rounded() {
        assert_eq!(
            BucketPolicy::powers_of_two(5),
            BucketPolicy::PowersOfTwo { min: 8 }
        );
        assert_eq!(BucketPolicy::powers_of_two(0).bucket(3), 4);
        assert_eq!(BucketPolicy::powers_of_two(1).bucket(1), 1);
    }

    #[test]
    fn user_list_is_sorted_and_rounds_beyond_the_last() {
        let policy = BucketPolicy::sizes(vec![512, 128, 32, 128]).unwrap();
        assert_eq!(policy, BucketPolicy::Sizes(vec![32, 128, 512]));
        assert_eq!(policy.bucket(1), 32);
        assert_eq!(policy.bucket(32), 32);
        assert_eq!(policy.bucket(33), 128);
        assert_eq!(policy.bucket(500), 512);
        assert_eq!(policy.bucket(512), 512);
        assert_eq!(policy.bucket(513), 1024);
        assert_eq!(policy.bucket(1024), 1024);
        assert_eq!(policy.bucket(1500), 1536);
        assert_eq!(policy.bucket(0), 0);
        assert_eq!(policy.bucket(u64::MAX), u64::MAX);
        let buckets: BTreeSet<u64> = (1..=2048).map(|n| policy.bucket(n)).collect();
        assert_eq!(
            buckets.into_iter().collect::<Vec<_>>(),
            vec![32, 128, 512, 1024, 1536, 2048]
        );
    }

    #[test]
    fn policies_parse_from_the_environment_value() {
        assert_eq!(
            BucketPolicy::parse("pow2").unwrap(),
            BucketPolicy::default()
        );
        assert_eq!(
            BucketPolicy::parse(" pow2:100 ").unwrap(),
            BucketPolicy::PowersOfTwo { min: 128 }
        );
        assert_eq!(BucketPolicy::parse("off").unwrap(), BucketPolicy::Exact);
        assert_eq!(BucketPolicy::parse("exact").unwrap(), BucketPolicy::Exact);
        assert_eq!(
            BucketPolicy::parse("512, 32,128").unwrap(),
            BucketPolicy::Sizes(vec![32, 128, 512])
        );
        for bad in ["", "pow3", "pow2:0", "pow2:x", "8,,16", "8,0", "-8"] {
            let e = BucketPolicy::parse(bad).unwrap_err().to_string();
            assert!(e.contains("TPURT_SHAPE_BUCKETS"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn user_list_errors_and_exact() {
        assert!(BucketPolicy::sizes(vec![]).is_err());
        assert!(BucketPolicy::sizes(vec![8, 0]).is_err());
        assert_eq!(BucketPolicy::Exact.bucket(37), 37);
    }
}
