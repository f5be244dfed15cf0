//! The cache key: everything that decides what a compile produces.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::disk::FORMAT_VERSION;
use crate::ir::{fingerprint_bytes, Graph};

/// Identifies one executable: the graph, the platform that compiles it and
/// the options it is compiled with. Two keys are equal exactly when every
/// field is equal; [`CacheKey::digest`] names the key on disk.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CacheKey {
    /// [`Graph::fingerprint`] of the graph to compile.
    pub graph: String,
    /// Platform name: `host`, `xla`, ...
    pub platform: String,
    /// Everything about the platform that can change its output: for host
    /// the tpurt version; for XLA the plugin version and build, and the
    /// PJRT API version.
    pub platform_version: String,
    /// Compile options as one canonical string (see [`canonical_options`]).
    pub options: String,
}

impl CacheKey {
    pub fn new(
        graph_fingerprint: impl Into<String>,
        platform: impl Into<String>,
        platform_version: impl Into<String>,
        options: impl Into<String>,
    ) -> Self {
        CacheKey {
            graph: graph_fingerprint.into(),
            platform: platform.into(),
            platform_version: platform_version.into(),
            options: options.into(),
        }
    }

    /// The key of `graph` compiled by `platform` at `platform_version`.
    pub fn for_graph(
        graph: &Graph,
        platform: impl Into<String>,
        platform_version: impl Into<String>,
        options: impl Into<String>,
    ) -> Self {
        Self::new(graph.fingerprint(), platform, platform_version, options)
    }

    /// 32 hex digits, the same in every process and on every machine. The
    /// on-disk format version is part of it, so builds that write different
    /// formats never fight over one file.
    pub fn digest(&self) -> String {
        fingerprint_bytes(&[
            b"tpurt-compile-cache-key",
            &FORMAT_VERSION.to_le_bytes(),
            self.graph.as_bytes(),
            self.platform.as_bytes(),
            self.platform_version.as_bytes(),
            self.options.as_bytes(),
        ])
    }
}

impl fmt::Display for CacheKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "graph {} on {} {} with options {}",
            self.graph, self.platform, self.platform_version, self.options
        )
    }
}

/// Compile options as a canonical string: a compact JSON object with keys
/// sorted, so the order options were given in never changes the key. A key
/// given twice keeps its last value.
pub fn canonical_options<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let sorted: BTreeMap<&str, &str> = pairs.into_iter().collect();
    serde_json::to_string(&sorted).unwrap_or_default()
}
