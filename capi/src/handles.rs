//! Checked handles: each object a frontend holds is a 64-bit value made of
//! a kind tag, a generation and a slot index. A lookup checks all three, so
//! a null, stale, double-freed or wrong-kind handle is an error, not a crash.

use std::sync::Mutex;

use slab::Slab;
use tpurt_core::{Error, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kind {
    Runtime = 1,
    Stream = 2,
    Event = 3,
    Buffer = 4,
    Executable = 5,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Runtime => "tpurt_runtime",
            Kind::Stream => "tpurt_stream",
            Kind::Event => "tpurt_event",
            Kind::Buffer => "tpurt_buffer",
            Kind::Executable => "tpurt_executable",
        }
    }
    fn from_tag(tag: u8) -> Option<Kind> {
        [
            Kind::Runtime,
            Kind::Stream,
            Kind::Event,
            Kind::Buffer,
            Kind::Executable,
        ]
        .into_iter()
        .find(|k| *k as u8 == tag)
    }
}

const INDEX_BITS: u32 = 32;
const GEN_BITS: u32 = 24;
const GEN_MASK: u64 = (1 << GEN_BITS) - 1;

struct Slot<T> {
    generation: u32,
    /// The runtime handle this object belongs to (0 for runtimes).
    owner: u64,
    value: T,
}

struct Inner<T> {
    slab: Slab<Slot<T>>,
    /// Next generation per slot index, bumped at each removal.
    generations: Vec<u32>,
}

pub(crate) struct HandleTable<T> {
    kind: Kind,
    inner: Mutex<Inner<T>>,
}

impl<T: Clone> HandleTable<T> {
    pub const fn new(kind: Kind) -> Self {
        HandleTable {
            kind,
            inner: Mutex::new(Inner {
                slab: Slab::new(),
                generations: Vec::new(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<T>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn insert(&self, owner: u64, value: T) -> u64 {
        let mut inner = self.lock();
        let entry = inner.slab.vacant_entry();
        let index = entry.key();
        let _ = entry;
        if inner.generations.len() <= index {
            inner.generations.resize(index + 1, 1);
        }
        let generation = inner.generations[index];
        inner.slab.insert(Slot {
            generation,
            owner,
            value,
        });
        ((self.kind as u64) << (INDEX_BITS + GEN_BITS))
            | ((generation as u64 & GEN_MASK) << INDEX_BITS)
            | (index as u64 + 1)
    }

    fn decode(&self, handle: u64) -> Result<(usize, u32)> {
        let kind = self.kind.name();
        if handle == 0 {
            return Err(Error::InvalidHandle(format!("{kind} is null")));
        }
        let tag = (handle >> (INDEX_BITS + GEN_BITS)) as u8;
        if tag != self.kind as u8 {
            return Err(Error::InvalidHandle(match Kind::from_tag(tag) {
                Some(other) => format!(
                    "{handle:#x} is a {} where a {kind} was expected",
                    other.name()
                ),
                None => format!("{handle:#x} is not a {kind} handle"),
            }));
        }
        let index = (handle & ((1 << INDEX_BITS) - 1)) as usize;
        if index == 0 {
            return Err(Error::InvalidHandle(format!(
                "{handle:#x} is not a {kind} handle"
            )));
        }
        let generation = ((handle >> INDEX_BITS) & GEN_MASK) as u32;
        Ok((index - 1, generation))
    }

    fn stale(&self, handle: u64) -> Error {
        Error::InvalidHandle(format!(
            "{} {handle:#x} was destroyed already (or its runtime was)",
            self.kind.name()
        ))
    }

    /// The object and its owner.
    pub fn get(&self, handle: u64) -> Result<(T, u64)> {
        let (index, generation) = self.decode(handle)?;
        let inner = self.lock();
        match inner.slab.get(index) {
            Some(slot) if slot.generation == generation => Ok((slot.value.clone(), slot.owner)),
            _ => Err(self.stale(handle)),
        }
    }

    pub fn remove(&self, handle: u64) -> Result<T> {
        let (index, generation) = self.decode(handle)?;
        let mut inner = self.lock();
        match inner.slab.get(index) {
            Some(slot) if slot.generation == generation => {
                let slot = inner.slab.remove(index);
                bump(&mut inner.generations[index]);
                Ok(slot.value)
            }
            _ => Err(self.stale(handle)),
        }
    }

    /// Remove every object of `owner`; returned so they drop outside the lock.
    pub fn remove_owned_by(&self, owner: u64) -> Vec<T> {
        let mut inner = self.lock();
        let keys: Vec<usize> = inner
            .slab
            .iter()
            .filter(|(_, s)| s.owner == owner)
            .map(|(k, _)| k)
            .collect();
        keys.into_iter()
            .map(|k| {
                bump(&mut inner.generations[k]);
                inner.slab.remove(k).value
            })
            .collect()
    }

    /// Live handles in the table.
    pub fn len(&self) -> usize {
        self.lock().slab.len()
    }
}

fn bump(generation: &mut u32) {
    *generation = (*generation + 1) & GEN_MASK as u32;
    if *generation == 0 {
        *generation = 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_null_and_wrong_kind_handles_are_errors() {
        let t: HandleTable<u32> = HandleTable::new(Kind::Buffer);
        let other: HandleTable<u32> = HandleTable::new(Kind::Stream);
        let h = t.insert(7, 42);
        assert_eq!(t.get(h).unwrap(), (42, 7));
        assert!(t.get(0).unwrap_err().to_string().contains("null"));
        let s = other.insert(7, 1);
        assert!(t
            .get(s)
            .unwrap_err()
            .to_string()
            .contains("is a tpurt_stream"));
        assert_eq!(t.remove(h).unwrap(), 42);
        assert!(t
            .remove(h)
            .unwrap_err()
            .to_string()
            .contains("destroyed already"));
        // The slot is reused with a new generation; the old handle stays stale.
        let h2 = t.insert(7, 43);
        assert_ne!(h, h2);
        assert!(t.get(h).is_err());
        assert_eq!(t.remove_owned_by(7), vec![43]);
        assert!(t.get(h2).is_err());
        assert_eq!(t.len(), 0);
    }
}
