//! The `S3` trait of `s3s` on the object cluster (`docs/s3.md`, "Operations on these objects").

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use dds_objstore::{KvPairs, ObjectId};
use dds_osd::client::{is_unreachable, Client};
use dds_osd::{OpError, Status};
use futures_util::StreamExt;
use md5::{Digest, Md5};
use s3s::dto::*;
use s3s::{s3_error, S3Error, S3Request, S3Response, S3Result, S3};

use crate::record::{
    self, index_name, index_shard_name, parts_name, stripe_name, stripes_of, upload_key,
    uploads_name, BucketRecord, ObjectRecord, PartRecord, Run, UploadRecord, BUCKETS, MAX_RECORD,
    STRIPE,
};

/// Smallest part of a multipart upload other than the last (S3's limit).
const MIN_PART: u64 = 5 << 20;
/// Longest object key S3 allows.
const MAX_KEY: usize = 1024;
/// Entries asked for per `OMAP_LIST`.
const PAGE: u32 = 1000;

/// The gateway: S3 operations on one pool of a cluster.
#[derive(Clone)]
pub struct Gateway {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) client: Client,
    pub(crate) pool: u64,
    /// The orphan sweep's grace: a write under a new instance stops once half of it passed
    /// since its previous stripe write ([`Fresh`]).
    grace: Duration,
    /// One permit per stripe buffer a request may hold while its body streams in.
    buffers: tokio::sync::Semaphore,
    /// Stripe buffers of finished requests, reused by the next ones.
    spare: std::sync::Mutex<Vec<Vec<u8>>>,
    /// Index shards of the buckets used so far (a bucket's count never changes while it
    /// exists; a lookup that misses reads the bucket record again).
    shards: std::sync::Mutex<std::collections::HashMap<String, u16>>,
}

/// An S3 error for a cluster error: the cluster not answering is 503, anything else 500.
fn cluster(e: OpError) -> S3Error {
    tracing::warn!("s3: object cluster: {e}");
    let busy = matches!(
        e.status,
        Status::PgInactive | Status::BelowMinSize | Status::Busy | Status::NoSpace
    );
    if busy || is_unreachable(&e) {
        s3_error!(ServiceUnavailable, "object cluster: {e}")
    } else {
        s3_error!(InternalError, "object cluster: {e}")
    }
}

fn bad_record(e: record::BadRecord) -> S3Error {
    s3_error!(InternalError, "{e}")
}

/// A part's omap entry: its number (u32 big-endian key) and record.
fn part_entry(k: &[u8], v: &[u8]) -> S3Result<(u32, PartRecord)> {
    let n = <[u8; 4]>::try_from(k).map_err(|_| s3_error!(InternalError, "bad part key"))?;
    Ok((
        u32::from_be_bytes(n),
        PartRecord::decode(v).map_err(bad_record)?,
    ))
}

/// The bucket and key a copy reads.
fn copy_source(c: CopySource) -> S3Result<(String, String)> {
    match c {
        CopySource::Bucket { bucket, key, .. } => Ok((bucket.into(), key.into())),
        _ => Err(s3_error!(NotImplemented, "copies from access points")),
    }
}

/// A part number, 1 ..= 10000.
fn part_number(n: i32) -> S3Result<u32> {
    u32::try_from(n)
        .ok()
        .filter(|p| (1..=10000).contains(p))
        .ok_or_else(|| s3_error!(InvalidArgument, "a part number is 1 ..= 10000"))
}

/// The bytes `x-amz-copy-source-range: bytes=FIRST-LAST` names in an object of `size` bytes.
fn copy_range_of(text: &str, size: u64) -> S3Result<(u64, u64)> {
    let bad = || s3_error!(InvalidArgument, "bad copy source range {text:?}");
    let (first, last) = text
        .strip_prefix("bytes=")
        .and_then(|r| r.split_once('-'))
        .ok_or_else(bad)?;
    let first: u64 = first.parse().map_err(|_| bad())?;
    let last: u64 = last.parse().map_err(|_| bad())?;
    if first > last || last >= size {
        return Err(s3_error!(
            InvalidRange,
            "copy source range {text:?} of an object of {size} bytes"
        ));
    }
    Ok((first, last + 1))
}

/// BadDigest unless `digest` is the body's MD5 a Content-MD5 header (base64) announced.
fn check_md5(content_md5: Option<&str>, digest: &[u8; 16]) -> S3Result<()> {
    let Some(want) = content_md5 else {
        return Ok(());
    };
    use base64::Engine;
    match base64::engine::general_purpose::STANDARD.decode(want.trim()) {
        Ok(w) if w == digest => Ok(()),
        Ok(_) => Err(s3_error!(
            BadDigest,
            "the body's MD5 is not its Content-MD5"
        )),
        Err(_) => Err(s3_error!(InvalidDigest, "Content-MD5 is not base64")),
    }
}

/// `Ok(None)` for a cluster object that does not exist.
pub(crate) fn absent<T>(r: Result<T, OpError>) -> Result<Option<T>, OpError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.status == Status::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

pub(crate) fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

fn timestamp(ns: u64) -> Timestamp {
    Timestamp::from(SystemTime::UNIX_EPOCH + Duration::from_nanos(ns))
}

/// A random instance or upload id (never 0).
fn random_id() -> u64 {
    rand::random::<u64>().max(1)
}

fn etag(text: String) -> ETag {
    ETag::Strong(text)
}

/// User metadata in a stable order (the record's).
fn sorted_meta(meta: Option<Metadata>) -> Vec<(String, String)> {
    let mut m: Vec<_> = meta.unwrap_or_default().into_iter().collect();
    m.sort();
    m
}

fn meta_map(meta: Vec<(String, String)>) -> Option<Metadata> {
    (!meta.is_empty()).then(|| meta.into_iter().collect())
}

/// A record's Content-Type as S3 answers it (none when empty).
fn content_type(text: String) -> Option<String> {
    (!text.is_empty()).then_some(text)
}

fn check_key(key: &str) -> S3Result<()> {
    if key.is_empty() || key.len() > MAX_KEY {
        return Err(s3_error!(
            KeyTooLongError,
            "a key is 1 ..= 1024 bytes, not {}",
            key.len()
        ));
    }
    Ok(())
}

/// The exclusive `OMAP_LIST` start that lists from `prefix` on: no UTF-8 key lies between it
/// and `prefix` (`docs/s3.md`, ListObjectsV2).
fn before(prefix: &[u8]) -> Option<Vec<u8>> {
    let (&last, head) = prefix.split_last()?;
    let mut s = head.to_vec();
    if last != 0 {
        s.push(last - 1);
        s.push(0xff);
    }
    Some(s)
}

/// The writer's side of the orphan sweep (`docs/s3.md`, "Orphaned stripes"): a write of
/// stripes under a new instance goes on only while less than half the sweep's grace passed
/// since it sent its previous stripe write, so a sweep never takes the stripes of a write that
/// may still make them referenced.
struct Fresh {
    /// When the previous stripe write was sent (`None`: none yet).
    last: Option<Instant>,
    limit: Duration,
}

impl Fresh {
    fn new(grace: Duration) -> Fresh {
        Fresh {
            last: None,
            limit: grace / 2,
        }
    }

    /// Before the record that makes the stripes referenced is written.
    fn check(&self) -> S3Result<()> {
        match self.last {
            Some(t) if t.elapsed() > self.limit => Err(s3_error!(
                RequestTimeout,
                "the write stalled for more than {} s between two stripes",
                self.limit.as_secs()
            )),
            _ => Ok(()),
        }
    }

    /// Before a stripe write is sent.
    fn stripe(&mut self) -> S3Result<()> {
        self.check()?;
        self.last = Some(Instant::now());
        Ok(())
    }
}

impl Inner {
    pub(crate) fn oid(&self, name: impl Into<Vec<u8>>) -> ObjectId {
        ObjectId::new(self.pool, name)
    }

    fn omap_get1(&self, obj: &[u8], key: &[u8]) -> Result<Option<Vec<u8>>, OpError> {
        let got = absent(self.client.omap_get(&self.oid(obj), &[key.to_vec()]))?;
        Ok(got.and_then(|mut v| v.pop().flatten()))
    }

    fn omap_page(&self, obj: &[u8], after: Option<&[u8]>, max: u32) -> Result<KvPairs, OpError> {
        Ok(absent(self.client.omap_list(&self.oid(obj), after, max))?.unwrap_or_default())
    }

    /// Every entry of an omap, given to `f` a page at a time.
    pub(crate) fn omap_pages<E: From<OpError>>(
        &self,
        obj: &[u8],
        mut f: impl FnMut(KvPairs) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut after: Option<Vec<u8>> = None;
        loop {
            let page = self.omap_page(obj, after.as_deref(), PAGE)?;
            let full = page.len() >= PAGE as usize;
            after = page.last().map(|e| e.0.clone());
            f(page)?;
            if !full {
                return Ok(());
            }
        }
    }

    /// Every entry of an omap, read in pages.
    pub(crate) fn omap_all(&self, obj: &[u8]) -> Result<KvPairs, OpError> {
        let mut out: KvPairs = Vec::new();
        self.omap_pages(obj, |page| {
            out.extend(page);
            Ok::<(), OpError>(())
        })?;
        Ok(out)
    }

    pub(crate) fn remove_quiet(&self, name: &[u8]) -> Result<(), OpError> {
        absent(self.client.remove(&self.oid(name))).map(drop)
    }

    fn shard_cache(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, u16>> {
        self.shards.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads the bucket's record: `NoSuchBucket` without one; its index shards.
    fn bucket_exists(&self, bucket: &str) -> S3Result<u16> {
        match self
            .omap_get1(BUCKETS, bucket.as_bytes())
            .map_err(cluster)?
        {
            Some(v) => {
                let shards = record::decode_bucket(&v).map_err(bad_record)?.shards;
                self.shard_cache().insert(bucket.to_string(), shards);
                Ok(shards)
            }
            None => {
                self.shard_cache().remove(bucket);
                Err(s3_error!(NoSuchBucket, "no bucket {bucket}"))
            }
        }
    }

    /// The bucket's index shards, known or read from its record.
    fn shards_of(&self, bucket: &str) -> S3Result<u16> {
        let known = self.shard_cache().get(bucket).copied();
        match known {
            Some(n) => Ok(n),
            None => self.bucket_exists(bucket),
        }
    }

    fn record_in(&self, bucket: &str, shards: u16, key: &str) -> S3Result<Option<ObjectRecord>> {
        let v = self
            .omap_get1(&index_name(bucket, shards, key.as_bytes()), key.as_bytes())
            .map_err(cluster)?;
        v.map(|b| ObjectRecord::decode(&b).map_err(bad_record))
            .transpose()
    }

    fn record(&self, bucket: &str, key: &str) -> S3Result<Option<ObjectRecord>> {
        self.record_in(bucket, self.shards_of(bucket)?, key)
    }

    /// The record of an existing object (in an existing bucket).
    fn existing(&self, bucket: &str, key: &str) -> S3Result<ObjectRecord> {
        let known = self.shards_of(bucket)?;
        if let Some(r) = self.record_in(bucket, known, key)? {
            return Ok(r);
        }
        // The bucket may be gone, or made again (through another gateway) with other shards.
        let shards = self.bucket_exists(bucket)?;
        if shards != known {
            if let Some(r) = self.record_in(bucket, shards, key)? {
                return Ok(r);
            }
        }
        Err(s3_error!(NoSuchKey, "no key {key} in bucket {bucket}"))
    }

    /// Makes `rec` the object `key` of `bucket`; returns the record it replaced.
    fn publish(
        &self,
        bucket: &str,
        key: &str,
        rec: &ObjectRecord,
    ) -> S3Result<Option<ObjectRecord>> {
        let old = self.record(bucket, key).ok().flatten();
        self.set_record(bucket, key, rec)?;
        Ok(old)
    }

    /// Sets the index entry of `key` to `rec`.
    fn set_record(&self, bucket: &str, key: &str, rec: &ObjectRecord) -> S3Result<()> {
        let value = rec.encode();
        if value.len() > MAX_RECORD {
            return Err(s3_error!(
                MetadataTooLarge,
                "the object's record is {} bytes, above {MAX_RECORD}",
                value.len()
            ));
        }
        let shards = self.shards_of(bucket)?;
        self.client
            .omap_set(
                &self.oid(index_name(bucket, shards, key.as_bytes())),
                &[(key.as_bytes().to_vec(), value)],
            )
            .map_err(cluster)?;
        Ok(())
    }

    /// Removes the stripes of an object that is no longer referenced.
    fn remove_data(&self, rec: &ObjectRecord) -> S3Result<()> {
        for (p, j) in rec.stripes() {
            self.remove_quiet(&stripe_name(rec.instance, p, j))
                .map_err(cluster)?;
        }
        Ok(())
    }

    fn upload(&self, bucket: &str, key: &str, upload_id: &str) -> S3Result<(u64, UploadRecord)> {
        let no = || s3_error!(NoSuchUpload, "no upload {upload_id} of {key} in {bucket}");
        let upload = record::parse_upload_id(upload_id).ok_or_else(no)?;
        let v = self
            .omap_get1(&uploads_name(bucket), &upload_key(key, upload))
            .map_err(cluster)?
            .ok_or_else(no)?;
        Ok((upload, UploadRecord::decode(&v).map_err(bad_record)?))
    }

    fn parts(&self, upload: u64) -> S3Result<Vec<(u32, PartRecord)>> {
        self.omap_all(&parts_name(upload))
            .map_err(cluster)?
            .into_iter()
            .map(|(k, v)| part_entry(&k, &v))
            .collect()
    }

    /// Records part `part` of `upload` as `rec`; removes the stripes of the part it replaced
    /// (`old`, its record) beyond the new size.
    fn finish_part(
        &self,
        upload: u64,
        part: u32,
        rec: &PartRecord,
        old: Option<Vec<u8>>,
        fresh: &Fresh,
    ) -> S3Result<()> {
        fresh.check()?;
        self.client
            .omap_set(
                &self.oid(parts_name(upload)),
                &[(part.to_be_bytes().to_vec(), rec.encode())],
            )
            .map_err(cluster)?;
        let old = old.and_then(|v| PartRecord::decode(&v).ok());
        for j in stripes_of(rec.size, STRIPE)..old.map_or(0, |o| stripes_of(o.size, STRIPE)) {
            self.remove_quiet(&stripe_name(upload, part, j))
                .map_err(cluster)?;
        }
        Ok(())
    }

    /// Copies bytes `start..end` of `src` into the stripes of part `part` of `upload`, one
    /// stripe in memory; returns their MD5. Stripes written before a failure are removed.
    fn copy_range(
        &self,
        src: &ObjectRecord,
        start: u64,
        end: u64,
        upload: u64,
        part: u32,
        fresh: &mut Fresh,
    ) -> S3Result<[u8; 16]> {
        let mut md5 = Md5::new();
        let mut buf: Vec<u8> = Vec::new();
        let mut stripes = 0u64;
        let mut flush = |buf: &mut Vec<u8>, stripes: &mut u64| -> S3Result<()> {
            fresh.stripe()?;
            let name = stripe_name(upload, part, *stripes);
            self.client
                .write_full(&self.oid(name), buf)
                .map_err(cluster)?;
            buf.clear();
            *stripes += 1;
            Ok(())
        };
        let r = src
            .pieces(start, end)
            .into_iter()
            .try_for_each(|(p, j, off, len)| {
                let oid = self.oid(stripe_name(src.instance, p, j));
                let data = self.client.read(&oid, off, len).map_err(cluster)?;
                if data.len() as u64 != len {
                    return Err(s3_error!(InternalError, "stripe {j} of part {p} is short"));
                }
                md5.update(&data);
                let mut rest = &data[..];
                while !rest.is_empty() {
                    let take = (STRIPE as usize - buf.len()).min(rest.len());
                    buf.extend_from_slice(&rest[..take]);
                    rest = &rest[take..];
                    if buf.len() == STRIPE as usize {
                        flush(&mut buf, &mut stripes)?;
                    }
                }
                Ok(())
            });
        let r = r.and_then(|()| match buf.is_empty() {
            true => Ok(()),
            false => flush(&mut buf, &mut stripes),
        });
        if let Err(e) = r {
            for j in 0..=stripes {
                let _ = self.remove_quiet(&stripe_name(upload, part, j));
            }
            return Err(e);
        }
        Ok(md5.finalize().into())
    }

    /// Removes an upload's parts (all but `keep`), its parts object and its entry.
    fn drop_upload(&self, bucket: &str, key: &str, upload: u64, keep: &[u32]) -> S3Result<()> {
        for (n, p) in self.parts(upload)? {
            if keep.contains(&n) {
                continue;
            }
            for j in 0..stripes_of(p.size, STRIPE) {
                self.remove_quiet(&stripe_name(upload, n, j))
                    .map_err(cluster)?;
            }
        }
        self.remove_quiet(&parts_name(upload)).map_err(cluster)?;
        let rm = self
            .client
            .omap_rm(&self.oid(uploads_name(bucket)), &[upload_key(key, upload)]);
        absent(rm).map(drop).map_err(cluster)
    }
}

impl Gateway {
    /// A gateway storing in pool `pool` of the cluster `client` reaches, with at most
    /// `stripe_buffers` request bodies being gathered into stripes at once (the others wait).
    /// `grace` is the orphan sweep's (`docs/s3.md`, "Orphaned stripes").
    pub fn new(client: Client, pool: u64, stripe_buffers: usize, grace: Duration) -> Gateway {
        let stripe_buffers = stripe_buffers.max(1);
        Gateway {
            inner: Arc::new(Inner {
                client,
                pool,
                grace,
                buffers: tokio::sync::Semaphore::new(stripe_buffers),
                spare: std::sync::Mutex::new(Vec::with_capacity(stripe_buffers)),
                shards: std::sync::Mutex::new(std::collections::HashMap::new()),
            }),
        }
    }

    /// One sweep of the pool's orphaned stripes (`docs/s3.md`, "Orphaned stripes").
    pub fn sweep(&self) -> Result<crate::sweep::Sweep, crate::sweep::SweepError> {
        crate::sweep::sweep(&self.inner, self.inner.grace)
    }

    /// Sweeps now and then every `every` on a thread of its own (`every` zero: never).
    pub fn sweep_every(&self, every: Duration) -> std::io::Result<()> {
        let inner = self.inner.clone();
        std::thread::Builder::new()
            .name("s3-sweep".into())
            .spawn(move || crate::sweep::sweep_forever(&inner, inner.grace, every))
            .map(drop)
    }

    /// Runs `f` on the blocking pool (the cluster client is synchronous).
    async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Inner) -> S3Result<T> + Send + 'static,
    ) -> S3Result<T> {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || f(&inner))
            .await
            .map_err(|e| s3_error!(InternalError, "gateway task: {e}"))?
    }

    /// Waits for one of the gateway's stripe buffers (a permit to hold one).
    async fn stripe_buffer(&self) -> S3Result<tokio::sync::SemaphorePermit<'_>> {
        self.inner
            .buffers
            .acquire()
            .await
            .map_err(|_| s3_error!(InternalError, "the gateway is stopping"))
    }

    /// Writes a body as the stripes of part `part` of `instance`, one stripe in memory at a
    /// time; returns its size and MD5. Stripes written before a failure are removed.
    async fn write_body(
        &self,
        instance: u64,
        part: u32,
        body: Option<StreamingBlob>,
        content_md5: Option<String>,
    ) -> S3Result<(u64, [u8; 16], Fresh)> {
        let mut md5 = Md5::new();
        let mut fresh = Fresh::new(self.inner.grace);
        let (mut size, mut stripes) = (0u64, 0u64);
        let mut digest = [0u8; 16];
        let r = async {
            let mut body = body.unwrap_or_else(|| {
                StreamingBlob::wrap(futures_util::stream::empty::<Result<Bytes, std::io::Error>>())
            });
            // One of the gateway's stripe buffers: it grows from the bytes that arrive, up to
            // one stripe, and goes back to the spares at the end.
            let _permit = self.stripe_buffer().await?;
            let spare = self.inner.spare.lock().map(|mut s| s.pop()).ok().flatten();
            let mut buf: Vec<u8> = spare.unwrap_or_default();
            loop {
                let chunk =
                    body.next().await.transpose().map_err(|e| {
                        s3_error!(IncompleteBody, "the request body ended early: {e}")
                    })?;
                let last = chunk.is_none();
                let chunk = chunk.unwrap_or_default();
                md5.update(&chunk);
                size += chunk.len() as u64;
                let mut rest = &chunk[..];
                while !rest.is_empty() || (last && !buf.is_empty()) {
                    let take = (STRIPE as usize - buf.len()).min(rest.len());
                    buf.extend_from_slice(&rest[..take]);
                    rest = &rest[take..];
                    if buf.len() == STRIPE as usize || (last && rest.is_empty()) {
                        fresh.stripe()?;
                        let stripe = stripes;
                        buf = self
                            .run(move |i| {
                                let name = stripe_name(instance, part, stripe);
                                i.client.write_full(&i.oid(name), &buf).map_err(cluster)?;
                                let mut buf = buf;
                                buf.clear();
                                Ok(buf)
                            })
                            .await?;
                        stripes += 1;
                    }
                }
                if last {
                    break;
                }
            }
            if let Ok(mut spare) = self.inner.spare.lock() {
                spare.push(buf);
            }
            digest = md5.finalize().into();
            check_md5(content_md5.as_deref(), &digest)
        }
        .await;
        if let Err(e) = r {
            let _ = self
                .run(move |i| {
                    for j in 0..=stripes {
                        let _ = i.remove_quiet(&stripe_name(instance, part, j));
                    }
                    Ok(())
                })
                .await;
            return Err(e);
        }
        Ok((size, digest, fresh))
    }

    /// One page of a bucket's listing (ListObjects, ListObjectsV2).
    async fn list_page(
        &self,
        bucket: &str,
        prefix: &Option<String>,
        delimiter: &Option<String>,
        max_keys: Option<i32>,
        after: Option<Vec<u8>>,
    ) -> S3Result<ListPage> {
        let q = ListQuery {
            prefix: prefix.clone().unwrap_or_default(),
            delimiter: delimiter.clone().filter(|d| !d.is_empty()),
            max_keys: max_keys.unwrap_or(1000).clamp(0, 1000) as usize,
            after,
        };
        let bucket = bucket.to_string();
        self.run(move |i| list(i, &bucket, &q)).await
    }

    /// The body of bytes `start..end` of `rec`: its stripes read in order on the blocking
    /// pool, at most one read ahead of the one being sent.
    fn body(&self, rec: ObjectRecord, start: u64, end: u64) -> StreamingBlob {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
        let (inner, instance) = (self.inner.clone(), rec.instance);
        tokio::task::spawn_blocking(move || {
            for (p, j, off, len) in rec.pieces(start, end) {
                let oid = inner.oid(stripe_name(instance, p, j));
                let r = match inner.client.read(&oid, off, len) {
                    Ok(d) if d.len() as u64 == len => Ok(Bytes::from(d)),
                    Ok(d) => Err(std::io::Error::other(format!(
                        "stripe {j} of part {p} is short: {} of {len} bytes",
                        d.len()
                    ))),
                    Err(e) => Err(std::io::Error::other(e.to_string())),
                };
                let failed = r.is_err();
                if tx.blocking_send(r).is_err() || failed {
                    break;
                }
            }
        });
        StreamingBlob::wrap(futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx)))
    }
}

#[async_trait::async_trait]
impl S3 for Gateway {
    async fn create_bucket(
        &self,
        req: S3Request<CreateBucketInput>,
    ) -> S3Result<S3Response<CreateBucketOutput>> {
        let bucket = req.input.bucket;
        if !s3s::path::check_bucket_name(&bucket) {
            return Err(s3_error!(InvalidBucketName, "bad bucket name {bucket}"));
        }
        self.run(move |i| {
            if i.omap_get1(BUCKETS, bucket.as_bytes())
                .map_err(cluster)?
                .is_some()
            {
                return Err(s3_error!(BucketAlreadyOwnedByYou, "bucket {bucket} exists"));
            }
            let rec = record::encode_bucket(BucketRecord {
                created_ns: now_ns(),
                shards: record::INDEX_SHARDS,
            });
            i.client
                .omap_set(&i.oid(BUCKETS), &[(bucket.clone().into_bytes(), rec)])
                .map_err(cluster)?;
            i.shard_cache().insert(bucket, record::INDEX_SHARDS);
            Ok(())
        })
        .await?;
        Ok(S3Response::new(CreateBucketOutput::default()))
    }

    async fn delete_bucket(
        &self,
        req: S3Request<DeleteBucketInput>,
    ) -> S3Result<S3Response<DeleteBucketOutput>> {
        let bucket = req.input.bucket;
        self.run(move |i| {
            let shards = i.bucket_exists(&bucket)?;
            let mut empty = i
                .omap_page(&uploads_name(&bucket), None, 1)
                .map_err(cluster)?
                .is_empty();
            for s in 0..shards {
                if !empty {
                    break;
                }
                empty = i
                    .omap_page(&index_shard_name(&bucket, shards, s), None, 1)
                    .map_err(cluster)?
                    .is_empty();
            }
            if !empty {
                return Err(s3_error!(BucketNotEmpty, "bucket {bucket} is not empty"));
            }
            i.client
                .omap_rm(&i.oid(BUCKETS), &[bucket.as_bytes().to_vec()])
                .map_err(cluster)?;
            i.shard_cache().remove(&bucket);
            for s in 0..shards {
                i.remove_quiet(&index_shard_name(&bucket, shards, s))
                    .map_err(cluster)?;
            }
            i.remove_quiet(&uploads_name(&bucket)).map_err(cluster)
        })
        .await?;
        Ok(S3Response::new(DeleteBucketOutput::default()))
    }

    async fn head_bucket(
        &self,
        req: S3Request<HeadBucketInput>,
    ) -> S3Result<S3Response<HeadBucketOutput>> {
        let bucket = req.input.bucket;
        self.run(move |i| i.bucket_exists(&bucket)).await?;
        Ok(S3Response::new(HeadBucketOutput::default()))
    }

    async fn list_buckets(
        &self,
        _req: S3Request<ListBucketsInput>,
    ) -> S3Result<S3Response<ListBucketsOutput>> {
        let all = self.run(|i| i.omap_all(BUCKETS).map_err(cluster)).await?;
        let buckets = all
            .into_iter()
            .map(|(name, v)| {
                Ok(Bucket {
                    name: Some(String::from_utf8_lossy(&name).into_owned()),
                    creation_date: Some(timestamp(
                        record::decode_bucket(&v).map_err(bad_record)?.created_ns,
                    )),
                    ..Bucket::default()
                })
            })
            .collect::<S3Result<Vec<_>>>()?;
        Ok(S3Response::new(ListBucketsOutput {
            buckets: Some(buckets),
            ..ListBucketsOutput::default()
        }))
    }

    async fn put_object(
        &self,
        req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        let input = req.input;
        let (bucket, key) = (input.bucket, input.key);
        check_key(&key)?;
        let b = bucket.clone();
        self.run(move |i| i.bucket_exists(&b)).await?;
        // The record this write replaces is looked up while the body streams in.
        let (inner, b, k) = (self.inner.clone(), bucket.clone(), key.clone());
        let old = tokio::task::spawn_blocking(move || inner.record(&b, &k).ok().flatten());
        let instance = random_id();
        let written = self
            .write_body(instance, 0, input.body, input.content_md5)
            .await;
        let old = old.await.ok().flatten();
        let (size, md5, fresh) = written?;
        let rec = ObjectRecord {
            size,
            mtime_ns: now_ns(),
            instance,
            stripe: STRIPE,
            etag: hex::encode(md5),
            content_type: input.content_type.unwrap_or_default(),
            meta: sorted_meta(input.metadata),
            runs: if size > 0 {
                vec![Run {
                    first: 0,
                    count: 1,
                    size,
                }]
            } else {
                Vec::new()
            },
        };
        let tag = self
            .run(move |i| {
                if let Err(e) = fresh.check() {
                    let _ = i.remove_data(&rec);
                    return Err(e);
                }
                i.set_record(&bucket, &key, &rec)?;
                if let Some(old) = old.filter(|o| o.instance != rec.instance) {
                    i.remove_data(&old)?;
                }
                Ok(rec.etag)
            })
            .await?;
        Ok(S3Response::new(PutObjectOutput {
            e_tag: Some(etag(tag)),
            ..PutObjectOutput::default()
        }))
    }

    async fn get_object(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        let input = req.input;
        let (bucket, key) = (input.bucket, input.key);
        let mut rec = self.run(move |i| i.existing(&bucket, &key)).await?;
        let (range, content_range) = match input.range {
            Some(r) => {
                let r = r.check(rec.size)?;
                let cr = format!("bytes {}-{}/{}", r.start, r.end - 1, rec.size);
                (r, Some(cr))
            }
            None => (0..rec.size, None),
        };
        // The record's strings move into the answer; its runs go on to the body's reads.
        let mut out = GetObjectOutput {
            content_length: Some((range.end - range.start) as i64),
            content_range,
            accept_ranges: Some("bytes".into()),
            e_tag: Some(etag(std::mem::take(&mut rec.etag))),
            last_modified: Some(timestamp(rec.mtime_ns)),
            content_type: content_type(std::mem::take(&mut rec.content_type)),
            metadata: meta_map(std::mem::take(&mut rec.meta)),
            ..GetObjectOutput::default()
        };
        out.body = Some(self.body(rec, range.start, range.end));
        Ok(S3Response::new(out))
    }

    async fn head_object(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        let input = req.input;
        let (bucket, key) = (input.bucket, input.key);
        let rec = self.run(move |i| i.existing(&bucket, &key)).await?;
        Ok(S3Response::new(HeadObjectOutput {
            content_length: Some(rec.size as i64),
            accept_ranges: Some("bytes".into()),
            e_tag: Some(etag(rec.etag)),
            last_modified: Some(timestamp(rec.mtime_ns)),
            content_type: content_type(rec.content_type),
            metadata: meta_map(rec.meta),
            ..HeadObjectOutput::default()
        }))
    }

    async fn copy_object(
        &self,
        req: S3Request<CopyObjectInput>,
    ) -> S3Result<S3Response<CopyObjectOutput>> {
        let input = req.input;
        let (src_bucket, src_key) = copy_source(input.copy_source)?;
        check_key(&input.key)?;
        let replace = input
            .metadata_directive
            .is_some_and(|d| d.as_str() == MetadataDirective::REPLACE);
        let (content_type, meta) = (input.content_type, input.metadata);
        let (bucket, key) = (input.bucket, input.key);
        let rec = self
            .run(move |i| {
                let src = i.existing(&src_bucket, &src_key)?;
                i.bucket_exists(&bucket)?;
                let mut rec = ObjectRecord {
                    instance: random_id(),
                    mtime_ns: now_ns(),
                    ..src.clone()
                };
                if replace {
                    rec.content_type = content_type.unwrap_or_default();
                    rec.meta = sorted_meta(meta);
                }
                // Stripe by stripe, through this gateway: one stripe in memory.
                let mut fresh = Fresh::new(i.grace);
                let copied = rec.stripes().try_for_each(|(p, j)| {
                    fresh.stripe()?;
                    let data = i
                        .client
                        .read_full(&i.oid(stripe_name(src.instance, p, j)))
                        .map_err(cluster)?;
                    i.client
                        .write_full(&i.oid(stripe_name(rec.instance, p, j)), &data)
                        .map_err(cluster)
                        .map(drop)
                });
                let old = match copied.and_then(|()| {
                    let old = i.record(&bucket, &key)?;
                    fresh.check()?;
                    i.set_record(&bucket, &key, &rec).map(|()| old)
                }) {
                    Ok(old) => old,
                    Err(e) => {
                        let _ = i.remove_data(&rec);
                        return Err(e);
                    }
                };
                if let Some(old) = old.filter(|o| o.instance != rec.instance) {
                    i.remove_data(&old)?;
                }
                Ok(rec)
            })
            .await?;
        Ok(S3Response::new(CopyObjectOutput {
            copy_object_result: Some(CopyObjectResult {
                e_tag: Some(etag(rec.etag)),
                last_modified: Some(timestamp(rec.mtime_ns)),
                ..CopyObjectResult::default()
            }),
            ..CopyObjectOutput::default()
        }))
    }

    async fn delete_object(
        &self,
        req: S3Request<DeleteObjectInput>,
    ) -> S3Result<S3Response<DeleteObjectOutput>> {
        let (bucket, key) = (req.input.bucket, req.input.key);
        self.run(move |i| delete(i, &bucket, &key)).await?;
        Ok(S3Response::new(DeleteObjectOutput::default()))
    }

    async fn delete_objects(
        &self,
        req: S3Request<DeleteObjectsInput>,
    ) -> S3Result<S3Response<DeleteObjectsOutput>> {
        let bucket = req.input.bucket;
        let keys: Vec<String> = req
            .input
            .delete
            .objects
            .into_iter()
            .map(|o| o.key)
            .collect();
        let deleted = self
            .run(move |i| {
                keys.into_iter()
                    .map(|key| {
                        delete(i, &bucket, &key)?;
                        Ok(DeletedObject {
                            key: Some(key),
                            ..DeletedObject::default()
                        })
                    })
                    .collect::<S3Result<Vec<_>>>()
            })
            .await?;
        Ok(S3Response::new(DeleteObjectsOutput {
            deleted: Some(deleted),
            ..DeleteObjectsOutput::default()
        }))
    }

    async fn list_objects_v2(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        let input = req.input;
        let token =
            match &input.continuation_token {
                Some(t) => Some(hex::decode(t).map_err(|_| {
                    s3_error!(InvalidArgument, "the continuation token is not valid")
                })?),
                None => None,
            };
        let after = token.or(input.start_after.clone().map(String::into_bytes));
        let page = self
            .list_page(
                &input.bucket,
                &input.prefix,
                &input.delimiter,
                input.max_keys,
                after,
            )
            .await?;
        let key_count = (page.objects.len() + page.prefixes.len()) as i32;
        let (truncated, next) = (page.truncated, page.next.clone());
        let (contents, common_prefixes) = page.entries();
        Ok(S3Response::new(ListObjectsV2Output {
            name: Some(input.bucket),
            prefix: input.prefix,
            delimiter: input.delimiter,
            max_keys: input.max_keys.or(Some(1000)),
            start_after: input.start_after,
            continuation_token: input.continuation_token,
            next_continuation_token: next.map(hex::encode),
            is_truncated: Some(truncated),
            key_count: Some(key_count),
            contents: Some(contents),
            common_prefixes: Some(common_prefixes),
            ..ListObjectsV2Output::default()
        }))
    }

    async fn list_objects(
        &self,
        req: S3Request<ListObjectsInput>,
    ) -> S3Result<S3Response<ListObjectsOutput>> {
        let input = req.input;
        let after = input.marker.clone().map(String::into_bytes);
        let page = self
            .list_page(
                &input.bucket,
                &input.prefix,
                &input.delimiter,
                input.max_keys,
                after,
            )
            .await?;
        let next_marker = page.last.clone().filter(|_| page.truncated);
        let truncated = page.truncated;
        let (contents, common_prefixes) = page.entries();
        Ok(S3Response::new(ListObjectsOutput {
            name: Some(input.bucket),
            prefix: input.prefix,
            delimiter: input.delimiter,
            max_keys: input.max_keys.or(Some(1000)),
            marker: input.marker,
            next_marker,
            is_truncated: Some(truncated),
            contents: Some(contents),
            common_prefixes: Some(common_prefixes),
            ..ListObjectsOutput::default()
        }))
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        let input = req.input;
        check_key(&input.key)?;
        let upload = random_id();
        let rec = UploadRecord {
            initiated_ns: now_ns(),
            content_type: input.content_type.unwrap_or_default(),
            meta: sorted_meta(input.metadata),
        };
        let (bucket, key) = (input.bucket.clone(), input.key.clone());
        self.run(move |i| {
            i.bucket_exists(&bucket)?;
            i.client
                .omap_set(
                    &i.oid(uploads_name(&bucket)),
                    &[(upload_key(&key, upload), rec.encode())],
                )
                .map_err(cluster)?;
            Ok(())
        })
        .await?;
        Ok(S3Response::new(CreateMultipartUploadOutput {
            bucket: Some(input.bucket),
            key: Some(input.key),
            upload_id: Some(record::upload_id(upload)),
            ..CreateMultipartUploadOutput::default()
        }))
    }

    async fn upload_part(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        let input = req.input;
        let part = part_number(input.part_number)?;
        let (bucket, key, id) = (input.bucket, input.key, input.upload_id);
        let (upload, old) = self
            .run(move |i| {
                let (upload, _) = i.upload(&bucket, &key, &id)?;
                let old = i
                    .omap_get1(&parts_name(upload), &part.to_be_bytes())
                    .map_err(cluster)?;
                Ok((upload, old))
            })
            .await?;
        let (size, md5, fresh) = self
            .write_body(upload, part, input.body, input.content_md5)
            .await?;
        let rec = PartRecord {
            size,
            md5,
            mtime_ns: now_ns(),
        };
        self.run(move |i| i.finish_part(upload, part, &rec, old, &fresh))
            .await?;
        Ok(S3Response::new(UploadPartOutput {
            e_tag: Some(etag(hex::encode(md5))),
            ..UploadPartOutput::default()
        }))
    }

    async fn upload_part_copy(
        &self,
        req: S3Request<UploadPartCopyInput>,
    ) -> S3Result<S3Response<UploadPartCopyOutput>> {
        let input = req.input;
        let part = part_number(input.part_number)?;
        let (src_bucket, src_key) = copy_source(input.copy_source)?;
        let range = input.copy_source_range;
        let (bucket, key, id) = (input.bucket, input.key, input.upload_id);
        let _buffer = self.stripe_buffer().await?;
        let rec = self
            .run(move |i| {
                let (upload, _) = i.upload(&bucket, &key, &id)?;
                let src = i.existing(&src_bucket, &src_key)?;
                let (start, end) = match range.as_deref() {
                    Some(r) => copy_range_of(r, src.size)?,
                    None => (0, src.size),
                };
                let old = i
                    .omap_get1(&parts_name(upload), &part.to_be_bytes())
                    .map_err(cluster)?;
                let mut fresh = Fresh::new(i.grace);
                let md5 = i.copy_range(&src, start, end, upload, part, &mut fresh)?;
                let rec = PartRecord {
                    size: end - start,
                    md5,
                    mtime_ns: now_ns(),
                };
                i.finish_part(upload, part, &rec, old, &fresh)?;
                Ok(rec)
            })
            .await?;
        Ok(S3Response::new(UploadPartCopyOutput {
            copy_part_result: Some(CopyPartResult {
                e_tag: Some(etag(hex::encode(rec.md5))),
                last_modified: Some(timestamp(rec.mtime_ns)),
                ..CopyPartResult::default()
            }),
            ..UploadPartCopyOutput::default()
        }))
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        let input = req.input;
        let wanted = input
            .multipart_upload
            .and_then(|m| m.parts)
            .filter(|p| !p.is_empty())
            .ok_or_else(|| s3_error!(InvalidRequest, "the upload lists no part"))?;
        let (bucket, key, id) = (input.bucket.clone(), input.key.clone(), input.upload_id);
        let tag = self
            .run(move |i| {
                let (upload, up) = i.upload(&bucket, &key, &id)?;
                let stored = i.parts(upload)?;
                let chosen = choose_parts(&wanted, &stored)?;
                let mut all_md5 = Md5::new();
                for (_, p) in &chosen {
                    all_md5.update(p.md5);
                }
                let sizes: Vec<(u32, u64)> = chosen.iter().map(|(n, p)| (*n, p.size)).collect();
                let rec = ObjectRecord {
                    size: sizes.iter().map(|s| s.1).sum(),
                    mtime_ns: now_ns(),
                    instance: upload,
                    stripe: STRIPE,
                    etag: format!("{}-{}", hex::encode(all_md5.finalize()), chosen.len()),
                    content_type: up.content_type,
                    meta: up.meta,
                    runs: record::runs_of(&sizes),
                };
                if rec.encode().len() > MAX_RECORD {
                    return Err(s3_error!(
                        InvalidRequest,
                        "the parts' sizes change too often to describe in one record"
                    ));
                }
                let old = i.publish(&bucket, &key, &rec)?;
                let keep: Vec<u32> = sizes.iter().map(|s| s.0).collect();
                i.drop_upload(&bucket, &key, upload, &keep)?;
                if let Some(old) = old.filter(|o| o.instance != upload) {
                    i.remove_data(&old)?;
                }
                Ok(rec.etag)
            })
            .await?;
        Ok(S3Response::new(CompleteMultipartUploadOutput {
            bucket: Some(input.bucket),
            key: Some(input.key),
            e_tag: Some(etag(tag)),
            ..CompleteMultipartUploadOutput::default()
        }))
    }

    async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        let input = req.input;
        let (bucket, key, id) = (input.bucket, input.key, input.upload_id);
        self.run(move |i| {
            let (upload, _) = i.upload(&bucket, &key, &id)?;
            i.drop_upload(&bucket, &key, upload, &[])
        })
        .await?;
        Ok(S3Response::new(AbortMultipartUploadOutput::default()))
    }

    async fn list_parts(
        &self,
        req: S3Request<ListPartsInput>,
    ) -> S3Result<S3Response<ListPartsOutput>> {
        let input = req.input;
        let marker = input.part_number_marker.unwrap_or(0).max(0) as u32;
        let max = input.max_parts.unwrap_or(1000).clamp(1, 1000) as u32;
        let (bucket, key, id) = (
            input.bucket.clone(),
            input.key.clone(),
            input.upload_id.clone(),
        );
        let page = self
            .run(move |i| {
                let (upload, _) = i.upload(&bucket, &key, &id)?;
                let after = marker.to_be_bytes();
                let page = i
                    .omap_page(&parts_name(upload), Some(&after), max + 1)
                    .map_err(cluster)?;
                page.iter()
                    .map(|(k, v)| part_entry(k, v))
                    .collect::<S3Result<Vec<_>>>()
            })
            .await?;
        let truncated = page.len() > max as usize;
        let parts: Vec<Part> = page
            .into_iter()
            .take(max as usize)
            .map(|(n, p)| Part {
                part_number: Some(n as i32),
                size: Some(p.size as i64),
                e_tag: Some(etag(hex::encode(p.md5))),
                last_modified: Some(timestamp(p.mtime_ns)),
                ..Part::default()
            })
            .collect();
        let next = parts.last().and_then(|p| p.part_number);
        Ok(S3Response::new(ListPartsOutput {
            bucket: Some(input.bucket),
            key: Some(input.key),
            upload_id: Some(input.upload_id),
            max_parts: Some(max as i32),
            part_number_marker: input.part_number_marker,
            next_part_number_marker: next.filter(|_| truncated),
            is_truncated: Some(truncated),
            parts: Some(parts),
            ..ListPartsOutput::default()
        }))
    }
}

/// DeleteObject: the index entry, then the data. A missing key is no error (as in S3).
fn delete(i: &Inner, bucket: &str, key: &str) -> S3Result<()> {
    let shards = i.bucket_exists(bucket)?;
    let Some(rec) = i.record_in(bucket, shards, key)? else {
        return Ok(());
    };
    i.client
        .omap_rm(
            &i.oid(index_name(bucket, shards, key.as_bytes())),
            &[key.as_bytes().to_vec()],
        )
        .map_err(cluster)?;
    i.remove_data(&rec)
}

/// The stored parts a CompleteMultipartUpload lists, checked: ascending, uploaded, with the
/// ETag given, and none but the last below 5 MiB.
fn choose_parts(
    wanted: &[CompletedPart],
    stored: &[(u32, PartRecord)],
) -> S3Result<Vec<(u32, PartRecord)>> {
    let mut out: Vec<(u32, PartRecord)> = Vec::with_capacity(wanted.len());
    for w in wanted {
        let n = w
            .part_number
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| s3_error!(InvalidPart, "a part without a valid number"))?;
        if out.last().is_some_and(|l| l.0 >= n) {
            return Err(s3_error!(
                InvalidPartOrder,
                "parts must be listed in ascending order"
            ));
        }
        let p = stored
            .iter()
            .find(|s| s.0 == n)
            .ok_or_else(|| s3_error!(InvalidPart, "part {n} was not uploaded"))?
            .1;
        if let Some(t) = &w.e_tag {
            if t.value().trim_matches('"') != hex::encode(p.md5) {
                return Err(s3_error!(InvalidPart, "part {n} has another ETag"));
            }
        }
        if let Some(prev) = out.last() {
            if prev.1.size < MIN_PART {
                return Err(s3_error!(
                    EntityTooSmall,
                    "part {} is {} bytes; every part but the last must be 5 MiB or more",
                    prev.0,
                    prev.1.size
                ));
            }
        }
        out.push((n, p));
    }
    Ok(out)
}

/// A ListObjectsV2 request.
struct ListQuery {
    prefix: String,
    delimiter: Option<String>,
    max_keys: usize,
    /// Keys up to this one are skipped (a continuation token or start-after).
    after: Option<Vec<u8>>,
}

/// One page of a listing.
struct ListPage {
    objects: Vec<(String, ObjectRecord)>,
    prefixes: Vec<String>,
    truncated: bool,
    /// Where the next page starts (its continuation token).
    next: Option<Vec<u8>>,
    /// The last key or common prefix of the page (ListObjects' next marker).
    last: Option<String>,
}

impl ListPage {
    /// The page's objects and common prefixes as S3 lists them.
    fn entries(self) -> (Vec<Object>, Vec<CommonPrefix>) {
        let objects = self
            .objects
            .into_iter()
            .map(|(key, rec)| Object {
                key: Some(key),
                size: Some(rec.size as i64),
                e_tag: Some(etag(rec.etag)),
                last_modified: Some(timestamp(rec.mtime_ns)),
                storage_class: Some(ObjectStorageClass::from_static(
                    ObjectStorageClass::STANDARD,
                )),
                ..Object::default()
            })
            .collect();
        let prefixes = self
            .prefixes
            .into_iter()
            .map(|p| CommonPrefix { prefix: Some(p) })
            .collect();
        (objects, prefixes)
    }
}

/// One index shard's place in a [`Merged`] listing.
struct ShardCursor {
    name: Vec<u8>,
    /// Entries fetched and not yet taken, in key order.
    buf: std::collections::VecDeque<(Vec<u8>, Vec<u8>)>,
    /// The next page of the shard starts after this key.
    from: Option<Vec<u8>>,
    /// The shard has no entry after `from`.
    done: bool,
}

/// The entries of every index shard of a bucket, merged into key order: each shard is read
/// in pages, and the smallest head among them is taken each time.
struct Merged<'a> {
    i: &'a Inner,
    shards: Vec<ShardCursor>,
}

impl<'a> Merged<'a> {
    /// The entries after `after` of the `shards` shards of `bucket`'s index.
    fn new(i: &'a Inner, bucket: &str, shards: u16, after: Option<Vec<u8>>) -> Merged<'a> {
        Merged {
            i,
            shards: (0..shards)
                .map(|s| ShardCursor {
                    name: index_shard_name(bucket, shards, s),
                    buf: std::collections::VecDeque::new(),
                    from: after.clone(),
                    done: false,
                })
                .collect(),
        }
    }

    /// Skips every entry at or before `after`.
    fn seek(&mut self, after: &[u8]) {
        for c in &mut self.shards {
            while c.buf.front().is_some_and(|(k, _)| k.as_slice() <= after) {
                c.buf.pop_front();
            }
            if c.buf.is_empty() && c.from.as_deref().is_none_or(|f| f < after) {
                c.from = Some(after.to_vec());
            }
        }
    }

    /// The next entry in key order.
    fn next(&mut self) -> S3Result<Option<(Vec<u8>, Vec<u8>)>> {
        for c in &mut self.shards {
            if c.buf.is_empty() && !c.done {
                let page = self
                    .i
                    .omap_page(&c.name, c.from.as_deref(), PAGE)
                    .map_err(cluster)?;
                c.done = page.len() < PAGE as usize;
                if let Some((k, _)) = page.last() {
                    c.from = Some(k.clone());
                }
                c.buf.extend(page);
            }
        }
        let smallest = self
            .shards
            .iter()
            .enumerate()
            .filter_map(|(n, c)| c.buf.front().map(|(k, _)| (k, n)))
            .min()
            .map(|(_, n)| n);
        Ok(smallest.and_then(|n| self.shards[n].buf.pop_front()))
    }
}

fn list(i: &Inner, bucket: &str, q: &ListQuery) -> S3Result<ListPage> {
    let shards = i.bucket_exists(bucket)?;
    let prefix = q.prefix.as_bytes();
    let mut after = match (&q.after, before(prefix)) {
        (Some(a), Some(b)) => Some(a.clone().max(b)),
        (a, b) => a.clone().or(b),
    };
    let mut page = ListPage {
        objects: Vec::new(),
        prefixes: Vec::new(),
        truncated: false,
        next: None,
        last: None,
    };
    let mut entries = Merged::new(i, bucket, shards, after.clone());
    while let Some((k, v)) = entries.next()? {
        if !k.starts_with(prefix) {
            break;
        }
        let rest = &k[prefix.len()..];
        let cut = q.delimiter.as_ref().and_then(|d| {
            rest.windows(d.len())
                .position(|w| w == d.as_bytes())
                .map(|at| prefix.len() + at + d.len())
        });
        // A common prefix a marker names (or passed) was listed on an earlier page.
        let listed = cut.is_some_and(|c| q.after.as_deref().is_some_and(|a| &k[..c] <= a));
        if !listed && page.objects.len() + page.prefixes.len() == q.max_keys {
            page.truncated = true;
            page.next = after;
            break;
        }
        if let Some(cut) = cut {
            let mut skip = k[..cut].to_vec();
            if !listed {
                let text = String::from_utf8_lossy(&skip).into_owned();
                page.prefixes.push(text.clone());
                page.last = Some(text);
            }
            skip.push(0xff);
            entries.seek(&skip);
            after = Some(skip);
            continue;
        }
        let rec = ObjectRecord::decode(&v).map_err(bad_record)?;
        let text = String::from_utf8_lossy(&k).into_owned();
        page.objects.push((text.clone(), rec));
        page.last = Some(text);
        after = Some(k);
    }
    Ok(page)
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("pool", &self.inner.pool)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use s3s::S3ErrorCode;

    #[test]
    fn the_start_before_a_prefix_leaves_out_no_key_of_the_prefix() {
        assert_eq!(before(b""), None);
        assert_eq!(before(b"abc").unwrap(), b"abb\xff");
        assert_eq!(before(b"ab\0").unwrap(), b"ab");
        for key in [&b"abc"[..], b"abc/", b"abcd"] {
            assert!(key > before(b"abc").unwrap().as_slice());
        }
        assert!(&b"abb"[..] < before(b"abc").unwrap().as_slice());
    }

    #[test]
    fn copy_source_ranges_are_checked_against_the_source() {
        assert_eq!(copy_range_of("bytes=0-9", 10).unwrap(), (0, 10));
        assert_eq!(copy_range_of("bytes=5-5", 10).unwrap(), (5, 6));
        let code = |t: &str| copy_range_of(t, 10).unwrap_err().code().clone();
        assert_eq!(code("bytes=0-10"), S3ErrorCode::InvalidRange);
        assert_eq!(code("bytes=6-5"), S3ErrorCode::InvalidRange);
        assert_eq!(code("bytes=a-5"), S3ErrorCode::InvalidArgument);
        assert_eq!(code("0-5"), S3ErrorCode::InvalidArgument);
        assert_eq!(
            part_number(0).unwrap_err().code(),
            &S3ErrorCode::InvalidArgument
        );
        assert_eq!(part_number(10000).unwrap(), 10000);
    }

    #[test]
    fn parts_must_ascend_exist_match_and_be_large_enough() {
        let part = |n: i32, tag: &str| CompletedPart {
            part_number: Some(n),
            e_tag: Some(etag(tag.to_string())),
            ..CompletedPart::default()
        };
        let rec = |size: u64, b: u8| PartRecord {
            size,
            md5: [b; 16],
            mtime_ns: 0,
        };
        let stored = vec![(1, rec(MIN_PART, 1)), (2, rec(10, 2)), (3, rec(10, 3))];
        let t = |b: u8| hex::encode([b; 16]);
        let ok = choose_parts(&[part(1, &t(1)), part(2, &t(2))], &stored).unwrap();
        assert_eq!(ok.len(), 2);
        let code = |r: S3Result<Vec<(u32, PartRecord)>>| r.unwrap_err().code().clone();
        assert_eq!(
            code(choose_parts(&[part(2, &t(2)), part(1, &t(1))], &stored)),
            S3ErrorCode::InvalidPartOrder
        );
        assert_eq!(
            code(choose_parts(&[part(4, &t(1))], &stored)),
            S3ErrorCode::InvalidPart
        );
        assert_eq!(
            code(choose_parts(&[part(1, &t(9))], &stored)),
            S3ErrorCode::InvalidPart
        );
        assert_eq!(
            code(choose_parts(&[part(2, &t(2)), part(3, &t(3))], &stored)),
            S3ErrorCode::EntityTooSmall
        );
    }
}
