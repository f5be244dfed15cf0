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
        let key = CacheKey::for_graph(
            graph,
            platform.name(),
            platform.version(),
            platform.compile_options(),
        );
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{BinaryOp, DType, GraphBuilder, TensorType};
    use crate::platform::host::{HostConfig, HostPlatform};
    use crate::platform::testing::Tweaked;

    /// A program compiled under other settings (XLA_FLAGS on xla) is
    /// compiled again, not loaded from the disk cache; under the same
    /// settings it is loaded.
    #[test]
    fn the_cache_key_holds_the_platform_compile_options() {
        let dir = std::env::temp_dir().join(format!(
            "tpurt-compile-options-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let host: Arc<dyn Platform> = HostPlatform::new(HostConfig::default());
        let t = TensorType::new(DType::F32, &[4]);
        let mut b = GraphBuilder::new();
        let x = b.param(t);
        let y = b.binary(BinaryOp::Add, x, x).unwrap();
        let graph = b.build(&[y]).unwrap();
        // A fresh compiler (a new process) on the shared directory.
        let stats_after_compile = |options: &'static str| {
            let platform = Arc::new(Tweaked {
                options: Some(options),
                ..Tweaked::over(Arc::clone(&host))
            });
            let compiler = Compiler::new(platform, CacheConfig::memory_only(4).with_disk_dir(&dir));
            compiler.compile(&graph).unwrap();
            let st = compiler.cache().stats();
            (st.misses, st.disk_hits)
        };
        assert_eq!(stats_after_compile(""), (1, 0));
        assert_eq!(stats_after_compile(""), (0, 1));
        assert_eq!(
            stats_after_compile("{\"XLA_FLAGS\":\"--xla_cpu_enable_fast_math=true\"}"),
            (1, 0)
        );
        assert_eq!(
            stats_after_compile("{\"XLA_FLAGS\":\"--xla_cpu_enable_fast_math=true\"}"),
            (0, 1)
        );
        assert_eq!(stats_after_compile(""), (0, 1));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
