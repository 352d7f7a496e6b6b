//! Builds the C example against libdds (static and shared) and runs it against a DPU started
//! in this process; checks that the C header is current and compiles cleanly.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{c_libs, cc, crate_dir, include_dir, start_dpu};

const STRICT: [&str; 4] = ["-std=c11", "-Wall", "-Wextra", "-Werror"];

fn out_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()))
}

fn compile(args: &[&str], what: &str) {
    let out = Command::new(cc())
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler {}: {e}", cc()));
    assert!(
        out.status.success(),
        "{what}: {} {args:?} failed:\n{}",
        cc(),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

/// Compiles `c/example.c` linked as `link` args, runs it and checks its report.
fn build_and_run(name: &str, link: &[&str]) {
    let example = crate_dir().join("c/example.c");
    let include = include_dir();
    let exe = out_path(name);
    let mut args: Vec<&str> = STRICT.to_vec();
    args.extend(["-I", path_str(&include), path_str(&example)]);
    args.extend(link);
    args.extend(["-o", path_str(&exe)]);
    compile(&args, name);

    let dpu = start_dpu();
    let out = Command::new(&exe)
        .arg(dpu.socket())
        .output()
        .expect("run the example");
    dpu.shutdown();
    let _ = std::fs::remove_file(&exe);
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{name}:\n{stdout}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{name} failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    for line in [
        "wrote 12800 bytes (2 writes, 1 gather write, 1 blocking write)",
        "read back 12800 bytes (plain, scatter, blocking read); all bytes match",
        "stat of an unknown id: DDS_UNKNOWN_FILE",
        "registered buffer: 2 writes and 2 reads by DMA, all bytes match; outside it: DDS_BUFFER_RANGE",
        "dds example: OK",
    ] {
        assert!(
            stdout.lines().any(|l| l == line),
            "{name}: missing {line:?} in:\n{stdout}"
        );
    }
    assert!(
        stdout.contains("file /example/data.bin: id "),
        "{name}:\n{stdout}"
    );
}

#[test]
fn c_example_static() {
    let lib = c_libs().join("libdds.a");
    assert!(lib.exists(), "{} not built", lib.display());
    build_and_run(
        "example-static",
        &[path_str(&lib), "-lpthread", "-ldl", "-lm"],
    );
}

#[test]
fn c_example_shared() {
    let dir = c_libs();
    assert!(dir.join("libdds.so").exists(), "libdds.so not built");
    let rpath = format!("-Wl,-rpath,{}", path_str(&dir));
    build_and_run(
        "example-shared",
        &["-L", path_str(&dir), "-ldds", rpath.as_str()],
    );
}

#[test]
fn header_is_current() {
    let committed = std::fs::read_to_string(include_dir().join("dds.h")).expect("include/dds.h");
    let generated =
        std::fs::read_to_string(env!("DDS_GENERATED_HEADER")).expect("generated header");
    assert!(
        committed == generated,
        "include/dds.h is stale: build dds-capi (build.rs rewrites it) and commit it"
    );
}

#[test]
fn header_compiles_strictly() {
    let src = out_path("header-check.c");
    std::fs::write(
        &src,
        "#include \"dds.h\"\n\
         _Static_assert(sizeof(dds_completion) == 24, \"dds_completion\");\n\
         _Static_assert(DDS_OK == 0 && DDS_PROTOCOL == 22, \"codes\");\n\
         int main(void) { return dds_status_name(DDS_OK) == 0; }\n",
    )
    .unwrap();
    let obj = out_path("header-check.o");
    let include = include_dir();
    let mut args: Vec<&str> = STRICT.to_vec();
    args.extend([
        "-pedantic",
        "-I",
        path_str(&include),
        "-c",
        path_str(&src),
        "-o",
        path_str(&obj),
    ]);
    compile(&args, "header");
    let _ = std::fs::remove_file(&src);
    let _ = std::fs::remove_file(&obj);
}

#[test]
fn header_compiles_as_cpp() {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".to_string());
    if Command::new(&cxx).arg("--version").output().is_err() {
        eprintln!("no C++ compiler ({cxx}): skipped");
        return;
    }
    let src = out_path("header-check.cpp");
    std::fs::write(
        &src,
        "#include \"dds.h\"\n\
         int main() { dds_t *d = nullptr; return dds_disconnect(d) == DDS_INVALID_ARGUMENT ? 0 : 1; }\n",
    )
    .unwrap();
    let obj = out_path("header-check-cpp.o");
    let include = include_dir();
    let out = Command::new(&cxx)
        .args([
            "-std=c++11",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-pedantic",
            "-I",
        ])
        .args([
            path_str(&include),
            "-c",
            path_str(&src),
            "-o",
            path_str(&obj),
        ])
        .output()
        .expect("run the C++ compiler");
    let _ = std::fs::remove_file(&src);
    let _ = std::fs::remove_file(&obj);
    assert!(
        out.status.success(),
        "C++: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
