//! Typed op attributes, as a frontend passes them: `dim=1`, `alpha=0.5`,
//! `keepdim=true`, `dims=[0, 2]`, `dtype=f32`. Getters say which op and
//! attribute was wrong.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::ir::DType;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Attr {
    Bool(bool),
    Int(i64),
    Float(f64),
    Ints(Vec<i64>),
    Floats(Vec<f64>),
    DType(DType),
    Str(String),
    /// An optional attribute passed as "none".
    None,
}

impl Attr {
    fn kind(&self) -> &'static str {
        match self {
            Attr::Bool(_) => "bool",
            Attr::Int(_) => "int",
            Attr::Float(_) => "float",
            Attr::Ints(_) => "int list",
            Attr::Floats(_) => "float list",
            Attr::DType(_) => "dtype",
            Attr::Str(_) => "string",
            Attr::None => "none",
        }
    }
}

/// Attributes sorted by name (so equal sets compare and hash equal).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Attrs {
    items: Vec<(String, Attr)>,
}

impl Attrs {
    pub fn new() -> Self {
        Self::default()
    }

    /// Builder style: `Attrs::new().with("dim", Attr::Int(1))`.
    pub fn with(mut self, name: &str, value: Attr) -> Self {
        self.set(name, value);
        self
    }

    pub fn set(&mut self, name: &str, value: Attr) {
        match self.items.binary_search_by(|(k, _)| k.as_str().cmp(name)) {
            Ok(i) => self.items[i].1 = value,
            Err(i) => self.items.insert(i, (name.to_string(), value)),
        }
    }

    pub fn get(&self, name: &str) -> Option<&Attr> {
        self.items
            .binary_search_by(|(k, _)| k.as_str().cmp(name))
            .ok()
            .map(|i| &self.items[i].1)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.items.iter().map(|(k, _)| k.as_str())
    }

    /// Canonical text for cache keys.
    pub fn canonical(&self) -> String {
        serde_json::to_string(&self.items).unwrap_or_default()
    }

    /// Feed the attributes to a hasher, floats by their bits (as
    /// [`Attrs::same_bits`] compares them): a memo key that needs no text.
    pub fn hash_bits<H: std::hash::Hasher>(&self, h: &mut H) {
        use std::hash::Hash;
        self.items.len().hash(h);
        for (k, v) in &self.items {
            k.hash(h);
            std::mem::discriminant(v).hash(h);
            match v {
                Attr::Bool(b) => b.hash(h),
                Attr::Int(i) => i.hash(h),
                Attr::Float(f) => f.to_bits().hash(h),
                Attr::Ints(v) => v.hash(h),
                Attr::Floats(v) => {
                    v.len().hash(h);
                    v.iter().for_each(|f| f.to_bits().hash(h));
                }
                Attr::DType(d) => d.hash(h),
                Attr::Str(s) => s.hash(h),
                Attr::None => {}
            }
        }
    }

    /// Equal names and values, floats compared by their bits (so -0.0 and
    /// 0.0 differ, and a NaN equals itself): two attribute sets that build
    /// the same graph.
    pub fn same_bits(&self, other: &Attrs) -> bool {
        fn floats_eq(a: &[f64], b: &[f64]) -> bool {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
        }
        self.items.len() == other.items.len()
            && self
                .items
                .iter()
                .zip(&other.items)
                .all(|((ka, a), (kb, b))| {
                    ka == kb
                        && match (a, b) {
                            (Attr::Float(x), Attr::Float(y)) => x.to_bits() == y.to_bits(),
                            (Attr::Floats(x), Attr::Floats(y)) => floats_eq(x, y),
                            _ => a == b,
                        }
                })
    }

    fn wrong(name: &str, want: &str, got: &Attr) -> Error {
        Error::invalid(format!(
            "attribute {name} must be {want}, got {} ({got:?})",
            got.kind()
        ))
    }

    fn missing(name: &str, want: &str) -> Error {
        Error::invalid(format!("attribute {name} ({want}) is required"))
    }

    pub fn int(&self, name: &str) -> Result<i64> {
        self.int_opt(name)?
            .ok_or_else(|| Self::missing(name, "int"))
    }
    pub fn int_opt(&self, name: &str) -> Result<Option<i64>> {
        match self.get(name) {
            None | Some(Attr::None) => Ok(None),
            Some(Attr::Int(v)) => Ok(Some(*v)),
            Some(Attr::Bool(b)) => Ok(Some(*b as i64)),
            Some(other) => Err(Self::wrong(name, "an int", other)),
        }
    }
    pub fn int_or(&self, name: &str, default: i64) -> Result<i64> {
        Ok(self.int_opt(name)?.unwrap_or(default))
    }

    pub fn float(&self, name: &str) -> Result<f64> {
        self.float_opt(name)?
            .ok_or_else(|| Self::missing(name, "float"))
    }
    pub fn float_opt(&self, name: &str) -> Result<Option<f64>> {
        match self.get(name) {
            None | Some(Attr::None) => Ok(None),
            Some(Attr::Float(v)) => Ok(Some(*v)),
            Some(Attr::Int(v)) => Ok(Some(*v as f64)),
            Some(Attr::Bool(b)) => Ok(Some(*b as i64 as f64)),
            Some(other) => Err(Self::wrong(name, "a number", other)),
        }
    }
    pub fn float_or(&self, name: &str, default: f64) -> Result<f64> {
        Ok(self.float_opt(name)?.unwrap_or(default))
    }

    pub fn bool_or(&self, name: &str, default: bool) -> Result<bool> {
        match self.get(name) {
            None | Some(Attr::None) => Ok(default),
            Some(Attr::Bool(b)) => Ok(*b),
            Some(Attr::Int(v)) => Ok(*v != 0),
            Some(other) => Err(Self::wrong(name, "a bool", other)),
        }
    }

    pub fn ints_opt(&self, name: &str) -> Result<Option<Vec<i64>>> {
        match self.get(name) {
            None | Some(Attr::None) => Ok(None),
            Some(Attr::Ints(v)) => Ok(Some(v.clone())),
            Some(Attr::Int(v)) => Ok(Some(vec![*v])),
            Some(other) => Err(Self::wrong(name, "a list of ints", other)),
        }
    }
    pub fn ints(&self, name: &str) -> Result<Vec<i64>> {
        self.ints_opt(name)?
            .ok_or_else(|| Self::missing(name, "int list"))
    }

    pub fn dtype_opt(&self, name: &str) -> Result<Option<DType>> {
        match self.get(name) {
            None | Some(Attr::None) => Ok(None),
            Some(Attr::DType(d)) => Ok(Some(*d)),
            Some(Attr::Str(s)) => DType::from_name(s).map(Some),
            Some(other) => Err(Self::wrong(name, "a dtype", other)),
        }
    }

    pub fn str_or<'a>(&'a self, name: &str, default: &'a str) -> Result<&'a str> {
        match self.get(name) {
            None | Some(Attr::None) => Ok(default),
            Some(Attr::Str(s)) => Ok(s),
            Some(other) => Err(Self::wrong(name, "a string", other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::{DefaultHasher, Hasher};

    fn hash(a: &Attrs) -> u64 {
        let mut h = DefaultHasher::new();
        a.hash_bits(&mut h);
        h.finish()
    }

    #[test]
    fn bitwise_equality_and_hash_agree() {
        let f = |v: f64| Attrs::new().with("x", Attr::Float(v));
        let nan = f(f64::NAN);
        assert!(nan.same_bits(&nan.clone()), "a NaN attribute equals itself");
        assert_eq!(hash(&nan), hash(&nan.clone()));
        assert!(
            !f(0.0).same_bits(&f(-0.0)),
            "-0.0 and 0.0 build different graphs"
        );
        assert_ne!(hash(&f(0.0)), hash(&f(-0.0)));
        // The order attributes are set in does not matter; kinds do.
        let ab = Attrs::new()
            .with("a", Attr::Int(1))
            .with("b", Attr::Bool(true));
        let ba = Attrs::new()
            .with("b", Attr::Bool(true))
            .with("a", Attr::Int(1));
        assert!(ab.same_bits(&ba));
        assert_eq!(hash(&ab), hash(&ba));
        let int = Attrs::new().with("x", Attr::Int(1));
        let ints = Attrs::new().with("x", Attr::Ints(vec![1]));
        assert!(!int.same_bits(&ints));
        let fl = |v: Vec<f64>| Attrs::new().with("x", Attr::Floats(v));
        assert!(fl(vec![1.0, f64::NAN]).same_bits(&fl(vec![1.0, f64::NAN])));
        assert!(!fl(vec![1.0]).same_bits(&fl(vec![1.0, 2.0])));
    }
}
