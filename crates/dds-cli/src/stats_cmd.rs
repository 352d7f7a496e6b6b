//! `dds stats`: what a running DPU is doing, like `redis-cli INFO`: its notification groups
//! (requests, errors, bytes), memory, DMA engine, space, and the offload engine (cache table,
//! cache writer, traffic directors, DPU CPU per request served on the DPU). With
//! `--pageserver ADDR`, a page server's instead: its log positions, retention horizon and the
//! storage its retained page versions use.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use dds_proto::units::fmt_bytes;

#[derive(Args, Debug)]
pub struct StatsArgs {
    /// Control socket of the DPU.
    #[arg(long, default_value_os_t = dds_host::default_socket_path(), env = "DDS_SOCKET")]
    socket: PathBuf,
    /// One JSON object instead of the sections.
    #[arg(long)]
    json: bool,
    /// A `dds pageserver`'s address: its statistics instead of the DPU's.
    #[arg(long)]
    pageserver: Option<std::net::SocketAddr>,
}

/// A page server's statistics (by a Watermark request).
fn pageserver(addr: std::net::SocketAddr, json: bool) -> Result<()> {
    let w = dds_pageserver::proto::Watermark::query(addr)
        .with_context(|| format!("ask the page server at {addr}"))?;
    if json {
        let v = serde_json::json!({ "pageserver": {
            "applied_lsn": w.applied,
            "durable_lsn": w.durable,
            "horizon": w.horizon,
            "retained_versions": w.versions,
            "retained_bytes": w.bytes,
            "bytes_per_retained_version": w.bytes_per_version(),
        }});
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!("# pageserver");
    println!(
        "log: applied LSN {}, durable LSN {}, retention horizon {}",
        w.applied, w.durable, w.horizon
    );
    println!(
        "retained: {} versions in {} ({:.0} bytes per version)",
        w.versions,
        fmt_bytes(w.bytes),
        w.bytes_per_version()
    );
    Ok(())
}

pub fn run(a: StatsArgs) -> Result<()> {
    if let Some(addr) = a.pageserver {
        return pageserver(addr, a.json);
    }
    let dds = crate::util::connect_dpu(&a.socket)?;
    let s = dds.stats().context("read the DPU's statistics")?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
        return Ok(());
    }
    println!("# memory");
    println!(
        "groups_memory: {} of {}",
        fmt_bytes(s.memory_used_bytes),
        fmt_bytes(s.memory_budget_bytes)
    );
    println!("\n# space");
    println!(
        "free: {} of {}",
        fmt_bytes(s.space.free_bytes),
        fmt_bytes(s.space.total_bytes)
    );
    println!("files: {}  dirs: {}", s.space.files, s.space.dirs);
    // The DMA engine is the DPU's: its reads move data from the host, its writes to it.
    println!("\n# dma");
    println!(
        "host→DPU: {} in {} transfers (requests, data written to files)",
        fmt_bytes(s.dma.bytes_read),
        s.dma.reads
    );
    println!(
        "DPU→host: {} in {} transfers (responses, data read from files)",
        fmt_bytes(s.dma.bytes_written),
        s.dma.writes
    );
    println!("doorbells: {}", s.dma.doorbells);
    if s.dma.execute_ns > 0 {
        println!(
            "engine time: {:.3} s (the emulated engine's copies, on the service thread)",
            s.dma.execute_ns as f64 / 1e9
        );
    }
    println!("\n# groups ({})", s.groups.len());
    for g in &s.groups {
        println!(
            "group {}: host connection {}, requests {}, errors {}, file data read {}, written {}, outstanding {}{}{}",
            g.group,
            g.conn,
            g.requests,
            g.errors,
            fmt_bytes(g.bytes_read),
            fmt_bytes(g.bytes_written),
            g.outstanding,
            if g.broken { ", BROKEN (corrupt ring)" } else { "" },
            if g.closing { ", closing" } else { "" },
        );
    }
    println!("\n# offload");
    match &s.offload {
        None => println!("engine: none (start the DPU with --offload to serve reads on it)"),
        Some(o) => {
            let live = o["cache"]["live"].as_u64().unwrap_or(0);
            let cap = o["cache_capacity"].as_u64().unwrap_or(0);
            println!("app: {}", o["app"].as_str().unwrap_or("?"));
            println!(
                "cache: {live} items of {cap} slots ({:.1}% full)",
                100.0 * live as f64 / cap.max(1) as f64
            );
            println!("cache_writer: {}", o["cache_writer"]);
            let c = &o["cpu"];
            let us = |k: &str| {
                c[k].as_f64()
                    .map_or("-".to_string(), |v| format!("{v:.1} µs"))
            };
            let director = if c["director_inline"] == true {
                "the director on the file-service thread".to_string()
            } else {
                format!(
                    "{} in the directors' threads",
                    us("director_cpu_us_per_request")
                )
            };
            println!(
                "cpu: {} per {} served on the DPU ({director}); {} requests, {:.3} s of DPU CPU in the {:.1} s since the last stats",
                us("dpu_cpu_us_per_request"),
                c["request"].as_str().unwrap_or("request"),
                c["offloaded"].as_u64().unwrap_or(0),
                c["process_cpu_seconds"].as_f64().unwrap_or(0.0),
                c["window_seconds"].as_f64().unwrap_or(0.0),
            );
            for (i, d) in o["directors"].as_array().into_iter().flatten().enumerate() {
                println!("director {i}: {d}");
            }
        }
    }
    Ok(())
}
