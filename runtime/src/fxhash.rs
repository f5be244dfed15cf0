//! A multiply-rotate hasher (the rustc compiler's "Fx" scheme) for the
//! runtime's own small keys: value ids, op signatures. Several times
//! cheaper than std's SipHash on a few bytes, which an eager op's launch
//! and a tiny kernel's run pay for every map they build. Not for keys an
//! outsider chooses (no defence against aimed collisions); every user
//! compares keys on a hit, so a collision costs a comparison, never a
//! wrong entry.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

#[derive(Default, Clone, Copy)]
pub struct FxHasher(u64);

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.write_u64(u64::from_le_bytes(c.try_into().unwrap_or_default()));
        }
        for &b in chunks.remainder() {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_u32(&mut self, v: u32) {
        self.write_u64(u64::from(v));
    }
    fn write_u8(&mut self, v: u8) {
        self.write_u64(u64::from(v));
    }
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

pub type FxBuild = BuildHasherDefault<FxHasher>;
pub type FxHashMap<K, V> = HashMap<K, V, FxBuild>;
pub type FxHashSet<K> = HashSet<K, FxBuild>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::{BuildHasher, Hash};

    fn hash_of(v: impl Hash) -> u64 {
        FxBuild::default().hash_one(v)
    }

    /// Neighbouring small keys (value ids) spread over the high bits that
    /// hashbrown's control bytes take, and maps over them behave as maps.
    #[test]
    fn small_keys_spread_and_maps_work() {
        let tops: FxHashSet<u64> = (0u32..256).map(|v| hash_of(v) >> 57).collect();
        assert!(
            tops.len() > 64,
            "only {} distinct top-7-bit values",
            tops.len()
        );
        let mut m: FxHashMap<u32, u32> = FxHashMap::default();
        for v in 0..1000 {
            m.insert(v, v * 2);
        }
        assert!((0..1000).all(|v| m[&v] == v * 2));
        assert_ne!(hash_of([1u64, 2]), hash_of([2u64, 1]));
        assert_ne!(hash_of(&b"abc"[..]), hash_of(&b"abd"[..]));
    }
}
