//! `docs/architecture.md`'s crate table matches the workspace: one row per crate under
//! `crates/`, and each row's "depends on" column lists exactly the crate's `[dependencies]` on
//! other workspace crates; the arrows it says are kept out stay out.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

fn workspace() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .and_then(Path::parent)
        .expect("crates/dds-cli lies two levels below the workspace")
}

/// Workspace crates named in the `[dependencies]` section of a manifest.
fn manifest_deps(manifest: &str) -> BTreeSet<String> {
    let mut deps = BTreeSet::new();
    let mut in_deps = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_deps = line == "[dependencies]";
            continue;
        }
        if in_deps && line.starts_with("dds-") {
            let name: String = line
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            deps.insert(name);
        }
    }
    deps
}

/// Rows of the crate table: crate → its "depends on" column.
fn documented(doc: &str) -> BTreeMap<String, BTreeSet<String>> {
    let start = doc
        .find("| crate | part | depends on |")
        .expect("the crate table");
    doc[start..]
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let cols: Vec<&str> = l.split('|').map(str::trim).collect();
            let name = cols[1].trim_matches('`').to_string();
            let deps = cols[cols.len() - 2]
                .split(',')
                .map(str::trim)
                .filter(|d| !d.is_empty() && *d != "—")
                .map(str::to_string)
                .collect();
            (name, deps)
        })
        .collect()
}

/// Every crate under `crates/` → its `[dependencies]` on other workspace crates.
fn cargo_graph() -> BTreeMap<String, BTreeSet<String>> {
    let mut actual = BTreeMap::new();
    for entry in std::fs::read_dir(workspace().join("crates")).unwrap() {
        let dir = entry.unwrap().path();
        let Ok(manifest) = std::fs::read_to_string(dir.join("Cargo.toml")) else {
            continue;
        };
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        actual.insert(name, manifest_deps(&manifest));
    }
    assert!(actual.len() >= 10, "found the crates: {:?}", actual.keys());
    actual
}

/// The workspace crates `krate` depends on, directly or through others (`[dependencies]`).
fn reachable(graph: &BTreeMap<String, BTreeSet<String>>, krate: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut todo = vec![krate.to_string()];
    while let Some(k) = todo.pop() {
        for d in graph.get(&k).into_iter().flatten() {
            if seen.insert(d.clone()) {
                todo.push(d.clone());
            }
        }
    }
    seen
}

#[test]
fn crate_table_matches_the_cargo_graph() {
    let root = workspace();
    let doc = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let table = documented(&doc);
    let actual = cargo_graph();
    assert_eq!(
        table.keys().collect::<Vec<_>>(),
        actual.keys().collect::<Vec<_>>(),
        "one row per crate"
    );
    for (name, deps) in &actual {
        assert_eq!(&table[name], deps, "dependencies of {name}");
    }
}

/// The layering `docs/architecture.md` states ("Arrows kept out"): the services share the
/// storage adapter (`dds-storage`) instead of reaching into one another, the applications do
/// not depend on the services whose offload apps the `dds` binary registers beside theirs, and
/// the protocol crate sits on the systems crate (`dds-sys`), not on the DMA engine or a store.
/// Neither directly nor through another crate.
#[test]
fn layering_arrows_kept_out() {
    let graph = cargo_graph();
    for (krate, below) in [
        ("dds-pageserver", "dds-kv"),
        ("dds-apps", "dds-kv"),
        ("dds-apps", "dds-pageserver"),
        ("dds-proto", "dds-dma"),
        ("dds-proto", "dds-objstore"),
        ("dds-storage", "dds-kv"),
        ("dds-storage", "dds-apps"),
        ("dds-storage", "dds-pageserver"),
    ] {
        let deps = reachable(&graph, krate);
        assert!(
            !deps.contains(below),
            "{krate} must not depend on {below}; it reaches {deps:?}"
        );
    }
    for (krate, on) in [
        ("dds-kv", "dds-storage"),
        ("dds-pageserver", "dds-storage"),
        ("dds-apps", "dds-storage"),
        ("dds-proto", "dds-sys"),
        ("dds-dma", "dds-sys"),
        ("dds-objstore", "dds-sys"),
    ] {
        assert!(graph[krate].contains(on), "{krate} uses {on}");
    }
    assert!(
        graph["dds-sys"].is_empty(),
        "dds-sys is below every other crate"
    );
}

/// Benchmark-only dependencies stay out of the daemon and the host library: in the crates they
/// link, such dependencies are optional (the `bench` feature turns them on for `dds-bench`).
#[test]
fn benchmark_dependencies_are_behind_a_feature() {
    let root = workspace();
    for krate in [
        "dds-dma",
        "dds-ring",
        "dds-proto",
        "dds-fs",
        "dds-cache",
        "dds-host",
        "dds-capi",
        "dds-dpu",
    ] {
        let manifest =
            std::fs::read_to_string(root.join("crates").join(krate).join("Cargo.toml")).unwrap();
        let mut section = String::new();
        for line in manifest.lines().map(str::trim) {
            if line.starts_with('[') {
                section = line.to_string();
                continue;
            }
            let normal = section == "[dependencies]" || section.ends_with(".dependencies]");
            let bench_only = ["hdrhistogram", "dashmap", "plotters", "indicatif"]
                .iter()
                .any(|d| line.starts_with(d));
            if normal && bench_only {
                assert!(
                    line.contains("optional = true"),
                    "{krate}: `{line}` must be optional (feature `bench`)"
                );
            }
        }
    }
}

/// The Rust files of module `module` of a crate: `src/<module>.rs` and every file under
/// `src/<module>/`.
fn module_files(krate: &str, module: &str) -> Vec<std::path::PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let src = workspace().join("crates").join(krate).join("src");
    let mut files = Vec::new();
    let file = src.join(format!("{module}.rs"));
    if file.exists() {
        files.push(file);
    }
    walk(&src.join(module), &mut files);
    files.sort();
    files
}

/// A source file without its comments (doc comments included): what the code names.
fn code_of(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether `code` names `name` as a whole identifier or path (`crate::host` does not match
/// `crate::hostname`).
fn names(code: &str, name: &str) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    code.match_indices(name).any(|(at, _)| {
        let before = code[..at].chars().next_back();
        let after = code[at + name.len()..].chars().next();
        !before.is_some_and(ident) && !after.is_some_and(ident)
    })
}

/// The crates that hold both halves keep them apart: their DPU-side modules reach host memory
/// only through the DMA engine, so no DPU-side file names host shared memory (`dds-shm` and its
/// `SharedRegion`), the crate's host-side types that wrap it, or its host-side modules. Each
/// forbidden type occurs on the host side, so the lists follow renames there.
#[test]
fn dpu_side_modules_do_not_name_host_shared_memory() {
    struct Split {
        krate: &'static str,
        /// DPU-side modules (below `src/`).
        dpu: &'static [&'static str],
        /// Host-side modules, each also forbidden as a path on the DPU side (`crate::host`).
        host: &'static [&'static str],
        /// Host shared memory and the host-side types over it.
        host_types: &'static [&'static str],
    }
    let splits = [
        Split {
            krate: "dds-objproxy",
            dpu: &["dpu", "fault"],
            host: &["host"],
            host_types: &["dds_shm", "SharedRegion", "Shm", "HostProxy"],
        },
        Split {
            krate: "dds-dpukv",
            dpu: &["dpu"],
            host: &["host", "host/worker"],
            host_types: &["dds_shm", "SharedRegion", "HostQueue"],
        },
    ];
    for s in &splits {
        let dpu: Vec<_> = s
            .dpu
            .iter()
            .flat_map(|m| module_files(s.krate, m))
            .collect();
        assert!(!dpu.is_empty(), "{}: DPU-side modules {:?}", s.krate, s.dpu);
        let mut forbidden: Vec<String> = s.host_types.iter().map(|t| t.to_string()).collect();
        let mut host_code = String::new();
        for m in s.host {
            let files = module_files(s.krate, m);
            assert!(!files.is_empty(), "{}: host-side module {m}", s.krate);
            host_code.extend(files.iter().map(|p| code_of(p)));
            // `host/worker` is reachable as `crate::host::worker` and, re-exported, `crate::worker`.
            let leaf = m.rsplit('/').next().unwrap();
            forbidden.push(format!("crate::{leaf}"));
        }
        for t in s.host_types {
            assert!(
                names(&host_code, t),
                "{}: `{t}` does not occur on the host side; update the list",
                s.krate
            );
        }
        for file in &dpu {
            let code = code_of(file);
            for name in &forbidden {
                assert!(
                    !names(&code, name),
                    "{} names `{name}`, host shared memory or the host side, on the DPU side",
                    file.display()
                );
            }
        }
    }
}
