//! The checked-in header must equal a fresh generation from the sources.
//! Regenerate with `TPURT_UPDATE_HEADER=1 cargo test -p tpurt-capi --test header`.

use std::path::PathBuf;

#[test]
fn checked_in_header_matches_the_sources() {
    let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let config =
        cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_crate(&crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen could not generate the header");
    let mut fresh = Vec::new();
    bindings.write(&mut fresh);
    let fresh = String::from_utf8(fresh).unwrap();
    let path = crate_dir.join("../include/tpurt.h");
    if std::env::var_os("TPURT_UPDATE_HEADER").is_some() {
        std::fs::write(&path, &fresh).unwrap();
        return;
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == fresh,
        "include/tpurt.h differs from the sources; regenerate it with \
         `TPURT_UPDATE_HEADER=1 cargo test -p tpurt-capi --test header` and commit it"
    );
}
