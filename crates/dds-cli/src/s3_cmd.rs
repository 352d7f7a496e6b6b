//! `dds s3`: the S3 gateway on a cluster of `dds osd` daemons (docs/s3.md).

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{anyhow, Context, Result};
use clap::Args;

#[derive(Args, Debug)]
pub struct S3Args {
    /// Cluster map file (TOML).
    #[arg(long, default_value = "cluster.toml")]
    map: PathBuf,
    /// etcd endpoint holding the map (instead of --map).
    #[arg(long, requires = "cluster")]
    etcd: Option<String>,
    /// Cluster name in etcd.
    #[arg(long)]
    cluster: Option<String>,
    /// Pool id or name holding the buckets, objects and their index.
    #[arg(long, default_value = "data")]
    pool: String,
    /// Address to serve S3 on (port 0: any free port; the ready line says which).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// The access key clients sign with (SigV4).
    #[arg(long, env = "DDS_S3_ACCESS_KEY")]
    access_key: String,
    /// The secret of the access key.
    #[arg(long, env = "DDS_S3_SECRET_KEY", hide_env_values = true)]
    secret_key: String,
    /// Threads serving requests (0: one per core).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Request bodies gathered into 4 MiB stripes at once; further writes wait (bounds the
    /// gateway's buffer memory).
    #[arg(long, default_value_t = 64)]
    stripe_buffers: usize,
    /// Connections served at once; further clients wait in the listen backlog.
    #[arg(long, default_value_t = 1024)]
    max_connections: usize,
    /// Orphaned stripes (of writes that never completed) younger than this many seconds are
    /// left alone by the sweep; a write stalled for half of it between two stripes fails
    /// (at least 2).
    #[arg(long, default_value_t = 3600, value_parser = clap::value_parser!(u64).range(2..))]
    orphan_grace: u64,
    /// Seconds between two sweeps of orphaned stripes, the first at start (0: no sweeps).
    #[arg(long, default_value_t = 3600)]
    sweep_interval: u64,
    /// Options from a TOML file (keys are the long option names); the command line wins.
    #[arg(long)]
    config: Option<PathBuf>,
}

pub fn run(a: S3Args) -> Result<()> {
    let client = crate::osd_cmd::cluster_client(&a.map, a.etcd.as_deref(), a.cluster.as_deref())?;
    let pool = client
        .map()
        .find_pool(&a.pool)
        .ok_or_else(|| anyhow!("no pool {} in the map", a.pool))?
        .id;
    let listener =
        dds_server::bind_listener(a.listen).with_context(|| format!("bind {}", a.listen))?;
    let cfg = dds_s3::Config {
        pool,
        access_key: a.access_key,
        secret_key: a.secret_key,
        threads: a.threads,
        stripe_buffers: a.stripe_buffers,
        max_connections: a.max_connections,
        orphan_grace: std::time::Duration::from_secs(a.orphan_grace),
        sweep_interval: std::time::Duration::from_secs(a.sweep_interval),
    };
    dds_s3::serve(client, listener, cfg, |addr| {
        println!(
            "s3 ready: listening on {addr} (pool {pool}, stripe {} bytes)",
            dds_s3::record::STRIPE
        );
    })
    .context("s3 gateway")
}
