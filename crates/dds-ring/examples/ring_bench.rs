//! Fig. 16 ring benchmark from the command line (release mode):
//!
//! ```text
//! cargo run -p dds-ring --release --example ring_bench -- [producers] [msgs_per_producer] [msg_bytes] [cost|nocost] [designs...]
//! ```
//!
//! Prints one JSON line per design. Environment: `RING_BYTES` (ring size), `CONSUMER_NICE`
//! (nice value of the consumer thread; normal priority if unset or not a number).

use dds_dma::CostModel;
use dds_ring::bench::{self, BenchConfig, Design};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let producers = args.first().map_or(64, |s| s.parse().expect("producers"));
    let msgs = args
        .get(1)
        .map_or(200_000, |s| s.parse().expect("msgs_per_producer"));
    let msg_bytes = args.get(2).map_or(8, |s| s.parse().expect("msg_bytes"));
    let cost = match args.get(3).map(String::as_str) {
        None | Some("cost") => Some(CostModel::bluefield2()),
        Some("nocost") => None,
        Some(other) => panic!("cost or nocost, not {other:?}"),
    };
    let designs: Vec<Design> = if args.len() > 4 {
        args[4..]
            .iter()
            .map(|s| s.parse().expect("design"))
            .collect()
    } else {
        Design::ALL.to_vec()
    };
    for design in designs {
        let mut cfg = BenchConfig::new(design, producers, msgs, msg_bytes, cost);
        if let Ok(b) = std::env::var("RING_BYTES") {
            cfg.ring_bytes = b.parse().expect("RING_BYTES");
        }
        // CONSUMER_NICE=-15 (for example) raises the consumer thread's priority.
        if let Ok(n) = std::env::var("CONSUMER_NICE") {
            cfg.consumer_nice = n.parse().ok();
        }
        // FaRM-style moves two DMA operations per message: fewer messages keep the run short.
        if design == Design::FarmStyle && cost.is_some() {
            cfg.msgs_per_producer = (msgs / 20).max(1);
        }
        let point = bench::run_config(&cfg);
        println!("{}", serde_json::to_string(&point).expect("json"));
    }
}
