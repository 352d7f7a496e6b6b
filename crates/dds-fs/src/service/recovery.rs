//! Recovery: the superblock, the newest checkpoint and the metadata log replayed on top of it
//! (docs/on-disk-format.md §6), shared by `FileService::open` and `check` (`dds fsck`).

use crate::align::AlignedBuf;
use crate::device::Device;
use crate::error::FsError;
use crate::layout::{Geometry, SB_LEN};
use crate::meta::{parse_log_entry, record_seq, LogEntry, MetaState};

/// Metadata recovered from a device: the superblock's geometry, the newest checkpoint and
/// the log replayed on top of it.
pub(super) struct Loaded {
    pub(super) g: Geometry,
    pub(super) align: usize,
    pub(super) meta: MetaState,
    pub(super) active: usize,
    pub(super) generation: u64,
    /// Sequence number of the last record replayed.
    pub(super) seq: u64,
    /// Log offset just past it.
    pub(super) log_end: usize,
    pub(super) replayed: u64,
}

/// Reads and checks the superblock, the newest valid checkpoint and the metadata log
/// (docs/on-disk-format.md §6). A damaged log record followed by valid ones is corruption, not
/// the end of the log.
pub(super) fn load_metadata(dev: &mut dyn Device) -> Result<Loaded, FsError> {
    let dev_bs = dev.block_size();
    let g = match read_superblock(dev)? {
        SbProbe::Found(g) => g,
        SbProbe::Invalid(e) => return Err(FsError::Corrupt(e)),
    };
    if g.block_size % dev_bs != 0 || dev.mem_align() > g.block_size as usize {
        return Err(FsError::Corrupt(format!(
            "formatted block size {} incompatible with device block size {dev_bs}",
            g.block_size
        )));
    }
    if dev.capacity() < u64::from(g.total_segments) * g.segment_size {
        return Err(FsError::Corrupt(format!(
            "device capacity {} smaller than the formatted {} segments",
            dev.capacity(),
            g.total_segments
        )));
    }
    let align = dev.mem_align().max(g.block_size as usize);

    // Newest valid checkpoint.
    let mut slot_buf = AlignedBuf::new(g.ckpt_len as usize, align);
    let mut best: Option<(usize, u64, u64)> = None;
    for slot in 0..2 {
        dev.read_sync(g.ckpt_off[slot], slot_buf.as_mut_slice())
            .map_err(|e| FsError::io("read checkpoint", e))?;
        if let Some((gen, last_seq, _)) = MetaState::checkpoint_header(slot_buf.as_slice(), &g) {
            if best.is_none_or(|(_, bg, _)| gen > bg) {
                best = Some((slot, gen, last_seq));
            }
        }
    }
    let (active, generation, last_seq) =
        best.ok_or_else(|| FsError::Corrupt("no valid checkpoint".into()))?;
    dev.read_sync(g.ckpt_off[active], slot_buf.as_mut_slice())
        .map_err(|e| FsError::io("read checkpoint", e))?;
    let mut meta =
        MetaState::decode_checkpoint(slot_buf.as_slice(), &g).map_err(FsError::Corrupt)?;
    drop(slot_buf);

    // Replay the log.
    let mut log = AlignedBuf::new(g.log_len as usize, align);
    dev.read_sync(g.log_off, log.as_mut_slice())
        .map_err(|e| FsError::io("read metadata log", e))?;
    let mut pos = 0usize;
    let mut seq = last_seq;
    let mut replayed = 0u64;
    loop {
        match parse_log_entry(
            &log.as_slice()[pos..],
            g.fs_uuid,
            seq + 1,
            g.block_size as usize,
        ) {
            LogEntry::Valid(rec, padded) => {
                meta.apply(&rec)
                    .map_err(|e| FsError::Corrupt(format!("log record {}: {e}", seq + 1)))?;
                pos += padded;
                seq += 1;
                replayed += 1;
            }
            LogEntry::Undecodable(e) => return Err(FsError::Corrupt(e)),
            LogEntry::End => {
                // The end of the log, or a damaged record with valid ones after it?
                if let Some((later, at)) =
                    later_record(&log.as_slice()[pos..], g.fs_uuid, seq + 1, g.block_size)
                {
                    return Err(FsError::Corrupt(format!(
                        "metadata log record {} at log offset {pos} is damaged (bad checksum \
                             or header) and record {later} follows it at log offset {}: refusing \
                             to open rather than lose the acknowledged operations after it \
                             (`dds fsck` explains the damage)",
                        seq + 1,
                        pos + at
                    )));
                }
                break;
            }
        }
    }
    drop(log);
    meta.verify().map_err(FsError::Corrupt)?;

    Ok(Loaded {
        g,
        align,
        meta,
        active,
        generation,
        seq,
        log_end: pos,
        replayed,
    })
}

/// The first record for this file system with a sequence number of at least `from` in
/// `log` (block-aligned positions after the start): its sequence number and offset.
fn later_record(log: &[u8], fs_uuid: u64, from: u64, block: u32) -> Option<(u64, usize)> {
    let block = block as usize;
    let mut at = block;
    while at + block <= log.len() {
        if let Some(seq) = record_seq(&log[at..], fs_uuid) {
            if seq >= from {
                return Some((seq, at));
            }
        }
        at += block;
    }
    None
}

/// What `dds fsck` finds on a device.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct CheckReport {
    /// Checkpoint generation in use.
    pub generation: u64,
    /// Log records replayed on top of it.
    pub replayed: u64,
    pub files: u32,
    pub dirs: u32,
    /// What is wrong, if anything (the file service refuses to open the device then).
    pub damage: Option<String>,
}

/// Checks a device's metadata without changing anything: what `FileService::open` would
/// recover, or why it refuses.
pub fn check(dev: &mut dyn Device) -> CheckReport {
    match load_metadata(dev) {
        Ok(l) => CheckReport {
            generation: l.generation,
            replayed: l.replayed,
            files: l.meta.nfiles,
            dirs: l.meta.ndirs(),
            damage: None,
        },
        Err(e) => CheckReport {
            generation: 0,
            replayed: 0,
            files: 0,
            dirs: 0,
            damage: Some(e.to_string()),
        },
    }
}

enum SbProbe {
    Found(Geometry),
    Invalid(String),
}

fn read_superblock(dev: &mut dyn Device) -> Result<SbProbe, FsError> {
    let dev_bs = dev.block_size() as usize;
    let align = dev.mem_align().max(dev_bs);
    let mut buf = AlignedBuf::new(dev_bs.max(SB_LEN), align);
    dev.read_sync(0, buf.as_mut_slice())
        .map_err(|e| FsError::io("read superblock", e))?;
    let primary = match Geometry::decode_superblock(buf.as_slice()) {
        Ok(g) => return Ok(SbProbe::Found(g)),
        Err(e) => e,
    };
    // The backup sits one formatted block further; try every plausible block size.
    let mut b = dev_bs.max(512);
    while b <= 64 * 1024 && (2 * b) as u64 <= dev.capacity() {
        dev.read_sync(b as u64, buf.as_mut_slice())
            .map_err(|e| FsError::io("read backup superblock", e))?;
        if let Ok(g) = Geometry::decode_superblock(buf.as_slice()) {
            if g.block_size as usize == b {
                tracing::warn!(error = %primary, "primary superblock invalid, using backup");
                return Ok(SbProbe::Found(g));
            }
        }
        b *= 2;
    }
    Ok(SbProbe::Invalid(primary))
}
