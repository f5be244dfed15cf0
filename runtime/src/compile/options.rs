//! Compiler options a frontend asks for (`torch.tpu.compiler.
//! custom_compiler_options`, `torch.tpu.allow_excess_precision`,
//! `tpurt_compiler_options_set`): named values handed to the platform's
//! compiler with every program it compiles while they are set. On `xla`
//! they are XLA debug options by name (`xla_allow_excess_precision`, ...),
//! which PJRT applies per program; a name XLA does not know fails that
//! compile with an error naming it. The host platform has no compiler
//! options and ignores them.
//!
//! Process-wide. They are part of every compile-cache key (a program
//! compiled under other options is another entry), and the op memo keys
//! on their generation, so an op called after a change compiles anew.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;

use crate::error::{Error, Result};

/// A value for a named compiler option.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(untagged)]
pub enum OptionValue {
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
}

static OPTIONS: RwLock<BTreeMap<String, OptionValue>> = RwLock::new(BTreeMap::new());
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// The options set now, by name.
pub fn current() -> BTreeMap<String, OptionValue> {
    OPTIONS.read().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Replace the options (an empty map clears them).
pub fn set(options: BTreeMap<String, OptionValue>) {
    *OPTIONS.write().unwrap_or_else(|e| e.into_inner()) = options;
    GENERATION.fetch_add(1, Ordering::SeqCst);
}

/// Changes on every `set`: what the op memo keys on.
pub fn generation() -> u64 {
    GENERATION.load(Ordering::SeqCst)
}

/// The options as compact JSON with sorted names, "" when there are none
/// (so keys made without options never changed).
pub fn canonical() -> String {
    let options = OPTIONS.read().unwrap_or_else(|e| e.into_inner());
    if options.is_empty() {
        String::new()
    } else {
        serde_json::to_string(&*options).unwrap_or_default()
    }
}

/// Options from a JSON object of names to booleans, integers, numbers or
/// strings; anything else is an error naming the option.
pub fn parse_json(text: &str) -> Result<BTreeMap<String, OptionValue>> {
    let value: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| Error::invalid(format!("compiler options are not JSON: {e}")))?;
    let serde_json::Value::Object(map) = value else {
        return Err(Error::invalid(
            "compiler options must be a JSON object of names to values",
        ));
    };
    let mut out = BTreeMap::new();
    for (name, v) in map {
        if name.is_empty() {
            return Err(Error::invalid("a compiler option has an empty name"));
        }
        let value = match v {
            serde_json::Value::Bool(b) => OptionValue::Bool(b),
            serde_json::Value::Number(n) => match n.as_i64() {
                Some(i) => OptionValue::Int(i),
                None => OptionValue::Float(n.as_f64().unwrap_or(f64::NAN)),
            },
            serde_json::Value::String(s) => OptionValue::Str(s),
            other => {
                return Err(Error::invalid(format!(
                    "compiler option {name:?}: {other} is not a boolean, a number or a string"
                )))
            }
        };
        out.insert(name, value);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse_and_read_back_canonically() {
        let o = parse_json(r#"{"b": 1, "a": true, "c": 0.5, "d": "x"}"#).unwrap();
        assert_eq!(o["a"], OptionValue::Bool(true));
        assert_eq!(o["b"], OptionValue::Int(1));
        assert_eq!(o["c"], OptionValue::Float(0.5));
        assert_eq!(o["d"], OptionValue::Str("x".into()));
        for (bad, says) in [
            ("[1]", "JSON object"),
            ("{", "not JSON"),
            (r#"{"a": [1]}"#, "compiler option \"a\": [1]"),
            (r#"{"a": null}"#, "compiler option \"a\": null"),
            (r#"{"": 1}"#, "empty name"),
        ] {
            let e = parse_json(bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
        // The process-wide set (other tests leave it empty).
        let before = generation();
        set(o);
        assert_eq!(canonical(), r#"{"a":true,"b":1,"c":0.5,"d":"x"}"#);
        set(BTreeMap::new());
        assert_eq!(canonical(), "");
        assert_eq!(generation(), before + 2);
    }
}
