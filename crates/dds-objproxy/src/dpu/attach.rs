//! Attaching to the host proxy: the ATTACH handshake on the control socket and the shared
//! region's memfd registered with one DMA engine per lane ([`ProxyObjectStore::connect`]).

use super::channel::{BufPool, Channel, Lane, Pending, ReadLane, WriteLane};
use super::{Counters, DmaFactory, ProxyObjectStore, ProxyOptions, Shared};
use crate::wire::*;
use dds_dma::{DmaEngine, EmulatedDma, LocalBuf, RegionExport};
use dds_objstore::StoreError;
use std::collections::{HashMap, VecDeque};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

impl ProxyObjectStore {
    /// Attaches to the host proxy listening on `socket`: the ATTACH handshake, the region's
    /// memfd registered with one DMA engine per lane.
    pub fn connect(socket: &Path, opts: ProxyOptions) -> Result<ProxyObjectStore, StoreError> {
        let io = |what: &str, e: std::io::Error| StoreError::Io {
            what: format!("object proxy: {what}"),
            source: e,
        };
        let layout = Layout {
            channels: u32::try_from(opts.channels).unwrap_or(u32::MAX),
            max_dma: u32::try_from(opts.max_dma).unwrap_or(u32::MAX),
        };
        layout.validate().map_err(StoreError::InvalidArgument)?;
        let mut s = UnixStream::connect(socket).map_err(|e| io("connect", e))?;
        let mut args = Vec::new();
        put_u32(&mut args, VERSION);
        put_u32(&mut args, layout.channels);
        put_u32(&mut args, layout.max_dma);
        send_frame(&s, F_ATTACH, 1, &args, &[]).map_err(|e| io("attach", e))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(|e| io("attach", e))?;
        let (status, _, body, mut fds) = recv_frame(&mut s, MAX_RESPONSE)
            .map_err(|e| io("attach", e))?
            .ok_or_else(|| proxy_error("attach: the host closed the connection"))?;
        s.set_read_timeout(None).map_err(|e| io("attach", e))?;
        let mut c = Cursor::new(&body);
        if status != 0 {
            return Err(get_error(&mut c).unwrap_or_else(|| proxy_error("attach refused")));
        }
        let bad = || proxy_error("malformed ATTACH reply");
        let (v, ch, md, slots) = (c.u32(), c.u32(), c.u32(), c.u32());
        let (cb, rl) = (c.u64(), c.u64());
        if v != Some(VERSION)
            || ch != Some(layout.channels)
            || md != Some(layout.max_dma)
            || slots != Some(SLOTS as u32)
            || cb != Some(layout.channel_bytes())
            || rl != Some(layout.region_len())
        {
            return Err(bad());
        }
        if fds.len() != 1 + layout.channels as usize {
            return Err(bad());
        }
        let bells: Vec<Arc<OwnedFd>> = fds.drain(1..).map(Arc::new).collect();
        let fd: OwnedFd = fds.pop().ok_or_else(bad)?;
        let factory: DmaFactory = opts.dma.clone().unwrap_or_else(|| {
            let cost = opts.cost_model;
            Arc::new(move || Box::new(EmulatedDma::new(64, cost)) as Box<dyn DmaEngine>)
        });
        let mk_lane = |chan: u32| -> Result<Lane, StoreError> {
            let mut eng = factory();
            let dup = rustix::io::fcntl_dupfd_cloexec(&fd, 0).map_err(|e| io("dup", e.into()))?;
            let region = eng
                .register_region(RegionExport::memfd(dup, layout.region_len()))
                .map_err(|e| proxy_error(format!("register region: {e}")))?;
            Ok(Lane {
                eng,
                region: region.id,
                base: layout.channel(chan),
                small: LocalBuf::new(64, 64),
                next_ud: 0,
                done_writes: Vec::new(),
                bell: bells[chan as usize].clone(),
                rung: 0,
            })
        };
        let mut channels = Vec::new();
        for i in 0..layout.channels {
            channels.push(Channel {
                idx: i,
                pending: Mutex::new(Pending {
                    next_rid: 1,
                    q: VecDeque::new(),
                }),
                cv: Condvar::new(),
                g_done: AtomicU64::new(0),
                failures: Mutex::default(),
                dead: Mutex::default(),
                write: Mutex::new(WriteLane {
                    lane: mk_lane(i)?,
                    seq: 0,
                    ack: LocalBuf::new(ACK_SLOT as usize, 64),
                }),
                read: Mutex::new(ReadLane {
                    lane: mk_lane(i)?,
                    rseq: 0,
                    taken: 0,
                    cseq: 1,
                    next_req: 0,
                    reqs: (0..SLOTS)
                        .map(|_| LocalBuf::new(READ_REQ_BYTES as usize, 64))
                        .collect(),
                    sent: VecDeque::new(),
                    inflight: HashMap::new(),
                    order: VecDeque::new(),
                    done: HashMap::new(),
                    resp: LocalBuf::new(layout.max_dma as usize, 64),
                    freed: LocalBuf::new(8, 8),
                    freed_at: Instant::now(),
                }),
            });
        }
        let watch = s.try_clone().map_err(|e| io("socket", e))?;
        Ok(ProxyObjectStore {
            sh: Arc::new(Shared {
                layout,
                pool: BufPool {
                    size: layout.max_dma as usize,
                    keep: 2 * SLOTS as usize * layout.channels as usize,
                    free: Mutex::default(),
                },
                opts,
                sock: Mutex::new(s),
                watch,
                rpc_id: AtomicU64::new(1),
                channels,
                counters: Counters::default(),
                gone: AtomicBool::new(false),
            }),
        })
    }
}
