//! The compiler front: a platform's compile step behind the compile cache.
//! Shared (in an `Arc`) by the runtime and by streams that hold deferred
//! ops, which compile their fused graph when they flush.

use std::sync::Arc;

use super::{CacheConfig, CacheKey, CompileCache};
use crate::error::Result;
use crate::ir::Graph;
use crate::platform::{Executable, Platform};

pub struct Compiler {
    platform: Arc<dyn Platform>,
    cache: CompileCache<dyn Executable>,
}

impl Compiler {
    pub fn new(platform: Arc<dyn Platform>, config: CacheConfig) -> Self {
        Compiler {
            platform,
            cache: CompileCache::new(config),
        }
    }

    pub fn platform(&self) -> &Arc<dyn Platform> {
        &self.platform
    }

    pub fn cache(&self) -> &CompileCache<dyn Executable> {
        &self.cache
    }

    /// An executable for `graph`, from the cache (built on a miss).
    pub fn compile(&self, graph: &Graph) -> Result<Arc<dyn Executable>> {
        let platform = &self.platform;
        let key = CacheKey::for_graph(graph, platform.name(), platform.version(), "");
        self.cache.get_or_compile(
            &key,
            || graph.to_string(),
            || {
                let exe = platform.compile(graph)?;
                let bytes = exe.serialize();
                Ok((exe, bytes))
            },
            |bytes| platform.load_executable(bytes),
        )
    }
}
