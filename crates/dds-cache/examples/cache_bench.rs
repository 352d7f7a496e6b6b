//! Measure the cache table against the baselines and print one JSON line per point.
//!
//! ```text
//! cargo run --release -p dds-cache --example cache_bench -- [items...] [--readers N] [--lookups N]
//! ```

use dds_cache::bench::{run, TableKind};

fn main() {
    let mut items = Vec::new();
    let mut readers = 2usize;
    let mut lookups = 10_000_000usize;
    let mut kinds = TableKind::ALL.to_vec();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--readers" => {
                readers = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--readers N")
            }
            "--lookups" => {
                lookups = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--lookups N")
            }
            "--kind" => {
                let k = args.next().expect("--kind NAME");
                kinds = TableKind::ALL
                    .into_iter()
                    .filter(|t| t.name() == k)
                    .collect();
                assert!(!kinds.is_empty(), "unknown kind {k}");
            }
            n => items.push(n.parse::<usize>().expect("item count")),
        }
    }
    if items.is_empty() {
        items = vec![1 << 20, 1 << 24];
    }
    for &n in &items {
        for &kind in &kinds {
            let p = run(kind, n, readers, lookups);
            println!("{}", serde_json::to_string(&p).expect("serializable"));
        }
    }
}
