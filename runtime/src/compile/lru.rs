//! A map bounded by an entry count that drops the least recently used
//! entry first. Lookups and inserts cost O(log n).
//!
//! Uses the map does not see (a memo in front of the cache that found the
//! value itself) are told through a [`UseMark`]: marked entries get a
//! second chance when they come up for eviction, and go to the back of
//! the line instead.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub(super) struct Lru<K, V> {
    capacity: usize,
    entries: HashMap<K, Slot<V>>,
    /// Tick of last use -> key; the first entry is the least recently used.
    order: BTreeMap<u64, K>,
    /// The last tick handed out; marks read it.
    clock: Arc<AtomicU64>,
}

struct Slot<V> {
    value: V,
    /// Its key in `order`.
    tick: u64,
    /// The clock's reading at its last marked use (0: none).
    marked: Arc<AtomicU64>,
}

/// Tells the cache that the value it marks was used, where the cache
/// did not see the use: a hit in a memo in front of it. Two relaxed
/// atomic operations, no lock.
#[derive(Clone)]
pub struct UseMark {
    marked: Arc<AtomicU64>,
    clock: Arc<AtomicU64>,
}

impl UseMark {
    /// A mark for a value the cache does not hold.
    pub(super) fn detached() -> Self {
        UseMark {
            marked: Arc::new(AtomicU64::new(0)),
            clock: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The value was used now.
    pub fn mark(&self) {
        // The reading stays behind the ticks the cache hands out after it,
        // so the entry counts as used after everything ordered before now.
        let now = self.clock.load(Ordering::Relaxed);
        if self.marked.load(Ordering::Relaxed) != now {
            self.marked.store(now, Ordering::Relaxed);
        }
    }
}

impl<K: Clone + Eq + Hash, V: Clone> Lru<K, V> {
    pub fn new(capacity: usize) -> Self {
        Lru {
            capacity,
            entries: HashMap::new(),
            order: BTreeMap::new(),
            clock: Arc::new(AtomicU64::new(0)),
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    fn next_tick(&mut self) -> u64 {
        // Only ever advanced under the owner's `&mut`: marks only read it.
        self.clock.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// The value of `key`, now the most recently used.
    pub fn get(&mut self, key: &K) -> Option<V> {
        let tick = self.next_tick();
        let slot = self.entries.get_mut(key)?;
        let old = std::mem::replace(&mut slot.tick, tick);
        let value = slot.value.clone();
        if let Some(k) = self.order.remove(&old) {
            self.order.insert(tick, k);
        }
        Some(value)
    }

    /// A mark through which uses of `key`'s entry that this map does not
    /// see count as uses; `None` if there is no such entry.
    pub fn use_mark(&self, key: &K) -> Option<UseMark> {
        self.entries.get(key).map(|slot| UseMark {
            marked: Arc::clone(&slot.marked),
            clock: Arc::clone(&self.clock),
        })
    }

    /// Inserts or replaces `key`; returns how many entries were evicted.
    pub fn insert(&mut self, key: K, value: V) -> u64 {
        if self.capacity == 0 {
            return 0;
        }
        let tick = self.next_tick();
        let slot = Slot {
            value,
            tick,
            marked: Arc::new(AtomicU64::new(0)),
        };
        if let Some(old) = self.entries.insert(key.clone(), slot) {
            self.order.remove(&old.tick);
        }
        self.order.insert(tick, key);
        self.shrink()
    }

    /// Changes the entry limit; returns how many entries were evicted.
    pub fn set_capacity(&mut self, capacity: usize) -> u64 {
        self.capacity = capacity;
        self.shrink()
    }

    fn shrink(&mut self) -> u64 {
        let over = self.entries.len().saturating_sub(self.capacity);
        self.evict_oldest(over)
    }

    /// Drops the `n` least recently used entries (fewer if there are
    /// fewer); returns how many it dropped. An entry marked since it was
    /// last ordered is put at the back instead, once.
    pub fn evict_oldest(&mut self, n: usize) -> u64 {
        let mut evicted = 0;
        // Each entry is passed over at most once per reordering, and a
        // reordering is a fresh tick that only a mark made during this loop
        // can pass; the bound keeps even that finite.
        let mut chances = self.entries.len();
        while evicted < n as u64 {
            let Some((tick, k)) = self.order.pop_first() else {
                break;
            };
            let slot = self.entries.get_mut(&k).expect("ordered keys are held");
            if chances > 0 && slot.marked.load(Ordering::Relaxed) >= tick {
                chances -= 1;
                let fresh = self.clock.fetch_add(1, Ordering::Relaxed) + 1;
                slot.tick = fresh;
                self.order.insert(fresh, k);
                continue;
            }
            self.entries.remove(&k);
            evicted += 1;
        }
        evicted
    }

    pub fn clear(&mut self) {
        self.entries.clear();
        self.order.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(lru: &Lru<u32, u32>) -> Vec<u32> {
        lru.order.values().copied().collect()
    }

    #[test]
    fn the_least_recently_used_goes_first() {
        let mut lru = Lru::new(3);
        for k in 0..3 {
            lru.insert(k, k);
        }
        assert_eq!(lru.get(&0), Some(0));
        assert_eq!(lru.insert(3, 3), 1);
        assert_eq!(keys(&lru), [2, 0, 3]);
    }

    /// An entry found through a memo in front of the map (a mark, not a
    /// `get`) is not the first to go: before marks, the hot eager op that
    /// never came back to the cache was.
    #[test]
    fn a_marked_entry_gets_a_second_chance() {
        let mut lru = Lru::new(3);
        for k in 0..3 {
            lru.insert(k, k);
        }
        let mark = lru.use_mark(&0).unwrap();
        mark.mark();
        assert_eq!(lru.insert(3, 3), 1);
        assert_eq!(keys(&lru), [2, 3, 0]);
        // Not marked again: its second chance is spent.
        assert_eq!(lru.insert(4, 4), 1);
        assert_eq!(lru.insert(5, 5), 1);
        assert_eq!(keys(&lru), [0, 4, 5]);
        assert_eq!(lru.insert(6, 6), 1);
        assert_eq!(keys(&lru), [4, 5, 6]);
    }

    /// Half of what is held goes, marked entries last.
    #[test]
    fn evicting_half_keeps_the_marked() {
        let mut lru = Lru::new(8);
        let marks: Vec<UseMark> = (0..8)
            .map(|k| {
                lru.insert(k, k);
                lru.use_mark(&k).unwrap()
            })
            .collect();
        for k in [0, 2, 4, 6] {
            marks[k as usize].mark();
        }
        assert_eq!(lru.evict_oldest(4), 4);
        assert_eq!(keys(&lru), [0, 2, 4, 6]);
        // Every entry marked: still exactly as many go.
        for m in &marks {
            m.mark();
        }
        assert_eq!(lru.evict_oldest(2), 2);
        assert_eq!(lru.len(), 2);
    }
}
