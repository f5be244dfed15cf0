//! With feature `xla`: generate the PJRT C API declarations with bindgen
//! from the header that ships in the plugin's wheel.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=TPURT_PJRT_HEADER");
    #[cfg(feature = "xla")]
    pjrt::generate();
}

#[cfg(feature = "xla")]
mod pjrt {
    use std::path::PathBuf;

    /// TPURT_PJRT_HEADER, else the xla-cpu-pjrt wheel in the workspace's .venv.
    fn find_header() -> Option<PathBuf> {
        if let Some(p) = std::env::var_os("TPURT_PJRT_HEADER") {
            return Some(PathBuf::from(p));
        }
        let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").ok()?).join("..");
        let lib = root.join(".venv/lib");
        for entry in std::fs::read_dir(lib).ok()?.flatten() {
            let h = entry
                .path()
                .join("site-packages/xla_plugins/xla_cpu_pjrt/include/pjrt_c_api.h");
            if h.exists() {
                return Some(h);
            }
        }
        None
    }

    pub fn generate() {
        let header = find_header().unwrap_or_else(|| {
            panic!(
                "feature `xla` needs pjrt_c_api.h: set TPURT_PJRT_HEADER, or install the \
                 xla-cpu-pjrt wheel into the workspace's .venv"
            )
        });
        println!("cargo:rerun-if-changed={}", header.display());
        let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("pjrt.rs");
        bindgen::Builder::default()
            .header(header.to_string_lossy())
            .allowlist_type("PJRT_.*")
            .allowlist_var("PJRT_.*")
            .derive_default(true)
            .layout_tests(false)
            .generate_comments(false)
            .generate()
            .expect("bindgen could not read pjrt_c_api.h")
            .write_to_file(out)
            .expect("could not write the PJRT declarations");
    }
}
