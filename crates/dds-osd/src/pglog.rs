//! PG logs: kept as omap entries of a per-PG metadata object, changed in the same transaction
//! as the data they describe (`docs/osd-protocol.md`, "PG log").

use std::sync::Arc;

use dds_objstore::{ObjectId, ObjectStore, StoreError, Transaction, TxOp};

use crate::map::{PgId, META_POOL};
use crate::wire::{Dec, Enc, OpError};

/// Omap key of the PG's version.
pub const HEAD_KEY: &[u8] = b"head";
/// Prefix of the log entries' omap keys.
pub const LOG_PREFIX: &[u8] = b"log.";
/// Prefix of the request ids' omap keys (Ceph's PG log "dups").
pub const DUP_PREFIX: &[u8] = b"dup.";
/// Log entries kept per PG by default.
pub const DEFAULT_MAX_LOG: u64 = 512;
/// Versions whose request ids are kept per PG by default: a retry is recognised while its
/// write is among the PG's last this many.
pub const DEFAULT_MAX_DUPS: u64 = 4096;

/// Kind of change an entry records.
pub const KIND_MODIFY: u8 = 1;
pub const KIND_REMOVE: u8 = 2;

/// One PG log entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    pub version: u64,
    pub kind: u8,
    pub name: Vec<u8>,
    /// The client request that made it (client id, tid); (0, 0) for none.
    pub reqid: (u64, u64),
    /// Map epoch of the primary that assigned the version (0: not recorded).
    pub epoch: u32,
}

impl LogEntry {
    pub fn encode(&self, e: &mut Enc) {
        e.u64(self.version)
            .u8(self.kind)
            .bytes(&self.name)
            .u64(self.reqid.0)
            .u64(self.reqid.1)
            .u32(self.epoch);
    }

    pub fn decode(d: &mut Dec<'_>) -> Result<LogEntry, OpError> {
        Ok(LogEntry {
            version: d.u64()?,
            kind: d.u8()?,
            name: d.bytes()?.to_vec(),
            reqid: (d.u64()?, d.u64()?),
            epoch: d.u32()?,
        })
    }

    /// Decodes a stored entry; entries written before request ids were logged end after the
    /// name and read as (0, 0), those written before epochs were logged read as epoch 0.
    fn decode_stored(v: &[u8]) -> Result<LogEntry, OpError> {
        let mut d = Dec::new(v);
        let (version, kind, name) = (d.u64()?, d.u8()?, d.bytes()?.to_vec());
        let rest = d.rest();
        let (reqid, epoch) = match rest.len() {
            0 => ((0, 0), 0),
            16 | 20 => {
                let mut d = Dec::new(rest);
                let reqid = (d.u64()?, d.u64()?);
                (reqid, if rest.len() == 20 { d.u32()? } else { 0 })
            }
            n => {
                return Err(OpError::new(
                    crate::wire::Status::Io,
                    format!("PG log entry {version} has {n} bytes after its name"),
                ))
            }
        };
        Ok(LogEntry {
            version,
            kind,
            name,
            reqid,
            epoch,
        })
    }
}

/// A PG's log as read from a store: its head, retained entries and request ids (`dup.` keys),
/// both in version order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PgLog {
    pub head: u64,
    pub entries: Vec<LogEntry>,
    /// (version, request id) of the client writes among the last `max_dups` versions.
    pub dups: Vec<(u64, (u64, u64))>,
}

impl PgLog {
    /// The entry of `version`, if retained.
    pub fn entry(&self, version: u64) -> Option<&LogEntry> {
        self.entries
            .binary_search_by_key(&version, |e| e.version)
            .ok()
            .map(|i| &self.entries[i])
    }

    /// The last update: the epoch of the head's entry (0 when not retained) and the head,
    /// compared in this order to find the most up-to-date member.
    pub fn last_update(&self) -> (u32, u64) {
        (self.entry(self.head).map_or(0, |e| e.epoch), self.head)
    }

    /// Every (version, request id) this log knows: the `dup.` keys, and the entries' own
    /// (which are all there is for versions written before `dup.` keys existed).
    pub fn reqids(&self) -> impl Iterator<Item = (u64, (u64, u64))> + '_ {
        let from_entries = self
            .entries
            .iter()
            .filter(|e| e.reqid.0 != 0)
            .map(|e| (e.version, e.reqid));
        self.dups.iter().copied().chain(from_entries)
    }

    pub fn encode(&self, e: &mut Enc) {
        e.u64(self.head).u32(self.entries.len() as u32);
        for en in &self.entries {
            en.encode(e);
        }
        e.u32(self.dups.len() as u32);
        for &(version, (client, tid)) in &self.dups {
            e.u64(version).u64(client).u64(tid);
        }
    }

    pub fn decode(d: &mut Dec<'_>) -> Result<PgLog, OpError> {
        let head = d.u64()?;
        let n = d.u32()?;
        let mut entries = Vec::new();
        for _ in 0..n {
            entries.push(LogEntry::decode(d)?);
        }
        let n = d.u32()?;
        let mut dups = Vec::new();
        for _ in 0..n {
            dups.push((d.u64()?, (d.u64()?, d.u64()?)));
        }
        Ok(PgLog {
            head,
            entries,
            dups,
        })
    }
}

/// The metadata object of a PG.
pub fn meta_oid(pg: PgId) -> ObjectId {
    ObjectId::new(META_POOL, format!("pg.{}.{}", pg.pool, pg.pg))
}

fn log_key(version: u64) -> Vec<u8> {
    let mut k = LOG_PREFIX.to_vec();
    k.extend_from_slice(&version.to_be_bytes());
    k
}

fn dup_key(version: u64) -> Vec<u8> {
    let mut k = DUP_PREFIX.to_vec();
    k.extend_from_slice(&version.to_be_bytes());
    k
}

fn dup_value((client, tid): (u64, u64)) -> Vec<u8> {
    let mut v = client.to_le_bytes().to_vec();
    v.extend_from_slice(&tid.to_le_bytes());
    v
}

/// A stored `dup.` key and value as (version, request id).
fn decode_dup(k: &[u8], v: &[u8]) -> Option<(u64, (u64, u64))> {
    let version = u64::from_be_bytes(k.strip_prefix(DUP_PREFIX)?.try_into().ok()?);
    let (client, tid) = v.split_at_checked(8)?;
    Some((
        version,
        (
            u64::from_le_bytes(client.try_into().ok()?),
            u64::from_le_bytes(tid.try_into().ok()?),
        ),
    ))
}

fn entry_value(entry: &LogEntry) -> Vec<u8> {
    let mut e = Enc::new();
    entry.encode(&mut e);
    e.done()
}

/// How much of a PG's history its metadata object keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Log entries (what an incremental recovery can replay).
    pub max_log: u64,
    /// Versions whose request ids are kept (what a retry is recognised against).
    pub max_dups: u64,
}

impl Default for Retention {
    fn default() -> Retention {
        Retention {
            max_log: DEFAULT_MAX_LOG,
            max_dups: DEFAULT_MAX_DUPS,
        }
    }
}

/// Appends to `tx` the log entry, the new head, the entry's request id (if it has one) and the
/// trims of the entry `max_log` and the request id `max_dups` versions older.
pub fn append_ops(tx: &mut Transaction, pg: PgId, entry: &LogEntry, keep: Retention) {
    let oid = meta_oid(pg);
    let v = entry.version;
    let mut set = vec![
        (HEAD_KEY.to_vec(), v.to_le_bytes().to_vec()),
        (log_key(v), entry_value(entry)),
    ];
    if entry.reqid.0 != 0 {
        set.push((dup_key(v), dup_value(entry.reqid)));
    }
    tx.push(TxOp::OmapSet {
        oid: oid.clone(),
        entries: set,
    });
    let mut trim = Vec::new();
    if v > keep.max_log {
        trim.push(log_key(v - keep.max_log));
    }
    if v > keep.max_dups {
        trim.push(dup_key(v - keep.max_dups));
    }
    if !trim.is_empty() {
        tx.push(TxOp::OmapRm { oid, keys: trim });
    }
}

/// Ops replacing a PG's metadata object by `log` (recovery).
pub fn replace_ops(tx: &mut Transaction, pg: PgId, log: &PgLog) {
    let oid = meta_oid(pg);
    tx.push(TxOp::Touch { oid: oid.clone() });
    tx.push(TxOp::OmapClear { oid: oid.clone() });
    let mut entries = vec![(HEAD_KEY.to_vec(), log.head.to_le_bytes().to_vec())];
    entries.extend(
        log.entries
            .iter()
            .map(|e| (log_key(e.version), entry_value(e))),
    );
    entries.extend(
        log.dups
            .iter()
            .map(|&(v, reqid)| (dup_key(v), dup_value(reqid))),
    );
    tx.push(TxOp::OmapSet { oid, entries });
}

/// The PG's head version in `store` (0 if the PG was never written).
pub fn read_head(store: &Arc<dyn ObjectStore>, pg: PgId) -> Result<u64, StoreError> {
    match store.omap_get(&meta_oid(pg), &[HEAD_KEY.to_vec()]) {
        Ok(v) => Ok(v
            .into_iter()
            .next()
            .flatten()
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
            .unwrap_or(0)),
        Err(StoreError::NotFound(_)) => Ok(0),
        Err(e) => Err(e),
    }
}

/// The PG's whole log in `store`.
pub fn read_log(store: &Arc<dyn ObjectStore>, pg: PgId) -> Result<PgLog, OpError> {
    let head = read_head(store, pg)?;
    let mut log = PgLog {
        head,
        entries: Vec::new(),
        dups: Vec::new(),
    };
    for_each_with_prefix(store, pg, DUP_PREFIX, |k, v| {
        let dup = decode_dup(k, v).ok_or_else(|| {
            OpError::new(
                crate::wire::Status::Io,
                format!(
                    "PG {pg}: malformed request id (key of {} bytes, value of {})",
                    k.len(),
                    v.len()
                ),
            )
        })?;
        log.dups.push(dup);
        Ok(())
    })?;
    for_each_with_prefix(store, pg, LOG_PREFIX, |_, v| {
        log.entries.push(LogEntry::decode_stored(v)?);
        Ok(())
    })?;
    Ok(log)
}

/// Calls `f` on every omap entry of the PG's metadata object whose key starts with `prefix`,
/// in key order.
fn for_each_with_prefix(
    store: &Arc<dyn ObjectStore>,
    pg: PgId,
    prefix: &[u8],
    mut f: impl FnMut(&[u8], &[u8]) -> Result<(), OpError>,
) -> Result<(), OpError> {
    let oid = meta_oid(pg);
    let mut after = prefix.to_vec();
    loop {
        let page = match store.omap_list(&oid, Some(&after), 1024) {
            Ok(p) => p,
            Err(StoreError::NotFound(_)) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        for (k, v) in &page {
            if !k.starts_with(prefix) {
                return Ok(());
            }
            f(k, v)?;
        }
        match page.last() {
            Some((k, _)) => after.clone_from(k),
            None => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_entries_with_and_without_a_request_id() {
        let e = LogEntry {
            version: 9,
            kind: KIND_REMOVE,
            name: b"obj".to_vec(),
            reqid: (77, 3),
            epoch: 5,
        };
        let v = entry_value(&e);
        assert_eq!(LogEntry::decode_stored(&v).unwrap(), e);
        // Written before epochs were logged: epoch 0.
        let no_epoch = LogEntry::decode_stored(&v[..v.len() - 4]).unwrap();
        assert_eq!((no_epoch.reqid, no_epoch.epoch), ((77, 3), 0));
        // Written before request ids were logged: the entry ends after the name.
        let old = &v[..v.len() - 20];
        let got = LogEntry::decode_stored(old).unwrap();
        assert_eq!(got.reqid, (0, 0));
        assert_eq!(
            (got.version, got.kind, got.name),
            (9, KIND_REMOVE, b"obj".to_vec())
        );
        // Anything else after the name is refused.
        assert!(LogEntry::decode_stored(&v[..v.len() - 3]).is_err());
        assert!(LogEntry::decode_stored(&v[..v.len() - 7]).is_err());
    }

    #[test]
    fn a_write_sets_its_request_id_and_trims_the_oldest_kept() {
        let pg = PgId { pool: 1, pg: 3 };
        let entry = |version, reqid| LogEntry {
            version,
            kind: KIND_MODIFY,
            name: b"o".to_vec(),
            reqid,
            epoch: 2,
        };
        let keep = Retention {
            max_log: 4,
            max_dups: 64,
        };
        let mut tx = Transaction::new();
        append_ops(&mut tx, pg, &entry(70, (7, 9)), keep);
        let ops: Vec<&TxOp> = tx.ops.iter().collect();
        let [TxOp::OmapSet { entries, .. }, TxOp::OmapRm { keys, .. }] = ops[..] else {
            panic!("{ops:?}");
        };
        let set: Vec<&[u8]> = entries.iter().map(|(k, _)| k.as_slice()).collect();
        assert_eq!(set, [HEAD_KEY, &log_key(70)[..], &dup_key(70)[..]]);
        assert_eq!(decode_dup(&entries[2].0, &entries[2].1), Some((70, (7, 9))));
        assert_eq!(keys, &[log_key(66), dup_key(6)]);
        // Without a request id nothing is kept for it; before the windows fill nothing is
        // trimmed.
        let mut tx = Transaction::new();
        append_ops(&mut tx, pg, &entry(3, (0, 0)), keep);
        let ops: Vec<&TxOp> = tx.ops.iter().collect();
        let [TxOp::OmapSet { entries, .. }] = ops[..] else {
            panic!("{ops:?}");
        };
        assert_eq!(entries.len(), 2);
        // Malformed stored ids are refused, not misread.
        assert_eq!(decode_dup(&dup_key(1)[..11], &[0; 16]), None);
        assert_eq!(decode_dup(&log_key(1), &[0; 16]), None);
        assert_eq!(decode_dup(&dup_key(1), &[0; 15]), None);
    }

    #[test]
    fn logs_with_request_ids_round_trip_and_refuse_truncation() {
        let log = PgLog {
            head: 12,
            entries: vec![LogEntry {
                version: 12,
                kind: KIND_MODIFY,
                name: b"o".to_vec(),
                reqid: (3, 4),
                epoch: 1,
            }],
            dups: vec![(11, (3, 3)), (12, (3, 4))],
        };
        let mut e = Enc::new();
        log.encode(&mut e);
        let b = e.done();
        let mut d = Dec::new(&b);
        assert_eq!(PgLog::decode(&mut d).unwrap(), log);
        assert!(PgLog::decode(&mut Dec::new(&b[..b.len() - 1])).is_err());
        let versions: Vec<u64> = log.reqids().map(|(v, _)| v).collect();
        assert_eq!(versions, [11, 12, 12]);
    }
}
