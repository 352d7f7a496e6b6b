//! The engines `dds kv` serves from: the hybrid log on DDS files ([`Store`]), and the
//! in-memory MICA-style store of DPU-KV ([`MemEngine`], `dds kv --engine memory`).

use std::collections::BTreeSet;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Result;
use dds_kvmem::KvError;
use dds_storage::fileio::{FileIo, IoDone};

use crate::collection::CollType;
use crate::collmap::Hash;
use crate::store::{
    Durability, Expiry, Fetched, Modifier, Modify, OldValue, SetCond, Store, StoreError,
    StoreResult,
};

/// What the Redis commands need from an engine.
pub trait Engine: Send {
    /// GET: calls `f` with the value (or `None`).
    fn get_with(&mut self, key: &[u8], f: &mut dyn FnMut(Option<&[u8]>)) -> StoreResult<()>;
    /// Whether `key` exists.
    fn exists(&mut self, key: &[u8]) -> StoreResult<bool>;
    /// SET under `cond` and `expiry`; `old` gets the previous value first.
    fn set(
        &mut self,
        key: &[u8],
        value: &[u8],
        cond: SetCond,
        expiry: Expiry,
        old: Option<OldValue<'_>>,
    ) -> StoreResult<bool>;
    /// The key's expiry (Unix ms; `Some(0)`: none), or `None` when the key is missing.
    fn expiry(&mut self, key: &[u8]) -> StoreResult<Option<u64>>;
    /// Sets the key's expiry (Unix ms; 0 removes it), keeping its value; false when missing.
    fn set_expiry(&mut self, key: &[u8], expire_ms: u64) -> StoreResult<bool>;
    /// DEL: whether it existed.
    fn del(&mut self, key: &[u8]) -> StoreResult<bool>;
    /// GETDEL.
    fn take_with(&mut self, key: &[u8], f: OldValue<'_>) -> StoreResult<bool>;
    /// INCRBY.
    fn incr_by(&mut self, key: &[u8], by: i64) -> StoreResult<i64>;
    /// Read-modify-write of a value ([`Store::modify`]): `f` gets the value and an empty
    /// buffer for the new one; [`Modify::Write`] stores it, keeping the key's expiry.
    fn modify(&mut self, key: &[u8], f: Modifier<'_>) -> StoreResult<()>;
    /// APPEND: the new length.
    fn append_value(&mut self, key: &[u8], data: &[u8]) -> StoreResult<usize>;
    /// STRLEN.
    fn strlen(&mut self, key: &[u8]) -> StoreResult<usize>;
    /// FLUSHDB.
    fn flush_all(&mut self) -> StoreResult<()>;
    /// One SCAN step from `cursor`: `f` gets each live key of the step (about `count`;
    /// expired keys are skipped, and removed with `reap`); returns the next cursor, 0 when
    /// the walk is complete. A key present for the whole walk is returned at least once.
    fn scan(
        &mut self,
        cursor: u64,
        count: usize,
        reap: bool,
        f: &mut dyn FnMut(&[u8]),
    ) -> StoreResult<u64>;
    /// The log addresses of the records on storage the SCAN step from `cursor` reads
    /// (fetched ahead by the server; engines without storage: none).
    fn scan_storage(&self, _cursor: u64, _count: usize, _f: &mut dyn FnMut(u64)) {}
    /// RANDOMKEY: `f` gets a live key; false when there is none.
    fn random_key(&mut self, f: &mut dyn FnMut(&[u8])) -> StoreResult<bool>;
    /// Chooses the key the next RANDOMKEY answers; the log address of its record when it must
    /// be read from storage first (engines without storage: none).
    fn pick_random(&mut self) -> Option<u64> {
        None
    }
    /// One run of the active expiry cycle within `budget`; the keys removed.
    fn active_expire(&mut self, budget: Duration) -> u64;
    /// Keys removed because their expiry passed.
    fn expired_keys(&self) -> u64;
    /// Keys.
    fn len(&self) -> u64;
    /// Keys with an expiry.
    fn expiring(&self) -> u64;
    /// The mean time to live of the keys with an expiry, in ms (0: not known).
    fn avg_ttl(&self) -> u64 {
        0
    }
    /// No keys.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// What survives a restart.
    fn durability(&self) -> Durability;
    /// Makes the writes so far durable (engines without durability do nothing).
    fn commit(&mut self) -> StoreResult<()>;
    /// Drops stale DPU cache entries before a round's replies.
    fn invalidate_now(&mut self) -> StoreResult<()>;
    /// `CONFIG GET` parameters (name, value).
    fn config_params(&self) -> Vec<(&'static str, String)>;
    /// Lines of the engine's INFO section (`name:value`).
    fn info(&self) -> Vec<(&'static str, String)>;
    /// Largest key and value.
    fn limits(&self) -> (usize, usize);
    /// Closes cleanly (commits).
    fn close(self: Box<Self>) -> Result<()>;
    /// The log address of the key's newest record when it must be read from storage
    /// (engines that keep everything in memory: never).
    fn storage_addr(&self, _key: &[u8]) -> Option<u64> {
        None
    }
    /// The log file's offset of an address and the bytes to its page's end.
    fn file_span(&self, _addr: u64) -> (u64, usize) {
        (0, 0)
    }
    /// Records read ahead for the next command (engines without storage: none).
    fn fetched(&mut self) -> Option<&mut Vec<Fetched>> {
        None
    }
    /// Draws the element of the next single random pick of `key` ([`Store::draw_element`]).
    fn draw_element(&mut self, _key: &[u8]) -> Option<(Hash, Hash, Option<u64>)> {
        None
    }
    /// Hands the element drawn ahead to the command about to run ([`Store::set_drawn`]).
    fn set_drawn(&mut self, _d: Option<(Hash, Hash)>) {}
    /// The asynchronous I/O of the engine's storage, for reads ahead (tags with the top four
    /// bits zero); engines without storage: none.
    fn io(&mut self) -> Option<&mut dyn FileIo> {
        None
    }
    /// The same, to look at.
    fn io_ref(&self) -> Option<&dyn FileIo> {
        None
    }
    /// Takes the storage completions: the engine's own move its writes and commits along,
    /// the reads ahead are appended to `reads`.
    fn poll_io(&mut self, _reads: &mut Vec<IoDone>) {}
    /// Completions of reads ahead wait already (the loop must not sleep).
    fn io_ready(&self) -> bool {
        false
    }
    /// The engine's storage operations in flight.
    fn io_in_flight(&self) -> usize {
        0
    }
    /// Begins a commit of every write so far without waiting ([`Engine::durable_end`] tells
    /// when it is done).
    fn start_commit(&mut self) -> StoreResult<()> {
        Ok(())
    }
    /// Every write below this log address is durable.
    fn durable_end(&self) -> u64 {
        u64::MAX
    }
    /// The log's tail: a commit begun now makes the writes so far durable once
    /// [`Engine::durable_end`] reaches it.
    fn tail(&self) -> u64 {
        0
    }
    /// Whether the commands since the last call read or wrote a record that is not durable.
    fn take_undurable(&mut self) -> bool {
        false
    }
    /// A storage operation failed: nothing more can be acknowledged as durable.
    fn is_broken(&self) -> bool {
        false
    }
    /// The type of `key` (TYPE's name), `None` when it is missing.
    fn key_type(&mut self, key: &[u8]) -> StoreResult<Option<&'static str>> {
        Ok(self.exists(key)?.then_some("string"))
    }
    /// The type of a live `key` from memory alone, no record read (SCAN's TYPE filter).
    fn live_key_type(&self, _key: &[u8]) -> &'static str {
        "string"
    }
    /// Writes one element of the collection of type `ty` at `key`, creating it: whether
    /// the element is new ([`Store::element_put`]).
    fn element_put(
        &mut self,
        _ty: CollType,
        _key: &[u8],
        _sub: &[u8],
        _value: &[u8],
    ) -> StoreResult<bool> {
        Err(NO_COLLECTIONS)
    }
    /// Reads one element: `f` gets its value or `None`.
    fn element_get_with(
        &mut self,
        _ty: CollType,
        _key: &[u8],
        _sub: &[u8],
        _f: &mut dyn FnMut(Option<&[u8]>),
    ) -> StoreResult<()> {
        Err(NO_COLLECTIONS)
    }
    /// Removes one element: whether it existed (the last one removes the key).
    fn element_del(&mut self, _ty: CollType, _key: &[u8], _sub: &[u8]) -> StoreResult<bool> {
        Err(NO_COLLECTIONS)
    }
    /// Whether an element exists.
    fn element_exists(&mut self, _ty: CollType, _key: &[u8], _sub: &[u8]) -> StoreResult<bool> {
        Err(NO_COLLECTIONS)
    }
    /// The live elements of a collection (0 when `key` is missing).
    fn coll_len(&mut self, _ty: CollType, _key: &[u8]) -> StoreResult<u64> {
        Err(NO_COLLECTIONS)
    }
    /// One step of a walk over a collection's elements ([`Store::coll_scan`]).
    fn coll_scan(
        &mut self,
        _ty: CollType,
        _key: &[u8],
        _cursor: u64,
        _count: usize,
        _f: &mut dyn FnMut(&[u8], &[u8]),
    ) -> StoreResult<u64> {
        Err(NO_COLLECTIONS)
    }
    /// Random elements of a collection ([`Store::coll_random`]).
    fn coll_random(
        &mut self,
        _ty: CollType,
        _key: &[u8],
        _count: usize,
        _repeat: bool,
        _f: &mut dyn FnMut(&[u8], &[u8]),
    ) -> StoreResult<()> {
        Err(NO_COLLECTIONS)
    }
    /// Copies the collection at `src` to the missing key `dst` ([`Store::coll_copy`]).
    fn coll_copy(&mut self, _src: &[u8], _dst: &[u8], _expire_ms: u64) -> StoreResult<bool> {
        Err(NO_COLLECTIONS)
    }
    /// The log address of an element's record when it must be read from storage.
    fn element_storage_addr(&self, _key: &[u8], _sub: &[u8]) -> Option<u64> {
        None
    }
    /// The log address of a list element's record when it must be read from storage
    /// ([`Store::list_storage_addr`]).
    fn list_storage_addr(&self, _key: &[u8], _index: i64) -> Option<u64> {
        None
    }
    /// Pushes elements at a list's head or end ([`Store::list_push`]): its new length.
    fn list_push(
        &mut self,
        _key: &[u8],
        _values: &[&[u8]],
        _left: bool,
        _create: bool,
    ) -> StoreResult<u64> {
        Err(NO_COLLECTIONS)
    }
    /// Walks a list's elements by index ([`Store::list_visit`]).
    fn list_visit(
        &mut self,
        _key: &[u8],
        _from: u64,
        _to: u64,
        _rev: bool,
        _f: &mut dyn FnMut(u64, &[u8]) -> bool,
    ) -> StoreResult<()> {
        Err(NO_COLLECTIONS)
    }
    /// Replaces a list's element ([`Store::list_set`]): false when out of range.
    fn list_set(&mut self, _key: &[u8], _index: u64, _value: &[u8]) -> StoreResult<bool> {
        Err(NO_COLLECTIONS)
    }
    /// Replaces the elements at one end of a list ([`Store::list_replace_end`]).
    fn list_replace_end(
        &mut self,
        _key: &[u8],
        _left: bool,
        _k: u64,
        _new: &[&[u8]],
    ) -> StoreResult<()> {
        Err(NO_COLLECTIONS)
    }
    /// Pops one element of a list ([`Store::list_pop_with`]).
    fn list_pop_with(
        &mut self,
        _key: &[u8],
        _left: bool,
        _f: &mut dyn FnMut(&[u8]),
    ) -> StoreResult<bool> {
        Err(NO_COLLECTIONS)
    }
    /// A sorted set member's score ([`Store::zscore`]).
    fn zscore(&mut self, _key: &[u8], _member: &[u8]) -> StoreResult<Option<f64>> {
        Err(NO_COLLECTIONS)
    }
    /// Sets a member's score ([`Store::zadd`]): whether it is new.
    fn zadd(&mut self, _key: &[u8], _member: &[u8], _score: f64) -> StoreResult<bool> {
        Err(NO_COLLECTIONS)
    }
    /// Removes a member ([`Store::zrem`]).
    fn zrem(&mut self, _key: &[u8], _member: &[u8]) -> StoreResult<bool> {
        Err(NO_COLLECTIONS)
    }
    /// Removes a member of known score ([`Store::zrem_scored`]).
    fn zrem_scored(&mut self, _key: &[u8], _member: &[u8], _score: f64) -> StoreResult<bool> {
        Err(NO_COLLECTIONS)
    }
    /// Members for which `before` holds, a prefix of the order ([`Store::zcount_before`]).
    fn zcount_before(
        &mut self,
        _key: &[u8],
        _before: crate::zindex::Before<'_>,
    ) -> StoreResult<usize> {
        Err(NO_COLLECTIONS)
    }
    /// The members of ranks `from..to` ([`Store::zrange`]).
    fn zrange(
        &mut self,
        _key: &[u8],
        _from: usize,
        _to: usize,
        _rev: bool,
        _f: &mut dyn FnMut(&[u8], f64),
    ) -> StoreResult<()> {
        Err(NO_COLLECTIONS)
    }
}

/// The error of a collection command on an engine without collections.
const NO_COLLECTIONS: StoreError =
    StoreError::Unsupported("collections are not supported by the in-memory engine");

impl Engine for Store {
    fn get_with(&mut self, key: &[u8], f: &mut dyn FnMut(Option<&[u8]>)) -> StoreResult<()> {
        Store::get_with(self, key, f)
    }
    fn exists(&mut self, key: &[u8]) -> StoreResult<bool> {
        Store::exists(self, key)
    }
    fn set(
        &mut self,
        key: &[u8],
        value: &[u8],
        cond: SetCond,
        expiry: Expiry,
        old: Option<OldValue<'_>>,
    ) -> StoreResult<bool> {
        Store::set(self, key, value, cond, expiry, old)
    }
    fn expiry(&mut self, key: &[u8]) -> StoreResult<Option<u64>> {
        Store::expiry(self, key)
    }
    fn set_expiry(&mut self, key: &[u8], expire_ms: u64) -> StoreResult<bool> {
        Store::set_expiry(self, key, expire_ms)
    }
    fn del(&mut self, key: &[u8]) -> StoreResult<bool> {
        Store::del(self, key)
    }
    fn take_with(&mut self, key: &[u8], f: OldValue<'_>) -> StoreResult<bool> {
        Store::take_with(self, key, f)
    }
    fn incr_by(&mut self, key: &[u8], by: i64) -> StoreResult<i64> {
        Store::incr_by(self, key, by)
    }
    fn append_value(&mut self, key: &[u8], data: &[u8]) -> StoreResult<usize> {
        Store::append_value(self, key, data)
    }
    fn modify(&mut self, key: &[u8], f: Modifier<'_>) -> StoreResult<()> {
        Store::modify(self, key, f)
    }
    fn strlen(&mut self, key: &[u8]) -> StoreResult<usize> {
        Store::strlen(self, key)
    }
    fn flush_all(&mut self) -> StoreResult<()> {
        Store::flush_all(self)
    }
    fn scan(
        &mut self,
        cursor: u64,
        count: usize,
        reap: bool,
        f: &mut dyn FnMut(&[u8]),
    ) -> StoreResult<u64> {
        Store::scan(self, cursor, count, reap, f)
    }
    fn scan_storage(&self, cursor: u64, count: usize, f: &mut dyn FnMut(u64)) {
        Store::scan_storage(self, cursor, count, f)
    }
    fn random_key(&mut self, f: &mut dyn FnMut(&[u8])) -> StoreResult<bool> {
        Store::random_key(self, f)
    }
    fn pick_random(&mut self) -> Option<u64> {
        Store::pick_random(self)
    }
    fn active_expire(&mut self, budget: Duration) -> u64 {
        Store::active_expire(self, budget)
    }
    fn expired_keys(&self) -> u64 {
        self.stats().expired_keys
    }
    fn len(&self) -> u64 {
        Store::len(self)
    }
    fn expiring(&self) -> u64 {
        Store::expiring(self)
    }
    fn avg_ttl(&self) -> u64 {
        Store::avg_ttl(self)
    }
    fn durability(&self) -> Durability {
        self.config().durability
    }
    fn commit(&mut self) -> StoreResult<()> {
        Store::commit(self)
    }
    fn invalidate_now(&mut self) -> StoreResult<()> {
        Store::invalidate_now(self)
    }
    fn config_params(&self) -> Vec<(&'static str, String)> {
        let c = self.config();
        vec![
            ("maxmemory", c.memory.to_string()),
            ("proto-max-bulk-len", c.max_value.to_string()),
        ]
    }
    fn info(&self) -> Vec<(&'static str, String)> {
        let st = self.stats();
        let [begin, head, ro, flushed, tail] = self.addresses();
        let c = self.config();
        vec![
            ("engine", "hybrid-log".into()),
            ("log_begin", begin.to_string()),
            ("log_head", head.to_string()),
            ("log_read_only", ro.to_string()),
            ("log_flushed", flushed.to_string()),
            ("log_tail", tail.to_string()),
            ("log_size", c.log_size.to_string()),
            ("page_size", c.page_size.to_string()),
            ("memory_budget", c.memory.to_string()),
            ("memory_reads", st.memory_reads.to_string()),
            ("storage_reads", st.storage_reads.to_string()),
            ("storage_reads_fetched_ahead", st.fetched_reads.to_string()),
            ("storage_reads_blocking", st.blocking_reads.to_string()),
            ("in_place_updates", st.in_place_updates.to_string()),
            ("appends", st.appends.to_string()),
            ("page_writes", st.page_writes.to_string()),
            ("compactions", st.compactions.to_string()),
            ("compaction_moves", st.compaction_moves.to_string()),
            (
                "compaction_moved_bytes",
                st.compaction_moved_bytes.to_string(),
            ),
            ("dpu_invalidations", st.invalidations.to_string()),
            ("checkpoints", st.checkpoints.to_string()),
            ("commits", st.commits.to_string()),
            ("storage_waits", st.storage_waits.to_string()),
        ]
    }
    fn limits(&self) -> (usize, usize) {
        (self.config().max_key, self.config().max_value)
    }
    fn close(self: Box<Self>) -> Result<()> {
        Store::close(*self)
    }
    fn storage_addr(&self, key: &[u8]) -> Option<u64> {
        Store::storage_addr(self, key)
    }
    fn key_type(&mut self, key: &[u8]) -> StoreResult<Option<&'static str>> {
        if !Store::exists(self, key)? {
            return Ok(None);
        }
        Ok(Some(
            Store::coll_type(self, key)?.map_or("string", CollType::name),
        ))
    }
    fn live_key_type(&self, key: &[u8]) -> &'static str {
        self.live_coll_type(key).map_or("string", CollType::name)
    }
    fn element_put(
        &mut self,
        ty: CollType,
        key: &[u8],
        sub: &[u8],
        value: &[u8],
    ) -> StoreResult<bool> {
        Store::element_put(self, ty, key, sub, value)
    }
    fn element_get_with(
        &mut self,
        ty: CollType,
        key: &[u8],
        sub: &[u8],
        f: &mut dyn FnMut(Option<&[u8]>),
    ) -> StoreResult<()> {
        Store::element_get_with(self, ty, key, sub, f)
    }
    fn element_del(&mut self, ty: CollType, key: &[u8], sub: &[u8]) -> StoreResult<bool> {
        Store::element_del(self, ty, key, sub)
    }
    fn element_exists(&mut self, ty: CollType, key: &[u8], sub: &[u8]) -> StoreResult<bool> {
        Store::element_exists(self, ty, key, sub)
    }
    fn coll_len(&mut self, ty: CollType, key: &[u8]) -> StoreResult<u64> {
        Store::coll_len(self, ty, key)
    }
    fn coll_scan(
        &mut self,
        ty: CollType,
        key: &[u8],
        cursor: u64,
        count: usize,
        f: &mut dyn FnMut(&[u8], &[u8]),
    ) -> StoreResult<u64> {
        Store::coll_scan(self, ty, key, cursor, count, f)
    }
    fn coll_random(
        &mut self,
        ty: CollType,
        key: &[u8],
        count: usize,
        repeat: bool,
        f: &mut dyn FnMut(&[u8], &[u8]),
    ) -> StoreResult<()> {
        Store::coll_random(self, ty, key, count, repeat, f)
    }
    fn coll_copy(&mut self, src: &[u8], dst: &[u8], expire_ms: u64) -> StoreResult<bool> {
        Store::coll_copy(self, src, dst, expire_ms)
    }
    fn element_storage_addr(&self, key: &[u8], sub: &[u8]) -> Option<u64> {
        Store::element_storage_addr(self, key, sub)
    }
    fn list_storage_addr(&self, key: &[u8], index: i64) -> Option<u64> {
        Store::list_storage_addr(self, key, index)
    }
    fn list_push(
        &mut self,
        key: &[u8],
        values: &[&[u8]],
        left: bool,
        create: bool,
    ) -> StoreResult<u64> {
        Store::list_push(self, key, values, left, create)
    }
    fn list_visit(
        &mut self,
        key: &[u8],
        from: u64,
        to: u64,
        rev: bool,
        f: &mut dyn FnMut(u64, &[u8]) -> bool,
    ) -> StoreResult<()> {
        Store::list_visit(self, key, from, to, rev, f)
    }
    fn list_set(&mut self, key: &[u8], index: u64, value: &[u8]) -> StoreResult<bool> {
        Store::list_set(self, key, index, value)
    }
    fn list_replace_end(
        &mut self,
        key: &[u8],
        left: bool,
        k: u64,
        new: &[&[u8]],
    ) -> StoreResult<()> {
        Store::list_replace_end(self, key, left, k, new)
    }
    fn list_pop_with(
        &mut self,
        key: &[u8],
        left: bool,
        f: &mut dyn FnMut(&[u8]),
    ) -> StoreResult<bool> {
        Store::list_pop_with(self, key, left, f)
    }
    fn zscore(&mut self, key: &[u8], member: &[u8]) -> StoreResult<Option<f64>> {
        Store::zscore(self, key, member)
    }
    fn zadd(&mut self, key: &[u8], member: &[u8], score: f64) -> StoreResult<bool> {
        Store::zadd(self, key, member, score)
    }
    fn zrem(&mut self, key: &[u8], member: &[u8]) -> StoreResult<bool> {
        Store::zrem(self, key, member)
    }
    fn zrem_scored(&mut self, key: &[u8], member: &[u8], score: f64) -> StoreResult<bool> {
        Store::zrem_scored(self, key, member, score)
    }
    fn zcount_before(
        &mut self,
        key: &[u8],
        before: crate::zindex::Before<'_>,
    ) -> StoreResult<usize> {
        Store::zcount_before(self, key, before)
    }
    fn zrange(
        &mut self,
        key: &[u8],
        from: usize,
        to: usize,
        rev: bool,
        f: &mut dyn FnMut(&[u8], f64),
    ) -> StoreResult<()> {
        Store::zrange(self, key, from, to, rev, f)
    }
    fn file_span(&self, addr: u64) -> (u64, usize) {
        Store::file_span(self, addr)
    }
    fn fetched(&mut self) -> Option<&mut Vec<Fetched>> {
        Some(Store::fetched(self))
    }
    fn draw_element(&mut self, key: &[u8]) -> Option<(Hash, Hash, Option<u64>)> {
        Store::draw_element(self, key)
    }
    fn set_drawn(&mut self, d: Option<(Hash, Hash)>) {
        Store::set_drawn(self, d)
    }
    fn io(&mut self) -> Option<&mut dyn FileIo> {
        Some(Store::io(self))
    }
    fn io_ref(&self) -> Option<&dyn FileIo> {
        Some(Store::io_ref(self))
    }
    fn poll_io(&mut self, reads: &mut Vec<IoDone>) {
        Store::poll_io(self, reads)
    }
    fn io_ready(&self) -> bool {
        Store::io_ready(self)
    }
    fn io_in_flight(&self) -> usize {
        Store::io_in_flight(self)
    }
    fn start_commit(&mut self) -> StoreResult<()> {
        Store::start_commit(self)
    }
    fn durable_end(&self) -> u64 {
        Store::durable_end(self)
    }
    fn tail(&self) -> u64 {
        Store::tail(self)
    }
    fn take_undurable(&mut self) -> bool {
        Store::take_undurable(self)
    }
    fn is_broken(&self) -> bool {
        Store::is_broken(self)
    }
}

/// DPU-KV's in-memory engine (`docs/dpu-kv.md` §1) behind the Redis commands: values carry
/// their expiry (8 bytes, Unix milliseconds, 0 for none) in front. Nothing is durable.
pub struct MemEngine {
    store: dds_kvmem::Store,
    memory: usize,
    partitions: usize,
    max_value: usize,
    buf: Vec<u8>,
    /// The new value of a read-modify-write.
    wbuf: Vec<u8>,
    /// Keys with an expiry.
    expiring: u64,
    /// Every key, in the order of its hash (SCAN's order; the partitions cannot be walked).
    keys: BTreeSet<(u64, Vec<u8>)>,
    /// Where the active expiry cycle samples next.
    expire_cursor: (u64, Vec<u8>),
    /// Keys removed because their expiry passed.
    expired: u64,
    /// RANDOMKEY's generator state (xorshift).
    rng: u64,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn mem_error(e: KvError) -> StoreError {
    match e {
        KvError::Full | KvError::IndexFull => StoreError::OutOfMemory,
        KvError::TooLarge(n) => StoreError::ValueTooLarge(n),
        KvError::NotInteger => StoreError::NotInteger,
        KvError::Overflow => StoreError::Overflow,
        KvError::TooSmall | KvError::IndexTooLarge => StoreError::OutOfMemory,
    }
}

impl MemEngine {
    /// `partitions` partitions sharing `memory` bytes.
    pub fn new(partitions: usize, memory: usize) -> Result<MemEngine> {
        let store = dds_kvmem::Store::new(partitions.max(1), memory)
            .map_err(|e| anyhow::anyhow!("the in-memory store: {e}"))?;
        Ok(MemEngine {
            store,
            memory,
            partitions: partitions.max(1),
            max_value: (memory / partitions.max(1) / 8).max(64),
            buf: Vec::new(),
            wbuf: Vec::new(),
            expiring: 0,
            keys: BTreeSet::new(),
            expire_cursor: (0, Vec::new()),
            expired: 0,
            rng: now_ms() | 1,
        })
    }

    /// The live value (expiry checked) with its expiry. An expired key is deleted when read,
    /// as Redis deletes it.
    fn live(&mut self, key: &[u8]) -> Option<(u64, &[u8])> {
        let (p, h) = self.store.part(key);
        let exp = u64::from_le_bytes(p.get(key, h)?[..8].try_into().expect("expiry prefix"));
        if exp != 0 && exp < now_ms() {
            p.del(key, h);
            self.expiring -= 1;
            self.expired += 1;
            self.keys.remove(&(dds_kvmem::key_hash(key), key.to_vec()));
            return None;
        }
        let v = p.get(key, h).expect("present");
        Some((exp, &v[8..]))
    }

    fn put(&mut self, key: &[u8], expire: u64, value: &[u8]) -> StoreResult<()> {
        if key.len() > dds_kvmem::MAX_KEY {
            return Err(StoreError::KeyTooLarge(dds_kvmem::MAX_KEY));
        }
        if value.len() > self.max_value {
            return Err(StoreError::ValueTooLarge(self.max_value));
        }
        self.buf.clear();
        self.buf.extend_from_slice(&expire.to_le_bytes());
        self.buf.extend_from_slice(value);
        let old = self.raw_expiry(key);
        let (p, h) = self.store.part(key);
        p.set(key, h, &self.buf).map_err(mem_error)?;
        if old.is_none() {
            self.keys.insert((dds_kvmem::key_hash(key), key.to_vec()));
        }
        self.expiring =
            self.expiring + u64::from(expire != 0) - u64::from(old.is_some_and(|e| e != 0));
        Ok(())
    }

    /// The stored expiry of `key` (expired or not), `None` when it is not stored.
    fn raw_expiry(&mut self, key: &[u8]) -> Option<u64> {
        let (p, h) = self.store.part(key);
        p.get(key, h)
            .map(|v| u64::from_le_bytes(v[..8].try_into().expect("expiry prefix")))
    }
}

impl Engine for MemEngine {
    fn get_with(&mut self, key: &[u8], f: &mut dyn FnMut(Option<&[u8]>)) -> StoreResult<()> {
        f(self.live(key).map(|x| x.1));
        Ok(())
    }
    fn exists(&mut self, key: &[u8]) -> StoreResult<bool> {
        Ok(self.live(key).is_some())
    }
    fn set(
        &mut self,
        key: &[u8],
        value: &[u8],
        cond: SetCond,
        expiry: Expiry,
        old: Option<OldValue<'_>>,
    ) -> StoreResult<bool> {
        let cur = self.live(key).map(|(e, v)| (e, v.to_vec()));
        if let Some(f) = old {
            f(cur.as_ref().map(|x| &x.1[..]));
        }
        match (cond, &cur) {
            (SetCond::IfMissing, Some(_)) | (SetCond::IfExists, None) => return Ok(false),
            _ => {}
        }
        let exp = match expiry {
            Expiry::None => 0,
            Expiry::At(t) => t,
            Expiry::Keep => cur.map_or(0, |c| c.0),
        };
        self.put(key, exp, value)?;
        Ok(true)
    }
    fn expiry(&mut self, key: &[u8]) -> StoreResult<Option<u64>> {
        Ok(self.live(key).map(|(e, _)| e))
    }
    fn set_expiry(&mut self, key: &[u8], expire_ms: u64) -> StoreResult<bool> {
        let Some((exp, v)) = self.live(key) else {
            return Ok(false);
        };
        if exp != expire_ms {
            let v = v.to_vec();
            self.put(key, expire_ms, &v)?;
        }
        Ok(true)
    }
    fn del(&mut self, key: &[u8]) -> StoreResult<bool> {
        let live = self.live(key).is_some();
        if live {
            if self.raw_expiry(key).is_some_and(|e| e != 0) {
                self.expiring -= 1;
            }
            let (p, h) = self.store.part(key);
            p.del(key, h);
            self.keys.remove(&(dds_kvmem::key_hash(key), key.to_vec()));
        }
        Ok(live)
    }
    fn take_with(&mut self, key: &[u8], f: OldValue<'_>) -> StoreResult<bool> {
        let cur = self.live(key).map(|x| x.1.to_vec());
        f(cur.as_deref());
        self.del(key)
    }
    fn incr_by(&mut self, key: &[u8], by: i64) -> StoreResult<i64> {
        let (exp, cur) = match self.live(key) {
            None => (0, 0i64),
            Some((e, v)) => {
                let n = std::str::from_utf8(v)
                    .ok()
                    .filter(|s| !s.is_empty() && !s.starts_with('+'))
                    .and_then(|s| s.parse::<i64>().ok().filter(|n| n.to_string() == s))
                    .ok_or(StoreError::NotInteger)?;
                (e, n)
            }
        };
        let n = cur.checked_add(by).ok_or(StoreError::Overflow)?;
        self.put(key, exp, n.to_string().as_bytes())?;
        Ok(n)
    }
    fn append_value(&mut self, key: &[u8], data: &[u8]) -> StoreResult<usize> {
        let (exp, mut v) = self
            .live(key)
            .map(|(e, v)| (e, v.to_vec()))
            .unwrap_or_default();
        v.extend_from_slice(data);
        self.put(key, exp, &v)?;
        Ok(v.len())
    }
    fn strlen(&mut self, key: &[u8]) -> StoreResult<usize> {
        Ok(self.live(key).map_or(0, |x| x.1.len()))
    }
    fn modify(&mut self, key: &[u8], f: Modifier<'_>) -> StoreResult<()> {
        let mut buf = std::mem::take(&mut self.wbuf);
        buf.clear();
        let (what, exp) = match self.live(key) {
            Some((exp, v)) => (f(Some(v), &mut buf), exp),
            None => (f(None, &mut buf), 0),
        };
        let r = match what {
            Modify::Keep => Ok(()),
            Modify::Write => self.put(key, exp, &buf),
        };
        self.wbuf = buf;
        r
    }
    fn flush_all(&mut self) -> StoreResult<()> {
        self.store = dds_kvmem::Store::new(self.partitions, self.memory).map_err(mem_error)?;
        self.expiring = 0;
        self.keys.clear();
        Ok(())
    }
    fn scan(
        &mut self,
        cursor: u64,
        count: usize,
        reap: bool,
        f: &mut dyn FnMut(&[u8]),
    ) -> StoreResult<u64> {
        // The step's keys (a copy: reading them may remove expired ones from the set).
        let mut step: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut next = 0;
        for k in self.keys.range((cursor, Vec::new())..) {
            if step.len() >= count && step.last().is_some_and(|l| l.0 != k.0) {
                next = k.0;
                break;
            }
            step.push(k.clone());
        }
        let now = now_ms();
        for (_, k) in &step {
            let live = if reap {
                self.live(k).is_some()
            } else {
                self.raw_expiry(k).is_some_and(|e| e == 0 || e >= now)
            };
            if live {
                f(k);
            }
        }
        Ok(next)
    }
    fn random_key(&mut self, f: &mut dyn FnMut(&[u8])) -> StoreResult<bool> {
        for _ in 0..100 {
            self.rng ^= self.rng << 13;
            self.rng ^= self.rng >> 7;
            self.rng ^= self.rng << 17;
            let at = (self.rng, Vec::new());
            let Some((_, k)) = self
                .keys
                .range(at.clone()..)
                .chain(self.keys.range(..at))
                .next()
                .cloned()
            else {
                return Ok(false);
            };
            if self.live(&k).is_some() {
                f(&k);
                return Ok(true);
            }
        }
        Ok(false)
    }
    fn active_expire(&mut self, budget: Duration) -> u64 {
        // Redis's cycle over the keys in hash order; a key's expiry is in its value.
        let start = Instant::now();
        let before = self.expired;
        let mut visited = 0;
        while self.expiring > 0 && visited < self.keys.len() {
            let cursor = self.expire_cursor.clone();
            let mut sample = Vec::new();
            for k in self
                .keys
                .range(cursor.clone()..)
                .chain(self.keys.range(..cursor))
            {
                if sample.len() == 20 {
                    self.expire_cursor = k.clone();
                    break;
                }
                sample.push(k.1.clone());
            }
            visited += sample.len();
            let (mut sampled, gone) = (0, self.expired);
            for k in &sample {
                if self.raw_expiry(k).is_some_and(|e| e != 0) {
                    sampled += 1;
                    let _ = self.live(k);
                }
            }
            let expired = self.expired - gone;
            if (sampled > 0 && expired * 4 <= sampled) || start.elapsed() >= budget {
                break;
            }
        }
        self.expired - before
    }
    fn expired_keys(&self) -> u64 {
        self.expired
    }
    fn len(&self) -> u64 {
        self.store.len()
    }
    fn expiring(&self) -> u64 {
        self.expiring
    }
    fn durability(&self) -> Durability {
        Durability::None
    }
    fn commit(&mut self) -> StoreResult<()> {
        Ok(())
    }
    fn invalidate_now(&mut self) -> StoreResult<()> {
        Ok(())
    }
    fn config_params(&self) -> Vec<(&'static str, String)> {
        vec![
            ("maxmemory", self.memory.to_string()),
            ("proto-max-bulk-len", self.max_value.to_string()),
        ]
    }
    fn info(&self) -> Vec<(&'static str, String)> {
        vec![
            ("engine", "memory".into()),
            ("partitions", self.partitions.to_string()),
            ("memory_budget", self.memory.to_string()),
        ]
    }
    fn limits(&self) -> (usize, usize) {
        (dds_kvmem::MAX_KEY, self.max_value)
    }
    fn close(self: Box<Self>) -> Result<()> {
        Ok(())
    }
}
