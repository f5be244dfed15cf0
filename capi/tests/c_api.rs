//! Builds tests/c/api_test.c against include/tpurt.h and the static
//! library, runs it, and fails on any failed check inside it; then runs it
//! again under valgrind's memcheck, which must find no error.

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
    memcheck(&out);
}

/// The same program under valgrind's memcheck: no invalid read or write,
/// no use of uninitialised memory, no block definitely lost. Skipped where
/// valgrind is missing, unless TPURT_REQUIRE_VALGRIND is set (scripts/test
/// sets it; scripts/setup installs valgrind).
fn memcheck(program: &std::path::Path) {
    let have = Command::new("valgrind").arg("--version").output().is_ok();
    if !have {
        assert!(
            std::env::var_os("TPURT_REQUIRE_VALGRIND").is_none(),
            "valgrind is required (TPURT_REQUIRE_VALGRIND is set) but missing"
        );
        println!("valgrind not found: the memcheck run is skipped");
        return;
    }
    let run = Command::new("valgrind")
        .args([
            "--error-exitcode=9",
            "--leak-check=full",
            "--errors-for-leak-kinds=definite",
        ])
        .arg(program)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        run.status.success() && stderr.contains("ERROR SUMMARY: 0 errors"),
        "memcheck found errors (exit {:?}):\n{stdout}\n{stderr}",
        run.status.code()
    );
    assert!(stdout.contains("checks passed"), "{stdout}");
    let summary = stderr
        .lines()
        .filter(|l| l.contains("ERROR SUMMARY") || l.contains("definitely lost"))
        .collect::<Vec<_>>()
        .join("\n");
    println!("memcheck:\n{summary}");
}
