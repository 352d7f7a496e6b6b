//! Generates the C header from this crate's sources with cbindgen.
//!
//! The header is written to `$OUT_DIR/dds.h` (the test `header_is_current` compares it with
//! the committed `include/dds.h`) and, so that the committed copy follows the sources, also
//! to `include/dds.h` when its contents differ. With `CI` or `DDS_CAPI_CHECK_HEADER` set,
//! the source tree is left alone, so that a stale committed header makes the test fail.

use std::env;
use std::fs;
use std::path::PathBuf;

fn main() {
    let crate_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    let committed = crate_dir.join("../../include/dds.h");
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    println!("cargo:rerun-if-changed={}", committed.display());
    println!("cargo:rerun-if-env-changed=CI");
    println!("cargo:rerun-if-env-changed=DDS_CAPI_CHECK_HEADER");

    let config =
        cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("read cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(crate_dir.join("src/lib.rs"))
        .generate()
        .expect("generate the C header");
    let generated = out_dir.join("dds.h");
    bindings.write_to_file(&generated);
    println!(
        "cargo:rustc-env=DDS_GENERATED_HEADER={}",
        generated.display()
    );
    // The tests build the C libraries with a nested cargo and need the target triple.
    println!(
        "cargo:rustc-env=DDS_BUILD_TARGET={}",
        env::var("TARGET").unwrap_or_default()
    );

    let check_only = env::var_os("CI").is_some_and(|v| !v.is_empty())
        || env::var_os("DDS_CAPI_CHECK_HEADER").is_some_and(|v| !v.is_empty());
    if check_only {
        return;
    }
    let new = fs::read(&generated).expect("read the generated header");
    if fs::read(&committed).ok().as_deref() != Some(new.as_slice()) {
        if let Some(dir) = committed.parent() {
            fs::create_dir_all(dir).expect("create include/");
        }
        fs::write(&committed, &new).expect("write include/dds.h");
    }
}
