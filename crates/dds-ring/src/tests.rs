use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use dds_dma::{DmaEngine, EmulatedDma};
use dds_shm::SharedRegion;

use crate::register_local;

use crate::*;

struct ReqRing {
    producer: Arc<RequestProducer>,
    consumer: RequestConsumer,
    dma: EmulatedDma,
}

/// A request ring at offset 4096 of a region (something else in front of it).
fn req_ring(capacity: u64, m: u64) -> ReqRing {
    let offset = 4096;
    let region = Arc::new(
        SharedRegion::create("req", offset + POINTER_AREA_BYTES + capacity as usize).unwrap(),
    );
    let mut dma = EmulatedDma::new(16, None);
    let id = register_local(&mut dma, &region).unwrap();
    let producer = RequestProducer::with_region(region, offset, capacity, m);
    producer.init();
    ReqRing {
        producer: Arc::new(producer),
        consumer: RequestConsumer::new(id, offset as u64, capacity).unwrap(),
        dma,
    }
}

/// Drains everything available: (pos, kind, bytes) of each record; releases it all.
fn drain(r: &mut ReqRing) -> Vec<(u64, u16, Vec<u8>)> {
    let mut out = Vec::new();
    while r.consumer.poll(&mut r.dma).unwrap() {
        let (from, to) = (r.consumer.released(), r.consumer.fetched());
        for rec in r.consumer.records(from..to) {
            let rec = rec.unwrap();
            out.push((rec.pos, rec.kind, rec.bytes.to_vec()));
        }
        r.consumer.release(to, &mut r.dma).unwrap();
    }
    out
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

#[test]
fn request_records_round_trip_with_gather_and_alignment() {
    let mut r = req_ring(1 << 16, 1 << 16);
    let header: Vec<u8> = (0..26).collect();
    let a: Vec<u8> = (0..300).map(|i| i as u8).collect();
    let b: Vec<u8> = (0..213).map(|i| (i * 7) as u8).collect();
    let p0 = r.producer.try_push(2, &header, &[&a, &b], 512).unwrap();
    let p1 = r.producer.try_push(1, &header[..2], &[], 8).unwrap();
    let recs = drain(&mut r);
    assert_eq!(recs.len(), 2);
    let (pos, kind, bytes) = &recs[0];
    assert_eq!((*pos, *kind), (p0, 2));
    // 32-byte header, data at a multiple of 512.
    assert_eq!((pos + 32) % 512, 0);
    assert_eq!(le32(bytes, 0) as usize, bytes.len());
    assert_eq!(bytes.len(), 32 + 520);
    assert_eq!(&bytes[6..32], &header[..]);
    assert_eq!(&bytes[32..332], &a[..]);
    assert_eq!(&bytes[332..545], &b[..]);
    assert!(
        bytes[545..].iter().all(|&x| x == 0),
        "tail padding is zeroed"
    );
    // The data is 512-aligned in the mirror too (zero-copy O_DIRECT).
    let data_addr =
        r.consumer.mirror_ptr() as usize + ((pos + 32) % r.consumer.capacity()) as usize;
    assert_eq!(data_addr % 512, 0);
    let (pos, kind, bytes) = &recs[1];
    assert_eq!((*pos, *kind, bytes.len()), (p1, 1, 8));
    assert_eq!(&bytes[6..8], &header[..2]);
    assert_eq!(r.producer.head(), r.producer.tail());
    assert_eq!(r.consumer.released(), r.producer.tail());
}

#[test]
fn request_ring_wraps_with_pads() {
    let cap = 4096u64;
    let mut r = req_ring(cap, cap);
    let mut expected = Vec::new();
    let mut got = Vec::new();
    for i in 0..200u32 {
        // Sizes that do not divide the ring, some aligned: pads at the end and for alignment.
        let len = (i * 37 % 700) as usize;
        let data: Vec<u8> = (0..len).map(|j| (i as usize + j) as u8).collect();
        let align = if i % 3 == 0 { 256 } else { 8 };
        loop {
            match r.producer.try_push(7, &i.to_le_bytes(), &[&data], align) {
                Ok(_) => break,
                Err(RingError::Retry) => got.extend(drain(&mut r)),
                Err(e) => panic!("{e}"),
            }
        }
        expected.push((i, data, align));
    }
    got.extend(drain(&mut r));
    assert_eq!(got.len(), expected.len());
    for ((pos, kind, bytes), (i, data, align)) in got.iter().zip(&expected) {
        assert_eq!(*kind, 7);
        assert_eq!(le32(bytes, 6), *i);
        assert_eq!(&bytes[16..16 + data.len()], &data[..]);
        assert_eq!((pos + 16) % *align as u64, 0);
        // Never crosses the end of the ring.
        assert!(pos % cap + bytes.len() as u64 <= cap);
    }
    assert!(r.producer.tail() > 10 * cap, "wrapped many times");
}

#[test]
fn retry_on_max_progress_and_too_large() {
    // M = 64 bytes: four 16-byte messages, then Retry until the DPU releases.
    let mut r = req_ring(4096, 64);
    for _ in 0..4 {
        r.producer.try_send(&[1; 8]).unwrap();
    }
    assert_eq!(r.producer.try_send(&[1; 8]), Err(RingError::Retry));
    assert_eq!(drain(&mut r).len(), 4);
    r.producer.try_send(&[1; 8]).unwrap();
    // Larger than half the ring: never fits.
    assert_eq!(
        r.producer.try_push(1, &[], &[&[0u8; 2041]], 8),
        Err(RingError::TooLarge)
    );
    assert_eq!(
        r.producer.try_push(1, &[], &[&[0u8; 2040]], 8).map(|_| ()),
        Err(RingError::Retry)
    );
    drain(&mut r);
    // An empty ring admits a record larger than M.
    r.producer.try_push(1, &[], &[&[0u8; 2040]], 8).unwrap();
    assert!(r.producer.fits(8, 2040, 8) && !r.producer.fits(8, 2040, 16));
}

#[test]
fn consumer_waits_for_progress_and_skips_abandoned_reservations() {
    let mut r = req_ring(4096, 4096);
    let mut res = r.producer.reserve(3, 16, 8, 8).unwrap();
    res.header_mut().copy_from_slice(&[9; 10]);
    res.data_mut().copy_from_slice(&[5; 8]);
    r.producer.try_push(4, &[], &[b"after"], 8).unwrap();
    // Tail is ahead of Progress: Retry.
    assert!(!r.consumer.poll(&mut r.dma).unwrap());
    assert_eq!(r.consumer.fetched(), 0);
    res.commit();
    // An abandoned reservation becomes a PAD.
    drop(r.producer.reserve(5, 8, 100, 8).unwrap());
    r.producer.try_push(6, &[], &[b"last"], 8).unwrap();
    let recs = drain(&mut r);
    let kinds: Vec<u16> = recs.iter().map(|x| x.1).collect();
    assert_eq!(kinds, [3, 4, 6]);
    assert_eq!(&recs[0].2[6..16], &[9; 10]);
    assert_eq!(&recs[0].2[16..24], &[5; 8]);
    assert_eq!(&recs[1].2[8..13], b"after");
}

#[test]
fn consumer_reports_corrupt_pointers() {
    let capacity = 4096;
    let region = SharedRegion::create("bad", POINTER_AREA_BYTES + capacity).unwrap();
    let mut dma = EmulatedDma::new(4, None);
    let id = register_local(&mut dma, &region).unwrap();
    let mut c = RequestConsumer::new(id, 0, capacity as u64).unwrap();
    // SAFETY: the test owns the region; nothing else touches it.
    unsafe {
        let p = region.as_ptr();
        (p.add(REQ_PROGRESS) as *mut u64).write(8192);
        (p.add(REQ_TAIL) as *mut u64).write(8192);
    }
    assert!(matches!(c.poll(&mut dma), Err(RingFault::Corrupt(_))));
    // SAFETY: as above.
    unsafe {
        let p = region.as_ptr();
        (p.add(REQ_PROGRESS) as *mut u64).write(16);
        (p.add(REQ_TAIL) as *mut u64).write(16);
        // A record claiming 24 bytes where only 16 exist.
        p.add(POINTER_AREA_BYTES).write(24);
    }
    assert!(c.poll(&mut dma).unwrap());
    let mut it = c.records(0..16);
    assert!(matches!(it.next(), Some(Err(RingFault::Corrupt(_)))));
    assert!(it.next().is_none());
}

/// 64 producer threads through the real EmulatedDma; a DPU consumer thread checks that every
/// message arrives exactly once and in per-producer order.
#[test]
fn stress_64_producers_exactly_once_in_order() {
    const PRODUCERS: usize = 64;
    const PER: u32 = 2000;
    let mut r = req_ring(1 << 15, 1 << 14);
    let producer = r.producer.clone();
    let handles: Vec<_> = (0..PRODUCERS as u32)
        .map(|id| {
            let p = producer.clone();
            std::thread::spawn(move || {
                for seq in 0..PER {
                    // Mixed sizes and alignments: pads of both kinds appear.
                    let extra = (seq % 5) as usize * 24;
                    let mut msg = vec![0u8; 8 + extra];
                    msg[..4].copy_from_slice(&id.to_le_bytes());
                    msg[4..8].copy_from_slice(&seq.to_le_bytes());
                    let align = if seq % 7 == 0 { 128 } else { 8 };
                    while let Err(e) = p.try_push(9, &[], &[&msg], align) {
                        assert_eq!(e, RingError::Retry);
                        std::thread::yield_now();
                    }
                }
            })
        })
        .collect();
    let consumer = std::thread::spawn(move || {
        let mut next = vec![0u32; PRODUCERS];
        let mut total = 0usize;
        while total < PRODUCERS * PER as usize {
            if !r.consumer.poll(&mut r.dma).unwrap() {
                std::thread::yield_now();
                continue;
            }
            let (from, to) = (r.consumer.released(), r.consumer.fetched());
            for rec in r.consumer.records(from..to) {
                let rec = rec.unwrap();
                let id = le32(rec.bytes, 8) as usize;
                let seq = le32(rec.bytes, 12);
                assert_eq!(seq, next[id], "producer {id} out of order");
                assert_eq!(rec.bytes.len(), 8 + 8 + (seq % 5) as usize * 24);
                next[id] += 1;
                total += 1;
            }
            r.consumer.release(to, &mut r.dma).unwrap();
        }
        // Nothing more arrives.
        assert!(!r.consumer.poll(&mut r.dma).unwrap());
        next
    });
    for h in handles {
        h.join().unwrap();
    }
    let next = consumer.join().unwrap();
    assert!(next.iter().all(|&n| n == PER));
}

struct RespRing {
    consumer: Arc<ResponseConsumer>,
    producer: ResponseProducer,
    dma: EmulatedDma,
}

fn resp_ring(capacity: u64) -> RespRing {
    let offset = 8192;
    let region = Arc::new(
        SharedRegion::create("resp", offset + POINTER_AREA_BYTES + capacity as usize).unwrap(),
    );
    let mut dma = EmulatedDma::new(16, None);
    let id = register_local(&mut dma, &region).unwrap();
    let consumer = ResponseConsumer::with_region(region, offset, capacity);
    consumer.init();
    RespRing {
        consumer: Arc::new(consumer),
        producer: ResponseProducer::new(id, offset as u64, capacity).unwrap(),
        dma,
    }
}

/// Allocates and fills one response carrying `value` in its header and `data_len` bytes.
fn respond(r: &mut RespRing, value: u32, data_len: u32, align: u32) -> Option<Placement> {
    let p = r
        .producer
        .alloc(&mut r.dma, 2, 16, data_len, align)
        .unwrap()?;
    let rec = r.producer.record_mut(&p);
    rec[8..12].copy_from_slice(&value.to_le_bytes());
    rec[12..16].copy_from_slice(&data_len.to_le_bytes());
    for (i, b) in rec[16..16 + data_len as usize].iter_mut().enumerate() {
        *b = (value as usize + i) as u8;
    }
    Some(p)
}

fn check_response(rec: &[u8]) -> u32 {
    let value = le32(rec, 8);
    let data_len = le32(rec, 12) as usize;
    assert_eq!(le32(rec, 0) as usize, rec.len());
    assert_eq!(u16::from_le_bytes([rec[4], rec[5]]), 2);
    for (i, b) in rec[16..16 + data_len].iter().enumerate() {
        assert_eq!(*b, (value as usize + i) as u8);
    }
    value
}

#[test]
fn response_ring_delivers_in_order_and_reuses_space() {
    let cap = 4096;
    let mut r = resp_ring(cap);
    assert!(r.consumer.try_pop(|_| ()).is_none());
    let mut next_value = 0u32;
    let mut popped = Vec::new();
    for round in 0..50u32 {
        // Fill until the DPU finds no room, deliver, then consume part of it.
        let mut placed = 0;
        while let Some(p) = respond(
            &mut r,
            next_value,
            (round * 53 + next_value * 11) % 900,
            64 << (next_value % 3),
        ) {
            assert_eq!(p.end, r.producer.allocated());
            next_value += 1;
            placed += 1;
        }
        assert!(placed > 0 || round > 0);
        let upto = r.producer.allocated();
        assert!(!r.producer.deliver(upto, &mut r.dma).unwrap(), "no sleeper");
        assert_eq!(r.consumer.tail(), upto);
        while let Some(v) = r.consumer.try_pop(check_response) {
            popped.push(v);
        }
        assert!(r.consumer.is_empty());
    }
    assert_eq!(popped, (0..next_value).collect::<Vec<_>>());
    assert!(r.producer.delivered() > 20 * cap);
    assert_eq!(r.consumer.head_done(), r.producer.delivered());
}

#[test]
fn response_alloc_waits_for_consumers_and_reports_waiters() {
    let mut r = resp_ring(4096);
    // Two records of 2 KiB fill the ring.
    assert!(respond(&mut r, 1, 2032, 8).is_some());
    assert!(respond(&mut r, 2, 2032, 8).is_some());
    assert!(respond(&mut r, 3, 8, 8).is_none());
    assert_eq!(
        r.producer.alloc(&mut r.dma, 2, 16, 4096, 8),
        Err(RingFault::TooLarge)
    );
    r.consumer.waiters().fetch_add(1, Ordering::SeqCst);
    assert!(r
        .producer
        .deliver(r.producer.allocated(), &mut r.dma)
        .unwrap());
    r.consumer.waiters().fetch_sub(1, Ordering::SeqCst);
    // A claimed but unfinished record keeps the space: HeadDone != HeadClaim.
    let c = r.consumer.clone();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let (started_tx, started_rx) = std::sync::mpsc::channel::<()>();
    let slow = std::thread::spawn(move || {
        c.try_pop(|rec| {
            started_tx.send(()).unwrap();
            rx.recv().unwrap();
            check_response(rec)
        })
    });
    started_rx.recv().unwrap();
    assert_eq!(r.consumer.try_pop(check_response), Some(2));
    assert!(
        respond(&mut r, 3, 8, 8).is_none(),
        "HeadDone is not trusted while a claim is open"
    );
    tx.send(()).unwrap();
    assert_eq!(slow.join().unwrap(), Some(1));
    assert!(respond(&mut r, 3, 8, 8).is_some());
    assert_eq!(r.producer.freed(), r.producer.delivered());
}

#[test]
fn sleepers_announce_themselves_and_are_reported() {
    let mut r = resp_ring(4096);
    assert!(r.consumer.announce_sleep(), "empty: sleep");
    assert_eq!(r.consumer.waiters().load(Ordering::SeqCst), 1);
    respond(&mut r, 7, 8, 8).unwrap();
    assert!(
        r.producer
            .deliver(r.producer.allocated(), &mut r.dma)
            .unwrap(),
        "signal the sleeper"
    );
    r.consumer.end_sleep();
    // A record is there: do not sleep.
    assert!(!r.consumer.announce_sleep());
    r.consumer.end_sleep();
    assert_eq!(r.consumer.try_pop(check_response), Some(7));
    respond(&mut r, 8, 8, 8).unwrap();
    assert!(
        !r.producer
            .deliver(r.producer.allocated(), &mut r.dma)
            .unwrap(),
        "nobody sleeps"
    );
    assert_eq!(r.producer.refresh(&mut r.dma).unwrap(), 0);
}

#[test]
fn response_ring_many_consumers_exactly_once() {
    const N: u32 = 20_000;
    const CONSUMERS: usize = 6;
    let mut r = resp_ring(1 << 14);
    let done = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Vec::with_capacity(N as usize)));
    let handles: Vec<_> = (0..CONSUMERS)
        .map(|_| {
            let c = r.consumer.clone();
            let done = done.clone();
            let seen = seen.clone();
            std::thread::spawn(move || {
                let mut mine = Vec::new();
                loop {
                    match c.try_pop(check_response) {
                        Some(v) => mine.push(v),
                        None if done.load(Ordering::Acquire) && c.is_empty() => break,
                        None => std::thread::yield_now(),
                    }
                }
                // Each consumer sees its records in delivery order.
                assert!(mine.windows(2).all(|w| w[0] < w[1]));
                seen.lock().unwrap().extend(mine);
            })
        })
        .collect();
    let mut v = 0;
    while v < N {
        match respond(&mut r, v, v % 300, if v % 4 == 0 { 512 } else { 8 }) {
            Some(_) => v += 1,
            None => {
                let upto = r.producer.allocated();
                r.producer.deliver(upto, &mut r.dma).unwrap();
                std::thread::yield_now();
            }
        }
        if v % 16 == 0 {
            let upto = r.producer.allocated();
            r.producer.deliver(upto, &mut r.dma).unwrap();
        }
    }
    let upto = r.producer.allocated();
    r.producer.deliver(upto, &mut r.dma).unwrap();
    done.store(true, Ordering::Release);
    for h in handles {
        h.join().unwrap();
    }
    let mut seen = Arc::try_unwrap(seen).unwrap().into_inner().unwrap();
    seen.sort_unstable();
    assert_eq!(seen, (0..N).collect::<Vec<_>>());
}

/// Runs `producers` threads sending `per` messages each through a baseline ring and checks
/// exactly-once, per-producer-order delivery.
fn check_message_ring(
    producer: Arc<dyn RingProducer>,
    mut consumer: Box<dyn RingConsumer>,
    mut dma: EmulatedDma,
) {
    const PRODUCERS: u32 = 8;
    const PER: u32 = 500;
    let handles: Vec<_> = (0..PRODUCERS)
        .map(|id| {
            let p = producer.clone();
            std::thread::spawn(move || {
                for seq in 0..PER {
                    let mut msg = [0u8; 12];
                    msg[..4].copy_from_slice(&id.to_le_bytes());
                    msg[4..8].copy_from_slice(&seq.to_le_bytes());
                    while p.try_send(&msg[..8 + (seq % 2) as usize * 4]) == Err(RingError::Retry) {
                        std::thread::yield_now();
                    }
                }
            })
        })
        .collect();
    let mut next = [0u32; PRODUCERS as usize];
    let mut total = 0;
    while total < PRODUCERS * PER {
        let n = consumer
            .poll_batch(&mut dma, &mut |m| {
                let id = le32(m, 0) as usize;
                let seq = le32(m, 4);
                assert_eq!(seq, next[id]);
                assert_eq!(m.len(), 8 + (seq % 2) as usize * 4);
                next[id] += 1;
            })
            .unwrap();
        total += n as u32;
        if n == 0 {
            std::thread::yield_now();
        }
    }
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(
        consumer
            .poll_batch(&mut dma, &mut |_| panic!("extra message"))
            .unwrap(),
        0
    );
}

#[test]
fn progress_ring_through_message_interface() {
    let r = req_ring(4096, 4096);
    check_message_ring(r.producer, Box::new(r.consumer), r.dma);
}

#[test]
fn lock_based_ring_delivers_exactly_once() {
    let capacity = 4096;
    let region = Arc::new(SharedRegion::create("lock", POINTER_AREA_BYTES + capacity).unwrap());
    let mut dma = EmulatedDma::new(8, None);
    let id = register_local(&mut dma, &region).unwrap();
    let p = LockedProducer::with_region(region, 0, capacity as u64, capacity as u64);
    p.init();
    check_message_ring(
        Arc::new(p),
        Box::new(RequestConsumer::new(id, 0, capacity as u64).unwrap()),
        dma,
    );
}

#[test]
fn farm_ring_delivers_exactly_once_with_two_dma_ops_per_message() {
    let (slots, slot_bytes) = (16u64, 32usize);
    let region = Arc::new(SharedRegion::create("farm", 4096).unwrap());
    let mut dma = EmulatedDma::new(8, None);
    let id = register_local(&mut dma, &region).unwrap();
    let p = FarmProducer::with_region(region, 64, slots, slot_bytes);
    p.init();
    assert_eq!(p.try_send(&[0; 17]), Err(RingError::TooLarge));
    check_message_ring(
        Arc::new(p),
        Box::new(FarmConsumer::new(id, 64, slots, slot_bytes)),
        dma,
    );
}

#[test]
fn farm_consumer_issues_a_read_and_a_write_per_message() {
    let region = Arc::new(SharedRegion::create("farm", 4096).unwrap());
    let mut dma = EmulatedDma::new(8, None);
    let id = register_local(&mut dma, &region).unwrap();
    let p = FarmProducer::with_region(region, 0, 8, 24);
    p.init();
    let mut c = FarmConsumer::new(id, 0, 8, 24);
    for i in 0..5u64 {
        p.try_send(&i.to_le_bytes()).unwrap();
    }
    let mut got = Vec::new();
    assert_eq!(
        c.poll_batch(&mut dma, &mut |m| got.push(m.to_vec()))
            .unwrap(),
        5
    );
    assert_eq!(got[4], 4u64.to_le_bytes());
    let s = dma.stats();
    // One read per message plus the final empty poll; one write per message.
    assert_eq!((s.reads, s.writes), (6, 5));
    // Ring of 8: full after 8 more, free again after the DPU clears.
    for i in 0..8u64 {
        p.try_send(&i.to_le_bytes()).unwrap();
    }
    assert_eq!(p.try_send(&[0; 8]), Err(RingError::Retry));
    assert_eq!(c.poll_batch(&mut dma, &mut |_| ()).unwrap(), 8);
    p.try_send(&[0; 8]).unwrap();
}

#[test]
fn progress_consumer_uses_three_dma_ops_per_batch() {
    let mut r = req_ring(1 << 16, 1 << 16);
    for i in 0..1000u64 {
        r.producer.try_send(&i.to_le_bytes()).unwrap();
    }
    let mut seen = HashSet::new();
    let n = r
        .consumer
        .poll_batch(&mut r.dma, &mut |m| {
            seen.insert(u64::from_le_bytes(m.try_into().unwrap()));
        })
        .unwrap();
    assert_eq!((n, seen.len()), (1000, 1000));
    let s = r.dma.stats();
    assert_eq!((s.reads, s.writes), (2, 1));
}

#[test]
fn counters_are_exposed() {
    let r = req_ring(4096, 4096);
    r.producer.try_send(&[0; 8]).unwrap();
    assert_eq!(
        (r.producer.tail(), r.producer.progress(), r.producer.head()),
        (16, 16, 0)
    );
}

/// Completions of `dma` so far, as results (the engine must have them all submitted).
fn completions(dma: &mut EmulatedDma) -> Vec<(u64, Result<(), dds_dma::DmaError>)> {
    let mut out = Vec::new();
    dds_dma::wait_all(dma, |c| out.push((c.user_data, c.result)));
    out
}

/// The fetch cycle in steps: one step in flight at a time, completions carry the caller's
/// user data, new bytes show only once the data reads complete.
#[test]
fn fetch_steps_post_once_and_complete_by_user_data() {
    let mut r = req_ring(4096, 4096);
    r.producer.try_push(1, &[], &[b"async"], 8).unwrap();
    assert_eq!(r.consumer.post_fetch(&mut r.dma, 41).unwrap(), 1);
    // The pointer read is in flight: nothing more to post.
    assert_eq!(r.consumer.post_fetch(&mut r.dma, 41).unwrap(), 0);
    assert_eq!(r.consumer.dma_inflight(), 1);
    let c = completions(&mut r.dma);
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].0, 41);
    assert!(!r.consumer.complete_fetch(c[0].1.clone()).unwrap());
    assert!(r.consumer.fetching());
    assert_eq!(r.consumer.fetched(), 0);
    // The data read.
    assert_eq!(r.consumer.post_fetch(&mut r.dma, 42).unwrap(), 1);
    let c = completions(&mut r.dma);
    assert_eq!(c[0].0, 42);
    assert!(r.consumer.complete_fetch(c[0].1.clone()).unwrap());
    assert!(!r.consumer.fetching());
    assert_eq!(r.consumer.fetched(), 16);
    // Release posts one Head write; a second target waits for it.
    r.consumer.release_to(16);
    assert_eq!(r.consumer.post_release(&mut r.dma, 7).unwrap(), 1);
    assert_eq!(r.consumer.post_release(&mut r.dma, 7).unwrap(), 0);
    let c = completions(&mut r.dma);
    r.consumer.complete_release(c[0].1.clone()).unwrap();
    assert_eq!(r.producer.head(), 16);
    assert_eq!(r.consumer.dma_inflight(), 0);
}

/// Completions nobody posted, operations out of bounds and regions unregistered under
/// in-flight operations are errors, not panics, and leave nothing in flight.
#[test]
fn unexpected_completions_and_dma_errors_are_errors() {
    let mut r = req_ring(4096, 4096);
    assert!(r.consumer.complete_fetch(Ok(())).is_err());
    assert!(r.consumer.complete_release(Ok(())).is_err());
    assert!(r.consumer.complete_sleeping(Ok(())).is_err());
    // The region goes away while the pointer read is in flight.
    let id = r.consumer.region();
    assert_eq!(r.consumer.post_fetch(&mut r.dma, 1).unwrap(), 1);
    r.dma.submit();
    r.dma.unregister_region(id).unwrap();
    let c = completions(&mut r.dma);
    assert_eq!(
        r.consumer.complete_fetch(c[0].1.clone()),
        Err(RingFault::Dma(dds_dma::DmaError::UnknownRegion(id.0)))
    );
    assert_eq!(r.consumer.dma_inflight(), 0);
    // Later posts fail at once.
    assert!(matches!(
        r.consumer.post_fetch(&mut r.dma, 1),
        Err(RingFault::Dma(dds_dma::DmaError::UnknownRegion(_)))
    ));
    assert_eq!(r.dma.outstanding(), 0);

    // A ring that does not fit its region is refused; one whose region lies about its length
    // fails at post with OutOfBounds.
    let region = SharedRegion::create("small", 4096).unwrap();
    let mut dma = EmulatedDma::new(4, None);
    let reg = register_local(&mut dma, &region).unwrap();
    assert!(matches!(
        RequestConsumer::new(reg, 0, 4096),
        Err(RingFault::Layout(_))
    ));
    assert!(matches!(
        ResponseProducer::new(reg, 32, 1024),
        Err(RingFault::Layout(_))
    ));
    let forged = dds_dma::Region {
        id: reg.id,
        len: 1 << 20,
    };
    let mut c = RequestConsumer::new(forged, 8192, 4096).unwrap();
    assert!(matches!(
        c.post_fetch(&mut dma, 0),
        Err(RingFault::Dma(dds_dma::DmaError::OutOfBounds { .. }))
    ));
    assert_eq!((c.dma_inflight(), dma.outstanding()), (0, 0));
}

/// A delivery in steps: `delivered` moves only when its last operation completes; a second
/// delivery waits for the first.
#[test]
fn delivery_steps_complete_in_order() {
    let mut r = resp_ring(4096);
    let p = respond(&mut r, 5, 8, 8).unwrap();
    let n = r.producer.post_deliver(p.end, &mut r.dma, 9).unwrap();
    assert_eq!(n, 3); // data, Tail, Waiters
    assert_eq!(r.producer.delivering(), p.end);
    assert_eq!(r.producer.delivered(), 0);
    let q = respond(&mut r, 6, 8, 8).unwrap();
    assert_eq!(r.producer.post_deliver(q.end, &mut r.dma, 9).unwrap(), 0);
    let c = completions(&mut r.dma);
    assert!(c.iter().all(|(u, _)| *u == 9));
    let done: Vec<_> = c
        .into_iter()
        .map(|(_, res)| r.producer.complete_deliver(res).unwrap())
        .collect();
    assert_eq!(done, [None, None, Some(false)]);
    assert_eq!(r.producer.delivered(), p.end);
    assert_eq!(r.consumer.try_pop(check_response), Some(5));
    assert!(r.producer.complete_deliver(Ok(())).is_err());
    assert!(r.producer.complete_refresh(Ok(())).is_err());
}
