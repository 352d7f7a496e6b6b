//! The ring and cache-table benchmarks on tiny sizes: their JSON results hold the documented
//! summary keys with positive figures, and the plots are written.

use dds_bench::cache_table::CacheOptions;
use dds_bench::report::Report;
use dds_bench::ring::RingOptions;
use serde_json::Value;

fn out_dir(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("dds-bench-test-{name}-{}", std::process::id()))
}

/// Writes the report, reads the JSON back, and checks the common fields and targets.
fn written_json(report: &Report, name: &str) -> Value {
    let dir = out_dir(name);
    let written = report.write(&dir).expect("write results");
    assert!(written.iter().all(|p| p.exists()));
    assert!(written
        .iter()
        .any(|p| p.extension().is_some_and(|e| e == "png")));
    let json: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join(format!("{name}.json"))).expect("JSON written"),
    )
    .expect("valid JSON");
    std::fs::remove_dir_all(&dir).expect("clean up");
    assert_eq!(json["benchmark"], name);
    assert!(json["machine"]["nproc"].as_u64().unwrap() >= 1);
    assert!(!json["machine"]["cpu_model"].as_str().unwrap().is_empty());
    assert!(json["dpu_emulation"].as_str().unwrap().contains("emulated"));
    assert!(!json["points"].as_array().unwrap().is_empty());
    for t in json["summary"]["targets"].as_array().expect("targets") {
        assert!(t["measured"].as_f64().unwrap() > 0.0, "{t}");
        assert!(t["goal"].as_f64().unwrap() > 0.0, "{t}");
        assert!(t["met"].is_boolean());
    }
    assert!(report.render().contains("Targets"));
    json
}

fn positive(v: &Value, key: &str) -> f64 {
    let x = v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("summary key {key} missing in {v}"));
    assert!(x > 0.0 && x.is_finite(), "{key} = {x}");
    x
}

#[test]
fn ring_summary_has_documented_keys() {
    let opts = RingOptions {
        producers: vec![1, 3],
        seconds_per_point: 0.002,
        min_messages: 512,
        max_messages: 4_096,
        ring_bytes: 64 << 10,
        trials: 1,
        quiet: true,
        ..RingOptions::quick()
    };
    let report = dds_bench::ring::run(&opts).expect("ring benchmark");
    let json = written_json(&report, "ring");
    let s = &json["summary"];
    assert_eq!(s["producers"], 3);
    for model in ["cost_model_on", "cost_model_off"] {
        let m = &s[model];
        for design in [
            "progress",
            "farm_style",
            "lock_based",
            "crossbeam_array_queue",
        ] {
            positive(m, &format!("{design}_msgs_per_sec"));
            positive(m, &format!("{design}_median_latency_ns"));
            positive(m, &format!("{design}_cpu_ns_per_msg"));
        }
        for r in [
            "progress_over_lock_based",
            "progress_over_farm_style",
            "progress_over_array_queue",
        ] {
            positive(m, r);
        }
    }
    assert_eq!(s["targets"].as_array().unwrap().len(), 4);
    // 2 producer counts × 4 designs × 2 cost-model settings.
    assert_eq!(json["points"].as_array().unwrap().len(), 16);
}

#[test]
fn cache_table_summary_has_documented_keys() {
    let opts = CacheOptions {
        items: vec![4 << 10],
        readers: vec![1, 2],
        lookups_per_reader: 20_000,
        trials: 1,
        quiet: true,
        ..CacheOptions::quick()
    };
    let report = dds_bench::cache_table::run(&opts);
    let json = written_json(&report, "cache-table");
    let s = &json["summary"]["by_items"]["4K"];
    for kind in ["cuckoo", "dashmap", "rwlock_hashmap"] {
        positive(s, &format!("{kind}_inserts_per_sec"));
        positive(s, &format!("{kind}_peak_lookups_per_sec"));
        positive(s, &format!("{kind}_lookups_per_sec_at_ratio_readers"));
        positive(s, &format!("{kind}_cpu_ns_per_lookup"));
        positive(s, &format!("{kind}_memory_bytes"));
    }
    positive(s, "cuckoo_over_dashmap_lookups");
    positive(s, "cuckoo_over_rwlock_lookups");
    assert_eq!(json["summary"]["targets"].as_array().unwrap().len(), 3);
    assert_eq!(json["points"].as_array().unwrap().len(), 6);
}
