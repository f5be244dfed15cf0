//! Builds tests/c/api_test.c against include/tpurt.h and the static
//! library, runs it, and fails on any failed check inside it.

use std::path::PathBuf;
use std::process::Command;

/// The libtpurt.a cargo built beside this test binary (target/<profile>/deps):
/// a test build emits every crate type of tpurt-capi there, fresh.
fn static_lib() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().map(|d| d.join("libtpurt.a")).unwrap()
}

#[test]
fn c_program_exercises_the_whole_api() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let lib = static_lib();
    assert!(
        lib.exists(),
        "{} is missing: build the tpurt-capi crate first",
        lib.display()
    );
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("api_test");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-g", "-I"])
        .arg(root.join("include"))
        .arg(root.join("capi/tests/c/api_test.c"))
        .arg(&lib)
        .args(["-lpthread", "-ldl", "-lm", "-o"])
        .arg(&out)
        .status()
        .expect("a C compiler (cc) is needed for this test");
    assert!(status.success(), "compiling the C test failed");
    let run = Command::new(&out).output().unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "C test failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("checks passed"), "{stdout}");
    println!("{stdout}");
}
