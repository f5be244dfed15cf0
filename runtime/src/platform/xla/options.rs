//! The compile options the xla platform hands PJRT: a serialized
//! `CompileOptionsProto`, written by hand (the one message we send does not
//! justify a protobuf dependency). Its fields, from XLA's
//! `xla/pjrt/proto/compile_options.proto`:
//!
//! - 3 `executable_build_options` { 4 `num_replicas` = 1, 5
//!   `num_partitions` = 1 }: an empty set aborts the plugin (ANCHORS);
//! - 7 `env_option_overrides`, a map from a `DebugOptions` field's name to
//!   an `OptionOverrideProto` { 1 `string_field`, 2 `bool_field`, 3
//!   `int_field`, 4 `double_field` }, which PJRT applies to the program's
//!   debug options by name (as `XLA_FLAGS` would, but per program).

pub use crate::compile::options::OptionValue;

/// What every program is compiled with unless overridden: no excess
/// precision, so that XLA rounds a bf16 or f16 value wherever the program
/// says (as torch rounds after every op) instead of keeping an f32
/// intermediate inside a fusion (XLA's default), which made chains of
/// half-precision ops differ from torch's in up to a quarter of their
/// elements.
pub const DEFAULTS: &[(&str, bool)] = &[("xla_allow_excess_precision", false)];

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn field_bytes(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    varint(out, (u64::from(field) << 3) | 2);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// The serialized `CompileOptionsProto`: one replica and one partition,
/// and `overrides` (later names win over earlier ones, as in a map).
pub fn compile_options_proto(overrides: &[(String, OptionValue)]) -> Vec<u8> {
    let mut out = Vec::new();
    field_bytes(&mut out, 3, &[0x20, 1, 0x28, 1]);
    let mut seen = std::collections::BTreeMap::new();
    for (name, value) in overrides {
        seen.insert(name.as_str(), value);
    }
    for (name, value) in seen {
        let mut v = Vec::new();
        match value {
            OptionValue::Str(s) => field_bytes(&mut v, 1, s.as_bytes()),
            OptionValue::Bool(b) => {
                v.push(2 << 3);
                v.push(u8::from(*b));
            }
            OptionValue::Int(i) => {
                v.push(3 << 3);
                varint(&mut v, *i as u64);
            }
            OptionValue::Float(x) => {
                v.push((4 << 3) | 1);
                v.extend_from_slice(&x.to_le_bytes());
            }
        }
        let mut entry = Vec::new();
        field_bytes(&mut entry, 1, name.as_bytes());
        field_bytes(&mut entry, 2, &v);
        field_bytes(&mut out, 7, &entry);
    }
    out
}

/// The overrides of a program compiled now: the defaults, then the
/// frontend's compiler options (`compile::options`), which win.
pub fn in_force() -> Vec<(String, OptionValue)> {
    DEFAULTS
        .iter()
        .map(|(n, b)| (n.to_string(), OptionValue::Bool(*b)))
        .chain(crate::compile::options::current())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_proto_is_what_the_fields_say() {
        // Without overrides: the build options alone, as before.
        assert_eq!(compile_options_proto(&[]), vec![0x1a, 4, 0x20, 1, 0x28, 1]);
        let bytes = compile_options_proto(&[
            ("b".into(), OptionValue::Int(-1)),
            ("a".into(), OptionValue::Bool(false)),
        ]);
        let mut want = vec![0x1a, 4, 0x20, 1, 0x28, 1];
        // a = bool_field false
        want.extend_from_slice(&[0x3a, 7, 0x0a, 1, b'a', 0x12, 2, 0x10, 0]);
        // b = int_field -1: ten bytes of varint
        want.extend_from_slice(&[0x3a, 16, 0x0a, 1, b'b', 0x12, 11, 0x18]);
        want.extend_from_slice(&[0xff; 9]);
        want.push(0x01);
        assert_eq!(bytes, want);
        let s = compile_options_proto(&[("s".into(), OptionValue::Str("xy".into()))]);
        assert_eq!(
            &s[6..],
            &[0x3a, 9, 0x0a, 1, b's', 0x12, 4, 0x0a, 2, b'x', b'y']
        );
        let f = compile_options_proto(&[("f".into(), OptionValue::Float(1.5))]);
        assert_eq!(&f[6..13], &[0x3a, 14, 0x0a, 1, b'f', 0x12, 9]);
        assert_eq!(f[13], 0x21);
        assert_eq!(&f[14..], &1.5f64.to_le_bytes());
    }
}
