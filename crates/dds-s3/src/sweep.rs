//! The orphan sweep (`docs/s3.md`, "Orphaned stripes"): the stripe objects of the pool that no
//! object record or part record refers to, older than the grace, are removed.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use dds_osd::OpError;
use thiserror::Error;

use crate::gateway::{absent, now_ns, Inner};
use crate::record::{
    self, index_shard_name, parse_stripe_name, parse_upload_key, parts_name, stripe_name,
    stripes_of, uploads_name, BadRecord, ObjectRecord, PartRecord, BUCKETS, STRIPE,
};

/// What one sweep found and did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sweep {
    /// Stripe objects in the pool.
    pub stripes: usize,
    /// Orphans removed.
    pub removed: usize,
    /// Orphans left because a stripe of their instance is younger than the grace.
    pub recent: usize,
}

/// Why a sweep stopped without removing anything more.
#[derive(Debug, Error)]
pub enum SweepError {
    #[error("object cluster: {0}")]
    Cluster(#[from] OpError),
    #[error("{0}")]
    Record(#[from] BadRecord),
}

fn bad(what: &'static str, why: &'static str) -> SweepError {
    SweepError::Record(BadRecord { what, why })
}

/// One sweep of the gateway's pool, removing the orphans older than `grace`.
pub(crate) fn sweep(i: &Inner, grace: Duration) -> Result<Sweep, SweepError> {
    let t0 = now_ns();
    let mut out = Sweep::default();
    // The stripe objects by instance: (part, stripe).
    let mut found: BTreeMap<u64, Vec<(u32, u64)>> = BTreeMap::new();
    for name in i.client.list(i.pool)? {
        if let Some((instance, part, stripe)) = parse_stripe_name(&name) {
            found.entry(instance).or_default().push((part, stripe));
            out.stripes += 1;
        }
    }
    // The stripes referenced: (instance, part) → stripe count (only the instances found).
    let mut covered: HashMap<(u64, u32), u64> = HashMap::new();
    let mut cover = |instance: u64, part: u32, stripes: u64| {
        if found.contains_key(&instance) {
            let n = covered.entry((instance, part)).or_default();
            *n = (*n).max(stripes);
        }
    };
    // Uploads (and their parts) before the indexes: see the documentation.
    let mut indexes = Vec::new();
    for (name, value) in i.omap_all(BUCKETS)? {
        let bucket = String::from_utf8(name).map_err(|_| bad("bucket", "name is not UTF-8"))?;
        let shards = record::decode_bucket(&value)?.shards;
        let mut uploads = Vec::new();
        i.omap_pages(&uploads_name(&bucket), |page| {
            for (k, _) in page {
                uploads.push(parse_upload_key(&k).ok_or(bad("upload", "malformed key"))?);
            }
            Ok::<(), SweepError>(())
        })?;
        for upload in uploads {
            i.omap_pages(&parts_name(upload), |page| {
                for (k, v) in page {
                    let n = <[u8; 4]>::try_from(k.as_slice())
                        .map_err(|_| bad("part", "malformed key"))?;
                    let p = PartRecord::decode(&v)?;
                    cover(upload, u32::from_be_bytes(n), stripes_of(p.size, STRIPE));
                }
                Ok::<(), SweepError>(())
            })?;
        }
        indexes.push((bucket, shards));
    }
    for (bucket, shards) in &indexes {
        for s in 0..*shards {
            i.omap_pages(&index_shard_name(bucket, *shards, s), |page| {
                for (_, v) in page {
                    let r = ObjectRecord::decode(&v)?;
                    for (p, size) in r.parts() {
                        cover(r.instance, p, stripes_of(size, r.stripe));
                    }
                }
                Ok::<(), SweepError>(())
            })?;
        }
    }
    let limit = t0.saturating_sub(grace.as_nanos().min(u128::from(u64::MAX)) as u64);
    for (instance, stripes) in found {
        let referenced = |&(p, j): &(u32, u64)| covered.get(&(instance, p)).is_some_and(|&n| j < n);
        let orphans: Vec<(u32, u64)> = stripes.iter().copied().filter(|s| !referenced(s)).collect();
        if orphans.is_empty() {
            continue;
        }
        let mut newest = 0u64;
        for &(p, j) in &stripes {
            if let Some(st) = absent(i.client.stat(&i.oid(stripe_name(instance, p, j))))? {
                newest = newest.max(st.mtime_ns);
            }
        }
        if newest >= limit {
            out.recent += orphans.len();
            continue;
        }
        for (p, j) in orphans {
            i.remove_quiet(&stripe_name(instance, p, j))?;
            out.removed += 1;
        }
    }
    Ok(out)
}

/// Sweeps now and then every `every` (forever; `every` zero: never), logging each sweep.
pub(crate) fn sweep_forever(i: &Inner, grace: Duration, every: Duration) {
    if every.is_zero() {
        return;
    }
    loop {
        match sweep(i, grace) {
            Ok(s) => tracing::info!(
                "s3 sweep: {} stripe objects, {} orphans removed, {} left (recent)",
                s.stripes,
                s.removed,
                s.recent
            ),
            Err(e) => tracing::warn!("s3 sweep stopped, nothing more removed: {e}"),
        }
        std::thread::sleep(every);
    }
}
