//! The compiler front: a platform's compile step behind the compile cache.
//! Shared (in an `Arc`) by the runtime and by streams that hold deferred
//! ops, which compile their fused graph when they flush.

use std::sync::Arc;

use super::{CacheConfig, CacheKey, CompileCache, UseMark};
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
        self.compile_keyed(graph).map(|(exe, _)| exe)
    }

    /// [`Compiler::compile`], with the mark through which a memo that
    /// keeps the executable (weakly) reports its uses to the cache.
    pub fn compile_marked(&self, graph: &Graph) -> Result<(Arc<dyn Executable>, UseMark)> {
        let (exe, key) = self.compile_keyed(graph)?;
        Ok((exe, self.cache.use_mark(&key)))
    }

    fn compile_keyed(&self, graph: &Graph) -> Result<(Arc<dyn Executable>, CacheKey)> {
        let platform = &self.platform;
        // The frontend's compiler options join the platform's settings in
        // the key (only when there are any: keys made without them hold).
        let mut options = platform.compile_options();
        let asked = super::options::canonical();
        if !asked.is_empty() {
            options = format!("{options};compiler_options={asked}");
        }
        let key = CacheKey::for_graph(graph, platform.name(), platform.version(), options);
        // After a compile or load, the platform may be short of room for
        // loaded programs: the cache then lets its older half go (what
        // nobody else holds is unloaded).
        let pressed = std::cell::Cell::new(false);
        let exe = self.cache.get_or_compile(
            &key,
            || graph.to_string(),
            || {
                let exe = platform.compile(graph)?;
                pressed.set(platform.loaded_code_pressure());
                let bytes = exe.serialize();
                Ok((exe, bytes))
            },
            |bytes| {
                let exe = platform.load_executable(bytes)?;
                pressed.set(platform.loaded_code_pressure());
                Ok(exe)
            },
        )?;
        if pressed.get() {
            self.cache.evict_older_half();
        }
        Ok((exe, key))
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

    /// The frontend's compiler options are part of the key: a program
    /// compiled under them is another entry, and the one compiled without
    /// them is found again once they are cleared.
    #[test]
    fn the_cache_key_holds_the_frontends_compiler_options() {
        use crate::compile::options;
        let host: Arc<dyn Platform> = HostPlatform::new(HostConfig::default());
        let compiler = Compiler::new(host, CacheConfig::memory_only(8));
        let t = TensorType::new(DType::F32, &[3]);
        let mut b = GraphBuilder::new();
        let x = b.param(t);
        let y = b.binary(BinaryOp::Mul, x, x).unwrap();
        let graph = b.build(&[y]).unwrap();
        compiler.compile(&graph).unwrap();
        options::set(options::parse_json(r#"{"xla_cpu_enable_fast_math": true}"#).unwrap());
        compiler.compile(&graph).unwrap();
        options::set(Default::default());
        compiler.compile(&graph).unwrap();
        let st = compiler.cache().stats();
        assert_eq!((st.misses, st.memory_hits), (2, 1));
    }

    /// A platform that reports pressure after a compile has the cache let
    /// its older half go; the program just made stays.
    #[test]
    fn pressure_after_a_compile_lets_the_older_half_go() {
        use std::sync::atomic::Ordering;
        let platform = Arc::new(Tweaked::over(HostPlatform::new(HostConfig::default())));
        let compiler = Compiler::new(platform.clone(), CacheConfig::memory_only(64));
        let graph = |n: u64| {
            let mut b = GraphBuilder::new();
            let x = b.param(TensorType::new(DType::F32, &[n]));
            let y = b.binary(BinaryOp::Add, x, x).unwrap();
            b.build(&[y]).unwrap()
        };
        for n in 1..=6 {
            compiler.compile(&graph(n)).unwrap();
        }
        assert_eq!(compiler.cache().stats().evictions, 0);
        platform.pressed.store(true, Ordering::Relaxed);
        compiler.compile(&graph(7)).unwrap();
        let st = compiler.cache().stats();
        assert_eq!((st.evictions, st.memory_entries), (4, 3));
        // A hit asks nothing of the platform.
        compiler.compile(&graph(7)).unwrap();
        assert_eq!(compiler.cache().stats().evictions, 4);
        platform.pressed.store(false, Ordering::Relaxed);
        compiler.compile(&graph(6)).unwrap();
        compiler.compile(&graph(1)).unwrap();
        let st = compiler.cache().stats();
        assert_eq!((st.memory_hits, st.misses), (2, 8), "6 stayed, 1 went");
    }
}
