//! The records the gateway keeps in omap values (`docs/s3.md`, "Objects in the pool"), and the
//! names of the cluster objects that hold them.

use thiserror::Error;

/// Stripe size of new objects and parts (RGW's default).
pub const STRIPE: u32 = 4 << 20;
/// Largest omap value the object store takes (`docs/objstore.md`).
pub const MAX_RECORD: usize = 64 << 10;

/// A record that does not decode.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("bad {what} record: {why}")]
pub struct BadRecord {
    pub what: &'static str,
    pub why: &'static str,
}

/// Parts `first ..< first + count`, each `size` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    pub first: u32,
    pub count: u32,
    pub size: u64,
}

/// An object's index entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectRecord {
    pub size: u64,
    pub mtime_ns: u64,
    pub instance: u64,
    pub stripe: u32,
    pub etag: String,
    pub content_type: String,
    pub meta: Vec<(String, String)>,
    pub runs: Vec<Run>,
}

/// A multipart upload in progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadRecord {
    pub initiated_ns: u64,
    pub content_type: String,
    pub meta: Vec<(String, String)>,
}

/// One uploaded part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartRecord {
    pub size: u64,
    pub md5: [u8; 16],
    pub mtime_ns: u64,
}

const VERSION: u8 = 1;
/// Version of bucket records with a shard count.
const BUCKET_VERSION: u8 = 2;
/// Index shards of every bucket created.
pub const INDEX_SHARDS: u16 = 16;

/// Name of the bucket list object.
pub const BUCKETS: &[u8] = b"s3.buckets";

/// Name of shard `shard` of a bucket's index of `shards` shards (a bucket of one shard has
/// its whole index in `s3.index.<bucket>`).
pub fn index_shard_name(bucket: &str, shards: u16, shard: u16) -> Vec<u8> {
    if shards <= 1 {
        [b"s3.index.", bucket.as_bytes()].concat()
    } else {
        format!("s3.index.{bucket}/{shard}").into_bytes()
    }
}

/// Name of the index shard that holds `key` in a bucket of `shards` shards.
pub fn index_name(bucket: &str, shards: u16, key: &[u8]) -> Vec<u8> {
    let shard = (crc32c::crc32c(key) % u32::from(shards.max(1))) as u16;
    index_shard_name(bucket, shards, shard)
}

/// Name of a bucket's uploads object.
pub fn uploads_name(bucket: &str) -> Vec<u8> {
    [b"s3.uploads.", bucket.as_bytes()].concat()
}

/// Name of an upload's parts object.
pub fn parts_name(upload: u64) -> Vec<u8> {
    format!("s3.parts.{upload:016x}").into_bytes()
}

/// Name of stripe `stripe` of part `part` of `instance`.
pub fn stripe_name(instance: u64, part: u32, stripe: u64) -> Vec<u8> {
    format!("s3.data.{instance:016x}.{part}.{stripe}").into_bytes()
}

/// The instance, part and stripe index a stripe object's name holds (`None` for any other
/// name).
pub fn parse_stripe_name(name: &[u8]) -> Option<(u64, u32, u64)> {
    let rest = name.strip_prefix(b"s3.data.")?;
    let (instance, rest) = (rest.get(..16)?, rest.get(16..)?);
    let rest = rest.strip_prefix(b".")?;
    let dot = rest.iter().position(|&b| b == b'.')?;
    let (part, stripe) = (&rest[..dot], &rest[dot + 1..]);
    let hex = |b: &[u8]| b.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'));
    let dec = |b: &[u8]| !b.is_empty() && b.iter().all(u8::is_ascii_digit);
    if !hex(instance) || !dec(part) || !dec(stripe) {
        return None;
    }
    let text = std::str::from_utf8;
    Some((
        u64::from_str_radix(text(instance).ok()?, 16).ok()?,
        text(part).ok()?.parse().ok()?,
        text(stripe).ok()?.parse().ok()?,
    ))
}

/// The upload id an entry key of an uploads object ends with (`None` for a malformed key).
pub fn parse_upload_key(key: &[u8]) -> Option<u64> {
    let at = key.len().checked_sub(17)?;
    if key[at] != 0 {
        return None;
    }
    parse_upload_id(std::str::from_utf8(&key[at + 1..]).ok()?)
}

/// Key of an upload in the uploads object.
pub fn upload_key(key: &str, upload: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(key.len() + 17);
    k.extend_from_slice(key.as_bytes());
    k.push(0);
    k.extend_from_slice(format!("{upload:016x}").as_bytes());
    k
}

/// The upload id text of `upload` and back.
pub fn upload_id(upload: u64) -> String {
    format!("{upload:016x}")
}

pub fn parse_upload_id(text: &str) -> Option<u64> {
    (text.len() == 16)
        .then(|| u64::from_str_radix(text, 16).ok())
        .flatten()
}

/// Number of stripes of a part of `size` bytes.
pub fn stripes_of(size: u64, stripe: u32) -> u64 {
    size.div_ceil(u64::from(stripe.max(1)))
}

/// A bucket's record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketRecord {
    pub created_ns: u64,
    /// Index shards (1 for a version 1 record).
    pub shards: u16,
}

/// Bucket record: version 2 ‖ creation time ‖ index shards.
pub fn encode_bucket(r: BucketRecord) -> Vec<u8> {
    let mut v = vec![BUCKET_VERSION];
    v.extend_from_slice(&r.created_ns.to_le_bytes());
    v.extend_from_slice(&r.shards.to_le_bytes());
    v
}

pub fn decode_bucket(b: &[u8]) -> Result<BucketRecord, BadRecord> {
    let mut d = Dec::new(b, "bucket");
    let version = d.u8()?;
    let created_ns = d.u64()?;
    let shards = match version {
        VERSION => 1,
        BUCKET_VERSION => d.u16()?,
        _ => return Err(d.bad("unknown version")),
    };
    if shards == 0 {
        return Err(d.bad("0 index shards"));
    }
    d.end()?;
    Ok(BucketRecord { created_ns, shards })
}

fn put_meta(v: &mut Vec<u8>, content_type: &str, meta: &[(String, String)]) {
    put16(v, content_type.as_bytes());
    v.extend_from_slice(&(meta.len() as u16).to_le_bytes());
    for (k, val) in meta {
        put16(v, k.as_bytes());
        put16(v, val.as_bytes());
    }
}

fn put16(v: &mut Vec<u8>, b: &[u8]) {
    v.extend_from_slice(&(b.len() as u16).to_le_bytes());
    v.extend_from_slice(b);
}

impl ObjectRecord {
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(64 + self.etag.len() + 16 * self.runs.len());
        v.push(VERSION);
        v.extend_from_slice(&self.size.to_le_bytes());
        v.extend_from_slice(&self.mtime_ns.to_le_bytes());
        v.extend_from_slice(&self.instance.to_le_bytes());
        v.extend_from_slice(&self.stripe.to_le_bytes());
        v.push(self.etag.len() as u8);
        v.extend_from_slice(self.etag.as_bytes());
        put_meta(&mut v, &self.content_type, &self.meta);
        v.extend_from_slice(&(self.runs.len() as u32).to_le_bytes());
        for r in &self.runs {
            v.extend_from_slice(&r.first.to_le_bytes());
            v.extend_from_slice(&r.count.to_le_bytes());
            v.extend_from_slice(&r.size.to_le_bytes());
        }
        v
    }

    pub fn decode(b: &[u8]) -> Result<ObjectRecord, BadRecord> {
        let mut d = Dec::new(b, "object");
        d.version()?;
        let (size, mtime_ns, instance, stripe) = (d.u64()?, d.u64()?, d.u64()?, d.u32()?);
        let n = d.u8()? as usize;
        let etag = d.text(n)?;
        let (content_type, meta) = d.meta()?;
        let count = d.u32()?;
        let mut runs = Vec::new();
        let mut total = 0u64;
        for _ in 0..count {
            let r = Run {
                first: d.u32()?,
                count: d.u32()?,
                size: d.u64()?,
            };
            total = r
                .size
                .checked_mul(u64::from(r.count))
                .and_then(|s| total.checked_add(s))
                .ok_or(d.bad("run sizes overflow"))?;
            runs.push(r);
        }
        d.end()?;
        if total != size {
            return Err(d.bad("run sizes do not add up to the size"));
        }
        if stripe == 0 {
            return Err(d.bad("stripe size 0"));
        }
        Ok(ObjectRecord {
            size,
            mtime_ns,
            instance,
            stripe,
            etag,
            content_type,
            meta,
            runs,
        })
    }

    /// The parts of the object in order: (part number, size).
    pub fn parts(&self) -> impl Iterator<Item = (u32, u64)> + '_ {
        self.runs
            .iter()
            .flat_map(|r| (0..r.count).map(move |i| (r.first + i, r.size)))
    }

    /// Every stripe object of the object: (part, stripe index).
    pub fn stripes(&self) -> impl Iterator<Item = (u32, u64)> + '_ {
        let stripe = self.stripe;
        self.parts()
            .flat_map(move |(p, size)| (0..stripes_of(size, stripe)).map(move |j| (p, j)))
    }

    /// The pieces of the byte range `start..end`: (part, stripe index, offset in the stripe,
    /// length), in order.
    pub fn pieces(&self, start: u64, end: u64) -> Vec<(u32, u64, u64, u64)> {
        let stripe = u64::from(self.stripe);
        let mut out = Vec::new();
        let mut base = 0u64;
        for (p, size) in self.parts() {
            let (lo, hi) = (start.max(base), end.min(base + size));
            let mut pos = lo;
            while pos < hi {
                let in_part = pos - base;
                let j = in_part / stripe;
                let off = in_part % stripe;
                let len = (stripe - off).min(hi - pos);
                out.push((p, j, off, len));
                pos += len;
            }
            base += size;
            if base >= end {
                break;
            }
        }
        out
    }
}

/// Folds `(part number, size)` pairs (ascending part numbers) into runs.
pub fn runs_of(parts: &[(u32, u64)]) -> Vec<Run> {
    let mut runs: Vec<Run> = Vec::new();
    for &(p, size) in parts {
        match runs.last_mut() {
            Some(r) if r.size == size && r.first + r.count == p => r.count += 1,
            _ => runs.push(Run {
                first: p,
                count: 1,
                size,
            }),
        }
    }
    runs
}

impl UploadRecord {
    pub fn encode(&self) -> Vec<u8> {
        let mut v = vec![VERSION];
        v.extend_from_slice(&self.initiated_ns.to_le_bytes());
        put_meta(&mut v, &self.content_type, &self.meta);
        v
    }

    pub fn decode(b: &[u8]) -> Result<UploadRecord, BadRecord> {
        let mut d = Dec::new(b, "upload");
        d.version()?;
        let initiated_ns = d.u64()?;
        let (content_type, meta) = d.meta()?;
        d.end()?;
        Ok(UploadRecord {
            initiated_ns,
            content_type,
            meta,
        })
    }
}

impl PartRecord {
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(33);
        v.push(VERSION);
        v.extend_from_slice(&self.size.to_le_bytes());
        v.extend_from_slice(&self.md5);
        v.extend_from_slice(&self.mtime_ns.to_le_bytes());
        v
    }

    pub fn decode(b: &[u8]) -> Result<PartRecord, BadRecord> {
        let mut d = Dec::new(b, "part");
        d.version()?;
        let size = d.u64()?;
        let md5 = d.take(16)?.try_into().expect("16 bytes");
        let mtime_ns = d.u64()?;
        d.end()?;
        Ok(PartRecord {
            size,
            md5,
            mtime_ns,
        })
    }
}

/// A bounds-checked reader of a record.
struct Dec<'a> {
    b: &'a [u8],
    what: &'static str,
}

impl<'a> Dec<'a> {
    fn new(b: &'a [u8], what: &'static str) -> Dec<'a> {
        Dec { b, what }
    }

    fn bad(&self, why: &'static str) -> BadRecord {
        BadRecord {
            what: self.what,
            why,
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], BadRecord> {
        if self.b.len() < n {
            return Err(self.bad("a field runs past the end"));
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }

    fn u8(&mut self) -> Result<u8, BadRecord> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, BadRecord> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2")))
    }

    fn u32(&mut self) -> Result<u32, BadRecord> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }

    fn u64(&mut self) -> Result<u64, BadRecord> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }

    fn version(&mut self) -> Result<(), BadRecord> {
        match self.u8()? {
            VERSION => Ok(()),
            _ => Err(self.bad("unknown version")),
        }
    }

    fn text(&mut self, n: usize) -> Result<String, BadRecord> {
        let b = self.take(n)?;
        String::from_utf8(b.to_vec()).map_err(|_| self.bad("text is not UTF-8"))
    }

    fn text16(&mut self) -> Result<String, BadRecord> {
        let n = self.u16()? as usize;
        self.text(n)
    }

    fn meta(&mut self) -> Result<(String, Vec<(String, String)>), BadRecord> {
        let content_type = self.text16()?;
        let n = self.u16()?;
        let mut meta = Vec::new();
        for _ in 0..n {
            meta.push((self.text16()?, self.text16()?));
        }
        Ok((content_type, meta))
    }

    fn end(&self) -> Result<(), BadRecord> {
        if self.b.is_empty() {
            Ok(())
        } else {
            Err(self.bad("bytes after the last field"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> ObjectRecord {
        ObjectRecord {
            size: 3 * (5 << 20) + 7,
            mtime_ns: 1_700_000_000_123_456_789,
            instance: 0xfeed_beef_0123_4567,
            stripe: STRIPE,
            etag: "0123456789abcdef0123456789abcdef-4".into(),
            content_type: "text/plain".into(),
            meta: vec![("color".into(), "blue".into())],
            runs: vec![
                Run {
                    first: 1,
                    count: 3,
                    size: 5 << 20,
                },
                Run {
                    first: 4,
                    count: 1,
                    size: 7,
                },
            ],
        }
    }

    #[test]
    fn object_record_is_the_documented_bytes() {
        let r = ObjectRecord {
            size: 5,
            mtime_ns: 2,
            instance: 3,
            stripe: 4,
            etag: "ab".into(),
            content_type: "t".into(),
            meta: vec![("k".into(), "vv".into())],
            runs: vec![Run {
                first: 0,
                count: 1,
                size: 5,
            }],
        };
        let mut want = vec![1u8];
        want.extend_from_slice(&5u64.to_le_bytes());
        want.extend_from_slice(&2u64.to_le_bytes());
        want.extend_from_slice(&3u64.to_le_bytes());
        want.extend_from_slice(&4u32.to_le_bytes());
        want.extend_from_slice(&[
            2, b'a', b'b', 1, 0, b't', 1, 0, 1, 0, b'k', 2, 0, b'v', b'v',
        ]);
        want.extend_from_slice(&1u32.to_le_bytes());
        want.extend_from_slice(&0u32.to_le_bytes());
        want.extend_from_slice(&1u32.to_le_bytes());
        want.extend_from_slice(&5u64.to_le_bytes());
        assert_eq!(r.encode(), want);
        assert_eq!(ObjectRecord::decode(&want).unwrap(), r);
    }

    #[test]
    fn records_round_trip_and_refuse_damage() {
        let r = record();
        let b = r.encode();
        assert_eq!(ObjectRecord::decode(&b).unwrap(), r);
        for n in 0..b.len() {
            assert!(ObjectRecord::decode(&b[..n]).is_err(), "truncated at {n}");
        }
        let mut extra = b.clone();
        extra.push(0);
        assert!(ObjectRecord::decode(&extra).is_err());
        let mut wrong = b.clone();
        wrong[1] ^= 1;
        assert_eq!(
            ObjectRecord::decode(&wrong).unwrap_err().why,
            "run sizes do not add up to the size"
        );
        let mut version = b;
        version[0] = 2;
        assert_eq!(
            ObjectRecord::decode(&version).unwrap_err().why,
            "unknown version"
        );
        let u = UploadRecord {
            initiated_ns: 9,
            content_type: String::new(),
            meta: vec![],
        };
        assert_eq!(UploadRecord::decode(&u.encode()).unwrap(), u);
        let p = PartRecord {
            size: 10,
            md5: [7; 16],
            mtime_ns: 11,
        };
        assert_eq!(p.encode().len(), 33);
        assert_eq!(PartRecord::decode(&p.encode()).unwrap(), p);
        let b = BucketRecord {
            created_ns: 12,
            shards: INDEX_SHARDS,
        };
        assert_eq!(encode_bucket(b).len(), 11);
        assert_eq!(decode_bucket(&encode_bucket(b)).unwrap(), b);
        // A version 1 record (earlier gateways) is a bucket of one shard.
        let mut v1 = vec![1u8];
        v1.extend_from_slice(&12u64.to_le_bytes());
        let one = decode_bucket(&v1).unwrap();
        assert_eq!((one.created_ns, one.shards), (12, 1));
        let mut zero = encode_bucket(b);
        zero[9..11].copy_from_slice(&0u16.to_le_bytes());
        assert!(decode_bucket(&zero).is_err());
        assert!(decode_bucket(&[3, 0, 0, 0, 0, 0, 0, 0, 0]).is_err());
    }

    #[test]
    fn index_shards_are_named_and_chosen_by_key() {
        assert_eq!(index_shard_name("b", 1, 0), b"s3.index.b");
        assert_eq!(index_name("b", 1, b"any"), b"s3.index.b");
        assert_eq!(index_shard_name("b", 16, 7), b"s3.index.b/7");
        let mut seen = [0u32; 16];
        for i in 0..1600 {
            let k = format!("key{i}");
            let n = index_name("b", 16, k.as_bytes());
            let shard: usize = std::str::from_utf8(&n[b"s3.index.b/".len()..])
                .unwrap()
                .parse()
                .unwrap();
            seen[shard] += 1;
            assert_eq!(index_name("b", 16, k.as_bytes()), n, "stable");
        }
        // Every shard takes a share of the keys.
        assert!(seen.iter().all(|&n| n > 50), "{seen:?}");
    }

    #[test]
    fn stripe_names_and_upload_keys_parse_back() {
        let n = stripe_name(0xfeed_beef_0123_4567, 12, 345);
        assert_eq!(
            parse_stripe_name(&n),
            Some((0xfeed_beef_0123_4567, 12, 345))
        );
        assert_eq!(parse_stripe_name(&stripe_name(1, 0, 0)), Some((1, 0, 0)));
        for bad in [
            &b"s3.data.feedbeef01234567.1"[..],
            b"s3.data.feedbeef0123456.1.2",
            b"s3.data.FEEDBEEF01234567.1.2",
            b"s3.data.feedbeef01234567.1.",
            b"s3.data.feedbeef01234567..2",
            b"s3.data.feedbeef01234567.1.2x",
            b"s3.data.feedbeef01234567.99999999999.2",
            b"s3.index.b/1",
            b"s3.parts.feedbeef01234567",
        ] {
            assert_eq!(
                parse_stripe_name(bad),
                None,
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        assert_eq!(parse_upload_key(&upload_key("a/b", 0xabc)), Some(0xabc));
        assert_eq!(parse_upload_key(&upload_key("", 7)), Some(7));
        assert_eq!(parse_upload_key(b"short"), None);
        let mut no_nul = upload_key("k", 7);
        no_nul[1] = b'x';
        assert_eq!(parse_upload_key(&no_nul), None);
    }

    #[test]
    fn pieces_cover_a_range_across_parts_and_stripes() {
        let mut r = record();
        r.stripe = 2 << 20;
        let parts: Vec<_> = r.parts().collect();
        assert_eq!(parts, [(1, 5 << 20), (2, 5 << 20), (3, 5 << 20), (4, 7)]);
        assert_eq!(r.stripes().count(), 3 * 3 + 1);
        let all = r.pieces(0, r.size);
        assert_eq!(all.iter().map(|p| p.3).sum::<u64>(), r.size);
        assert_eq!(all.len(), 10);
        // A range across the end of part 1 and into part 2.
        let p = r.pieces((5 << 20) - 10, (5 << 20) + 20);
        assert_eq!(p, [(1, 2, (1 << 20) - 10, 10), (2, 0, 0, 20)]);
        assert_eq!(r.pieces(r.size - 1, r.size), [(4, 0, 6, 1)]);
    }

    #[test]
    fn runs_fold_consecutive_equal_parts() {
        let runs = runs_of(&[(1, 8), (2, 8), (3, 8), (5, 8), (6, 2)]);
        assert_eq!(
            runs,
            [
                Run {
                    first: 1,
                    count: 3,
                    size: 8
                },
                Run {
                    first: 5,
                    count: 1,
                    size: 8
                },
                Run {
                    first: 6,
                    count: 1,
                    size: 2
                }
            ]
        );
        assert_eq!(parse_upload_id(&upload_id(0xabc)), Some(0xabc));
        assert_eq!(parse_upload_id("xyz"), None);
    }
}
