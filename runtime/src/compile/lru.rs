//! A map bounded by an entry count that drops the least recently used
//! entry first. Lookups and inserts cost O(log n).

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

pub(super) struct Lru<K, V> {
    capacity: usize,
    /// Value and the tick of its last use.
    entries: HashMap<K, (V, u64)>,
    /// Tick of last use -> key; the first entry is the least recently used.
    order: BTreeMap<u64, K>,
    tick: u64,
}

impl<K: Clone + Eq + Hash, V: Clone> Lru<K, V> {
    pub fn new(capacity: usize) -> Self {
        Lru {
            capacity,
            entries: HashMap::new(),
            order: BTreeMap::new(),
            tick: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    /// The value of `key`, now the most recently used.
    pub fn get(&mut self, key: &K) -> Option<V> {
        let tick = self.next_tick();
        let (value, used) = self.entries.get_mut(key)?;
        let old = std::mem::replace(used, tick);
        let value = value.clone();
        if let Some(k) = self.order.remove(&old) {
            self.order.insert(tick, k);
        }
        Some(value)
    }

    /// Inserts or replaces `key`; returns how many entries were evicted.
    pub fn insert(&mut self, key: K, value: V) -> u64 {
        if self.capacity == 0 {
            return 0;
        }
        let tick = self.next_tick();
        if let Some((_, old)) = self.entries.insert(key.clone(), (value, tick)) {
            self.order.remove(&old);
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
        let mut evicted = 0;
        while self.entries.len() > self.capacity {
            match self.order.pop_first() {
                Some((_, k)) => {
                    self.entries.remove(&k);
                    evicted += 1;
                }
                None => break,
            }
        }
        evicted
    }

    /// Drops the `n` least recently used entries (fewer if there are
    /// fewer); returns how many it dropped.
    pub fn evict_oldest(&mut self, n: usize) -> u64 {
        let mut evicted = 0;
        while evicted < n as u64 {
            let Some((_, k)) = self.order.pop_first() else {
                break;
            };
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
