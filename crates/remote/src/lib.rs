//! uzswap-remote: a backing tier on a Redis or Valkey server or cluster.
//!
//! [`RedisBacking`] implements the cache's [`BackingStore`]. The cache
//! seals every page before it reaches a store (AES-256-GCM, tag kept in
//! memory), so the server holds only ciphertext, and a value that was
//! changed, lost or belongs to another slot fails to open: a store needs
//! no integrity logic here.
//!
//! # Extents
//! A server spends about as long on a `SET` of 4 KiB as on one of 64 KiB:
//! the command, not the bytes, is what costs. So a write of adjacent slots
//! goes out as *extents* of up to [`EXTENT_PAGES`] pages, one key each, the
//! pages end to end in its value; a load asks for its page's 4 KiB of the
//! extent with `GETRANGE`. An extent's id is drawn from a counter and never
//! reused, so its key is never written twice: a slot written again goes to
//! a new extent, and an `UNLINK` sent late can only delete an extent that
//! no slot refers to any more. The store keeps, in memory, each slot's
//! extent and place in it, and each extent's count of slots still
//! referring to it; an extent whose count falls to zero (its slots
//! written again or discarded) is unlinked with the next write's pipeline.
//! The server holds at most the extents some slot still refers to:
//! [`RemoteStats::held_bytes`] against [`RemoteStats::live_bytes`] shows
//! what that costs.
//!
//! # Reading ahead
//! A load that follows the one before it in the same extent (the page
//! after the last one read) asks for up to [`READ_AHEAD`] pages from its
//! own to the extent's end in the same `GETRANGE`, and keeps the ones
//! after its own for the loads that come next: the pager's readahead
//! brings a faulting page's followers back one load at a time, and these
//! then cost no round trip. Keeping them is safe because an extent's key
//! is written once: its bytes for a page never change, and the seal still
//! checks them when they are used.
//!
//! # Keys
//! `<prefix>:<namespace>:<extent>`: the prefix `uzswap`
//! ([`RemoteConfig::prefix`]; `uzswap run` gives each run its own,
//! `uzswap:<run id>`), the namespace 128 random bits (hex) drawn per store
//! from the OS, so several programs (and a forked child, which takes a
//! namespace of its own) share a server without meeting. The key carries
//! no hash tag: a cluster spreads a store's extents over all its hash
//! slots, and so over all its masters. Every value is written with a
//! time-to-live ([`RemoteConfig::ttl`]): the keys of a run that was killed
//! expire. [`RedisBacking::clear`] (and `Drop`) closes the store and
//! unlinks every extent still stored; [`sweep`] deletes every key under a
//! prefix (what a run's processes that exec'd or were killed left).
//!
//! # Errors
//! A key that is missing (evicted by the server, restart, `FLUSHALL`), a
//! dead connection, a timeout or an error reply is an `io::Error`: the
//! cache counts the failed load and the pager retries, then raises SIGBUS
//! for the page; it never returns other bytes. A connection that failed
//! is dropped; the next call makes a new one, so the store picks up again
//! once the server is back (an empty server then answers "missing" for
//! the old keys, and new writes work).
//!
//! # Locks
//! Two leaf locks, each held for a few instructions and never across I/O
//! or another lock:
//! - `pool`: idle connections. A caller pops one (or, if none is idle,
//!   connects without the lock), does its round trip without the lock, and
//!   pushes it back. So the writer thread and fault handlers work at once,
//!   each on its own connection.
//! - `index`: each slot's extent, each extent's count of slots, the
//!   extents to unlink. A write takes its extent ids and records its
//!   slots before it goes out (a write that fails half-way may have
//!   stored some extents, and `clear` must find them); a load copies its
//!   slot's place and reads without the lock. A load that races with the
//!   slot being written again may read an extent that was just unlinked:
//!   it fails as missing, and the cache, which checks that the entry did
//!   not change while it read, retries; it never sees another slot's
//!   bytes, because extent ids are never reused.
//!
//! The namespace is an atomic pair of words: written only by
//! `fork_private`, in a forked child, before any other thread runs there.

mod extents;
pub mod testing;
mod url;

pub use extents::EXTENT_PAGES;
pub use url::{BadUrl, RedisUrl, SCHEME, URL_FORM};

use extents::{Extents, Place};

use redis::{Cmd, ConnectionLike, RedisResult, Value};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use uzswap_cache::{BackingStore, TierStats, PAGE_SIZE};
use uzswap_os::lock::Mutex;

/// Counters are statistics: relaxed, each exact on its own.
const RELAXED: Ordering = Ordering::Relaxed;

/// Pages one load may ask for (its own and those after it in its extent)
/// when it follows the load before it.
pub const READ_AHEAD: u32 = 8;

/// Keys per pipeline when the store walks many extents (clear).
const CHUNK: usize = 512;

/// Extents per pipeline when a forked child copies its parent's (16 of
/// 64 KiB: 1 MiB a round trip).
const COPY_CHUNK: usize = 16;

/// How a [`RedisBacking`] talks to its server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteConfig {
    /// Every value's time-to-live: keys of a run that ended without
    /// cleaning up expire after it. A live store renews the keys still in
    /// use once half of it has passed ([`RedisBacking::renew`], which the
    /// cache's writer thread calls through `BackingStore::maintain`), so
    /// a run may last longer. At least two seconds. Default 24 hours.
    pub ttl: Duration,
    /// How long connecting, and waiting for an answer, may take before the
    /// call fails. Default 2 s.
    pub timeout: Duration,
    /// Idle connections kept for reuse (more are made while more callers
    /// are in flight, and closed when they come back). Default 8.
    pub idle_connections: usize,
    /// What every key starts with: `PREFIX:<namespace>:<slot>`. Letters,
    /// digits, `:`, `_` and `-` only. `uzswap run` gives each run its own
    /// (`uzswap:<run id>`), so that [`sweep`] can delete whatever the
    /// run's processes left. Default `uzswap`.
    pub prefix: String,
}

impl Default for RemoteConfig {
    fn default() -> Self {
        RemoteConfig {
            ttl: Duration::from_secs(24 * 3600),
            timeout: Duration::from_secs(2),
            idle_connections: 8,
            prefix: "uzswap".into(),
        }
    }
}

/// Why a remote tier could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// The address is malformed.
    #[error(transparent)]
    BadUrl(#[from] BadUrl),
    /// A configuration value out of range.
    #[error("invalid remote tier configuration: {0}")]
    Config(String),
    /// The server did not answer.
    #[error("cannot reach the Redis server at {url}: {source}; start it (or fix the address) and run again, or use a backing file instead")]
    Connect {
        /// The address.
        url: String,
        /// What the client said.
        source: io::Error,
    },
    /// The OS random source failed (no namespace).
    #[error("cannot draw a random key namespace: {0}; the OS random source (getrandom) must work")]
    Random(io::Error),
}

/// The store's counters (see [`RedisBacking::stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RemoteStats {
    /// What the cache reports of any tier: round trips, bytes each way
    /// (keys and values; protocol framing not counted), failed calls and
    /// missing keys among them, connections made, and bytes held (see
    /// `live_bytes`).
    pub tier: TierStats,
    /// Bytes of pages the store holds for slots in use; `tier.held_bytes`
    /// adds the pages of freed slots that share an extent with one in use.
    pub live_bytes: u64,
    /// Extents unlinked because no slot referred to them any more.
    pub extents_unlinked: u64,
}

/// Pages read ahead: `bytes` holds pages `first..` of `extent`.
#[derive(Default)]
struct Ahead {
    extent: u64,
    first: u32,
    bytes: Vec<u8>,
    /// The last page a load asked for, `(extent, index)`.
    last: (u64, u32),
}

#[derive(Default)]
struct Counters {
    round_trips: AtomicU64,
    bytes_sent: AtomicU64,
    bytes_received: AtomicU64,
    errors: AtomicU64,
    missing: AtomicU64,
    connects: AtomicU64,
    extents_unlinked: AtomicU64,
    read_ahead_hits: AtomicU64,
}

/// Where the keys live.
enum Target {
    Node(redis::Client),
    Cluster(redis::cluster::ClusterClient),
}

/// One connection of the pool.
enum Conn {
    Node(redis::Connection),
    Cluster(redis::cluster::ClusterConnection),
}

impl Conn {
    fn like(&mut self) -> &mut dyn ConnectionLike {
        match self {
            Conn::Node(c) => c,
            Conn::Cluster(c) => c,
        }
    }

    /// Sends `cmds` as one pipeline; one reply per command, in order. An
    /// error reply to any of them fails the whole call.
    fn pipeline(&mut self, cmds: Vec<Cmd>) -> RedisResult<Vec<Value>> {
        match self {
            Conn::Node(c) => {
                let mut p = redis::pipe();
                for cmd in cmds {
                    p.add_command(cmd);
                }
                p.query(c)
            }
            Conn::Cluster(c) => {
                let mut p = redis::cluster::cluster_pipe();
                for cmd in cmds {
                    p.add_command(cmd);
                }
                p.query(c)
            }
        }
    }
}

/// A remote backing tier (see the crate's docs).
pub struct RedisBacking {
    target: Target,
    url: RedisUrl,
    cfg: RemoteConfig,
    /// The namespace, high and low 64 bits.
    ns: [AtomicU64; 2],
    /// Idle connections (lock order: a leaf).
    pool: Mutex<Vec<Conn>>,
    /// Each slot's extent (lock order: a leaf).
    index: Mutex<Extents>,
    /// Pages read ahead (lock order: a leaf; held for a page's copy).
    ahead: Mutex<Ahead>,
    /// Set by `clear`: writes fail from then on. With `writing` (writes
    /// in flight), a Dekker pair in SeqCst: a write counts itself, then
    /// checks `closed`; `clear` sets `closed`, then waits for `writing`
    /// to reach 0. So either the write sees the store closed, or `clear`
    /// waits for it, and no key is stored after `clear` took the list.
    closed: AtomicBool,
    writing: AtomicU64,
    counters: Counters,
    /// The store's clock: extents' time-to-live is kept in whole seconds
    /// since this.
    born: std::time::Instant,
    /// When `renew` is due next, in those seconds.
    renew_at: AtomicU64,
}

fn io_err(e: redis::RedisError) -> io::Error {
    let kind = if e.is_timeout() {
        io::ErrorKind::TimedOut
    } else if e.is_connection_dropped() || e.is_connection_refusal() {
        io::ErrorKind::ConnectionAborted
    } else {
        io::ErrorKind::Other
    };
    io::Error::new(kind, format!("remote tier: {e}"))
}

fn random_ns() -> io::Result<u128> {
    use ring::rand::SecureRandom;
    let mut b = [0u8; 16];
    ring::rand::SystemRandom::new()
        .fill(&mut b)
        .map_err(|_| io::Error::other("getrandom failed"))?;
    Ok(u128::from_le_bytes(b))
}

impl RedisBacking {
    /// Connects to `url` (`redis://HOST:PORT[,HOST:PORT...]`) with the
    /// default [`RemoteConfig`].
    pub fn connect(url: &str) -> Result<RedisBacking, RemoteError> {
        RedisBacking::connect_with(url, RemoteConfig::default())
    }

    /// Connects to `url` and checks that the server answers. One host is a
    /// single node unless it says it runs in cluster mode; several hosts
    /// are the seeds of a cluster.
    pub fn connect_with(url: &str, cfg: RemoteConfig) -> Result<RedisBacking, RemoteError> {
        let parsed = RedisUrl::parse(url)?;
        if cfg.ttl < Duration::from_secs(2) || cfg.ttl.as_secs() > u64::from(u32::MAX) {
            return Err(RemoteError::Config(format!(
                "ttl {:?}: give 2 s to 136 years (keys in use are renewed at half of it)",
                cfg.ttl
            )));
        }
        check_prefix(&cfg.prefix)?;
        if cfg.timeout.is_zero() {
            return Err(RemoteError::Config(
                "timeout of 0: give how long a round trip may take, e.g. 2 s".into(),
            ));
        }
        let shown = parsed.to_string();
        let connect_err = |source: io::Error| RemoteError::Connect {
            url: shown.clone(),
            source,
        };
        let nodes = parsed.node_urls();
        let single = redis::Client::open(nodes[0].as_str()).map_err(|e| connect_err(io_err(e)))?;
        let cluster = nodes.len() > 1 || {
            let mut c = single
                .get_connection_with_timeout(cfg.timeout)
                .map_err(|e| connect_err(io_err(e)))?;
            let info: String = redis::cmd("INFO")
                .arg("cluster")
                .query(&mut c)
                .map_err(|e| connect_err(io_err(e)))?;
            info.lines().any(|l| l.trim() == "cluster_enabled:1")
        };
        let target = if cluster {
            let client = redis::cluster::ClusterClientBuilder::new(nodes)
                .connection_timeout(cfg.timeout)
                .response_timeout(cfg.timeout)
                // Redirects and a moved slot map are followed; a dead
                // node fails the call soon, for the cache to count.
                .retries(2)
                .min_retry_wait(5)
                .max_retry_wait(50)
                .build()
                .map_err(|e| connect_err(io_err(e)))?;
            Target::Cluster(client)
        } else {
            Target::Node(single)
        };
        let ns = random_ns().map_err(RemoteError::Random)?;
        let store = RedisBacking {
            target,
            url: parsed,
            cfg,
            ns: [AtomicU64::new((ns >> 64) as u64), AtomicU64::new(ns as u64)],
            pool: Mutex::new(Vec::new()),
            index: Mutex::new(Extents::default()),
            ahead: Mutex::new(Ahead::default()),
            closed: AtomicBool::new(false),
            writing: AtomicU64::new(0),
            counters: Counters::default(),
            born: std::time::Instant::now(),
            renew_at: AtomicU64::new(0),
        };
        // One round trip now: an unreachable server is refused here, not
        // at the first writeback.
        store
            .round_trip(|c| redis::cmd("PING").query::<String>(c.like()))
            .map_err(connect_err)?;
        Ok(store)
    }

    /// The store's counters.
    pub fn stats(&self) -> RemoteStats {
        let c = &self.counters;
        let (live, held) = self.index.lock().pages();
        RemoteStats {
            live_bytes: live * PAGE_SIZE as u64,
            extents_unlinked: c.extents_unlinked.load(RELAXED),
            tier: TierStats {
                held_bytes: held * PAGE_SIZE as u64,
                round_trips: c.round_trips.load(RELAXED),
                bytes_sent: c.bytes_sent.load(RELAXED),
                bytes_received: c.bytes_received.load(RELAXED),
                errors: c.errors.load(RELAXED),
                missing: c.missing.load(RELAXED),
                connects: c.connects.load(RELAXED),
                read_ahead_hits: c.read_ahead_hits.load(RELAXED),
                ..TierStats::default()
            },
        }
    }

    /// Whether the keys go to a cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self.target, Target::Cluster(_))
    }

    /// The key namespace (32 hex digits), for tests and messages.
    pub fn namespace(&self) -> String {
        format!("{:032x}", self.ns())
    }

    /// The key of the extent that holds slot `slot`'s page, and the
    /// page's byte offset in its value; `None` if the slot holds nothing.
    pub fn key(&self, slot: u64) -> Option<(String, usize)> {
        let p = self.index.lock().place(slot)?;
        Some((self.extent_key(p.extent), p.index as usize * PAGE_SIZE))
    }

    fn extent_key(&self, extent: u64) -> String {
        key_of(&self.cfg.prefix, self.ns(), extent)
    }

    /// Seconds since the store was made.
    fn now(&self) -> u32 {
        self.born.elapsed().as_secs() as u32
    }

    /// Renews the time-to-live of every extent in use whose time-to-live
    /// was set half of it ago or more, if that was not done within the
    /// last quarter of it: so a live store's pages never expire, while a
    /// killed run's do. Returns the extents renewed.
    pub fn renew(&self) -> io::Result<u64> {
        let now = self.now();
        let ttl = self.cfg.ttl.as_secs();
        let due = self.renew_at.load(RELAXED);
        if u64::from(now) < due
            || self
                .renew_at
                .compare_exchange(due, u64::from(now) + ttl / 4, RELAXED, RELAXED)
                .is_err()
        {
            return Ok(0);
        }
        let before = now.saturating_sub((ttl / 2) as u32);
        let stale = self.index.lock().refresh(before, now);
        let ns = self.ns();
        for chunk in stale.chunks(CHUNK) {
            let cmds = chunk
                .iter()
                .map(|&id| {
                    let mut c = redis::cmd("EXPIRE");
                    c.arg(key_of(&self.cfg.prefix, ns, id)).arg(ttl);
                    c
                })
                .collect();
            self.round_trip(|c| c.pipeline(cmds))?;
        }
        Ok(stale.len() as u64)
    }

    /// Bytes of the store's own map of slots to extents.
    pub fn heap_bytes(&self) -> u64 {
        self.index.lock().heap_bytes()
    }

    fn ns(&self) -> u128 {
        u128::from(self.ns[0].load(RELAXED)) << 64 | u128::from(self.ns[1].load(RELAXED))
    }

    /// Closes the store and unlinks every key it still holds: writes fail
    /// from then on (a cache's writer still running at exit stores
    /// nothing more); loads of what was deleted fail as missing.
    pub fn clear(&self) -> io::Result<()> {
        self.closed.store(true, Ordering::SeqCst);
        // Writes in flight finish (each within the timeout) before the
        // list of keys is taken.
        let until = std::time::Instant::now() + 2 * self.cfg.timeout;
        while self.writing.load(Ordering::SeqCst) > 0 && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
        let extents = self.index.lock().take_all();
        let ns = self.ns();
        for chunk in extents.chunks(CHUNK) {
            let cmds = key_cmds("UNLINK", &self.cfg.prefix, ns, chunk);
            self.round_trip(|c| c.pipeline(cmds))?;
        }
        Ok(())
    }

    fn connect_one(&self) -> io::Result<Conn> {
        self.counters.connects.fetch_add(1, RELAXED);
        let t = Some(self.cfg.timeout);
        let conn = match &self.target {
            Target::Node(client) => {
                let c = client
                    .get_connection_with_timeout(self.cfg.timeout)
                    .map_err(io_err)?;
                c.set_read_timeout(t).map_err(io_err)?;
                c.set_write_timeout(t).map_err(io_err)?;
                Conn::Node(c)
            }
            Target::Cluster(client) => Conn::Cluster(client.get_connection().map_err(io_err)?),
        };
        Ok(conn)
    }

    /// One round trip on a connection of the pool (or a new one): the
    /// pool lock is held only to take the connection and to give it back.
    /// A connection that failed is dropped, not given back.
    fn round_trip<T>(&self, f: impl FnOnce(&mut Conn) -> RedisResult<T>) -> io::Result<T> {
        let idle = self.pool.lock().pop();
        let mut conn = match idle {
            Some(c) => c,
            None => self.connect_one().inspect_err(|_| self.failed())?,
        };
        self.counters.round_trips.fetch_add(1, RELAXED);
        match f(&mut conn) {
            Ok(v) => {
                let mut pool = self.pool.lock();
                if pool.len() < self.cfg.idle_connections {
                    pool.push(conn);
                }
                Ok(v)
            }
            Err(e) => {
                self.failed();
                Err(io_err(e))
            }
        }
    }

    fn failed(&self) {
        self.counters.errors.fetch_add(1, RELAXED);
    }

    /// `write_slots` on an open store: one pipeline of a `SET key value
    /// EX ttl` per extent, and an `UNLINK` per extent that died since the
    /// last write.
    fn write_open(&self, first: u64, pages: &[&[u8]]) -> io::Result<()> {
        // Recorded before the write goes out: a write that fails half-way
        // may have stored some extents, and `clear` must find them.
        let (extents, dead) = {
            let mut index = self.index.lock();
            let extents = index.write(first, pages.len() as u64, self.now());
            (extents, index.take_dead())
        };
        let ns = self.ns();
        let ttl = self.cfg.ttl.as_secs();
        let mut sent = 0;
        let mut cmds: Vec<Cmd> = Vec::with_capacity(extents.len() + dead.len());
        for e in &extents {
            let at = (e.first - first) as usize;
            let mut value = Vec::with_capacity(e.pages as usize * PAGE_SIZE);
            for p in &pages[at..at + e.pages as usize] {
                value.extend_from_slice(p);
            }
            let key = key_of(&self.cfg.prefix, ns, e.id);
            sent += key.len() + value.len();
            let mut c = redis::cmd("SET");
            c.arg(key).arg(value).arg("EX").arg(ttl);
            cmds.push(c);
        }
        cmds.extend(key_cmds("UNLINK", &self.cfg.prefix, ns, &dead));
        self.counters.bytes_sent.fetch_add(sent as u64, RELAXED);
        self.round_trip(|c| c.pipeline(cmds))?;
        self.counters
            .extents_unlinked
            .fetch_add(dead.len() as u64, RELAXED);
        Ok(())
    }
}

fn key_of(prefix: &str, ns: u128, slot: u64) -> String {
    format!("{prefix}:{ns:032x}:{slot}")
}

/// `VERB key` for the key of each of `extents` in namespace `ns`.
fn key_cmds(verb: &str, prefix: &str, ns: u128, extents: &[u64]) -> Vec<Cmd> {
    extents
        .iter()
        .map(|&s| {
            let mut c = redis::cmd(verb);
            c.arg(key_of(prefix, ns, s));
            c
        })
        .collect()
}

/// A key prefix: not empty, of letters, digits, `:`, `_` and `-` (no
/// glob characters, which [`sweep`] matches with, and no hash tag).
fn check_prefix(prefix: &str) -> Result<(), RemoteError> {
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, ':' | '_' | '-');
    if prefix.is_empty() || !prefix.chars().all(ok) || prefix.len() > 128 {
        return Err(RemoteError::Config(format!(
            "key prefix {prefix:?}: use 1 to 128 letters, digits, ':', '_' or '-'"
        )));
    }
    Ok(())
}

/// A prefix for one run's keys: `uzswap:<64 random bits>`.
pub fn run_prefix() -> Result<String, RemoteError> {
    let r = random_ns().map_err(RemoteError::Random)?;
    Ok(format!("uzswap:{:016x}", r as u64))
}

/// Deletes every key under `prefix` on the server or cluster at `url`
/// (on each master, `SCAN MATCH prefix:*` and `UNLINK`), and returns how
/// many there were: what the processes of a run left (one that exec'd
/// without exiting, one that was killed). Only for a prefix no running
/// store uses.
pub fn sweep(url: &str, prefix: &str, timeout: Duration) -> Result<u64, RemoteError> {
    let parsed = RedisUrl::parse(url)?;
    check_prefix(prefix)?;
    let shown = parsed.to_string();
    let fail = |e: redis::RedisError| RemoteError::Connect {
        url: shown.clone(),
        source: io_err(e),
    };
    let connect = |node: &str| -> redis::RedisResult<redis::Connection> {
        let c = redis::Client::open(node)?.get_connection_with_timeout(timeout)?;
        c.set_read_timeout(Some(timeout))?;
        c.set_write_timeout(Some(timeout))?;
        Ok(c)
    };
    let seeds = parsed.node_urls();
    let mut first = connect(&seeds[0]).map_err(fail)?;
    let info: String = redis::cmd("INFO")
        .arg("cluster")
        .query(&mut first)
        .map_err(fail)?;
    let masters = if info.lines().any(|l| l.trim() == "cluster_enabled:1") {
        let nodes: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query(&mut first)
            .map_err(fail)?;
        cluster_masters(&nodes)
    } else {
        vec![seeds[0].clone()]
    };
    let mut n = 0;
    for m in masters {
        let mut c = connect(&m).map_err(fail)?;
        let mut cursor = 0u64;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(format!("{prefix}:*"))
                .arg("COUNT")
                .arg(1000)
                .query(&mut c)
                .map_err(fail)?;
            if !keys.is_empty() {
                let mut p = redis::pipe();
                for k in &keys {
                    p.cmd("UNLINK").arg(k).ignore();
                }
                p.query::<()>(&mut c).map_err(fail)?;
                n += keys.len() as u64;
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
    }
    Ok(n)
}

/// The masters in a `CLUSTER NODES` answer, as `redis://IP:PORT`: each
/// line is `id ip:port@cport[,hostname] flags ...`.
fn cluster_masters(nodes: &str) -> Vec<String> {
    nodes
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let flags = f.get(2)?;
            let master = flags.split(',').any(|x| x == "master")
                && !flags.split(',').any(|x| x == "fail" || x == "noaddr");
            let addr = f.get(1)?.split('@').next()?;
            master.then(|| format!("{SCHEME}{addr}"))
        })
        .collect()
}

impl BackingStore for RedisBacking {
    /// One pipeline: the pages as extents (see `write_open`).
    fn write_slots(&self, first: u64, pages: &[&[u8]]) -> io::Result<()> {
        if pages.iter().any(|p| p.len() != PAGE_SIZE) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "remote tier: a slot is exactly one 4096-byte page",
            ));
        }
        self.writing.fetch_add(1, Ordering::SeqCst);
        let r = if self.closed.load(Ordering::SeqCst) {
            Err(io::Error::other(
                "remote tier: the store was closed (the program is exiting)",
            ))
        } else {
            self.write_open(first, pages)
        };
        self.writing.fetch_sub(1, Ordering::SeqCst);
        r
    }

    /// `GETRANGE` of the page's 4 KiB in its extent: a slot that holds
    /// nothing, a missing key (an empty answer) or an answer of another
    /// size is an error.
    fn read_slot(&self, slot: u64, page: &mut [u8]) -> io::Result<()> {
        let place = self.index.lock().place(slot);
        let Some(Place {
            extent,
            index,
            pages,
        }) = place
        else {
            self.failed();
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("remote tier: slot {slot} holds no page (never written, or freed)"),
            ));
        };
        // Read ahead already? Else how many pages to ask for.
        let want = {
            let mut a = self.ahead.lock();
            let follows = a.last == (extent, index.wrapping_sub(1));
            a.last = (extent, index);
            let have = (a.bytes.len() / PAGE_SIZE) as u32;
            if a.extent == extent && (a.first..a.first + have).contains(&index) {
                let at = (index - a.first) as usize * PAGE_SIZE;
                page.copy_from_slice(&a.bytes[at..at + PAGE_SIZE]);
                drop(a);
                self.counters.read_ahead_hits.fetch_add(1, RELAXED);
                return Ok(());
            }
            if follows {
                READ_AHEAD.min(pages - index)
            } else {
                1
            }
        };
        let key = self.extent_key(extent);
        let from = index as usize * PAGE_SIZE;
        self.counters
            .bytes_sent
            .fetch_add(key.len() as u64, RELAXED);
        let mut got: Vec<u8> = self.round_trip(|c| {
            redis::cmd("GETRANGE")
                .arg(&key)
                .arg(from)
                .arg(from + want as usize * PAGE_SIZE - 1)
                .query(c.like())
        })?;
        self.counters
            .bytes_received
            .fetch_add(got.len() as u64, RELAXED);
        if got.is_empty() {
            self.failed();
            self.counters.missing.fetch_add(1, RELAXED);
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("remote tier: key {key} is missing (expired, evicted by the server, or lost in a restart)"),
            ));
        }
        if got.len() < PAGE_SIZE || (want == 1 && got.len() != PAGE_SIZE) {
            self.failed();
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "remote tier: key {key} holds {} bytes at {from}, not a {PAGE_SIZE}-byte page",
                    got.len(),
                ),
            ));
        }
        page.copy_from_slice(&got[..PAGE_SIZE]);
        if got.len() >= 2 * PAGE_SIZE {
            // Whole pages only: an extent cut short keeps its last part out.
            got.truncate(got.len() / PAGE_SIZE * PAGE_SIZE);
            got.drain(..PAGE_SIZE);
            let mut a = self.ahead.lock();
            a.extent = extent;
            a.first = index + 1;
            a.bytes = got;
        }
        Ok(())
    }

    /// The slots leave their extents; an extent left empty is unlinked
    /// with the next write. No I/O here: the cache calls this under its
    /// slot-map lock. A late `UNLINK` is harmless, because an extent's key
    /// is never written again.
    fn discard(&self, first: u64, count: u64) {
        self.index.lock().forget(first, count);
    }

    fn tier_stats(&self) -> TierStats {
        self.stats().tier
    }

    /// Renews keys' time-to-live when due ([`RedisBacking::renew`]); a
    /// failure is counted and tried again at the next call.
    fn maintain(&self) {
        if self.renew().is_err() {
            self.renew_at.store(0, RELAXED);
        }
    }

    fn describe(&self) -> String {
        let RemoteStats {
            tier: s,
            live_bytes,
            ..
        } = self.stats();
        format!(
            "Redis {} {} (keys {}:{}:*; {} round trips, {} bytes sent, {} received, {} errors, {} missing, {} connects, {} KiB held for {} KiB in use)",
            if self.is_cluster() { "cluster" } else { "node" },
            self.url,
            self.cfg.prefix,
            self.namespace(),
            s.round_trips,
            s.bytes_sent,
            s.bytes_received,
            s.errors,
            s.missing,
            s.connects,
            s.held_bytes / 1024,
            live_bytes / 1024
        )
    }

    /// In a forked child: drops the connections inherited from the parent
    /// (their sockets are the parent's), takes a fresh namespace and
    /// copies the extents that slots `0..end` refer to into it, a pipeline
    /// of GETs then one of SETs per chunk. An extent already missing stays
    /// missing (its loads fail as before).
    fn fork_private(&self, end: u64) -> io::Result<()> {
        // The child's only thread runs here. A lock a parent thread held
        // at the fork stays held in the child: then its data may be half
        // changed, so the inherited pool is leaked rather than read.
        // SAFETY: the child's only thread runs here (the pool's and the
        // read-ahead's contents are thrown away either way).
        unsafe {
            drop(uzswap_os::fork::take_in_child(&self.pool));
            drop(uzswap_os::fork::take_in_child(&self.ahead));
        }
        let old = self.ns();
        let new = random_ns()?;
        let extents = {
            let mut index = match self.index.try_lock() {
                Some(l) => l,
                None => {
                    // SAFETY: as above. A write half recorded at the fork
                    // leaves slots naming an extent that may not be on the
                    // server: its loads fail as missing, never wrong.
                    unsafe { self.index.force_unlock() };
                    self.index.lock()
                }
            };
            index.keep_below(end)
        };
        self.ns[0].store((new >> 64) as u64, RELAXED);
        self.ns[1].store(new as u64, RELAXED);
        let ttl = self.cfg.ttl.as_secs();
        for chunk in extents.chunks(COPY_CHUNK) {
            let gets = key_cmds("GET", &self.cfg.prefix, old, chunk);
            let values = self.round_trip(|c| c.pipeline(gets))?;
            let mut sets = Vec::new();
            for (&id, v) in chunk.iter().zip(values) {
                if let Value::BulkString(bytes) = v {
                    self.counters
                        .bytes_received
                        .fetch_add(bytes.len() as u64, RELAXED);
                    let mut c = redis::cmd("SET");
                    c.arg(key_of(&self.cfg.prefix, new, id))
                        .arg(bytes)
                        .arg("EX")
                        .arg(ttl);
                    sets.push(c);
                }
            }
            if !sets.is_empty() {
                self.round_trip(|c| c.pipeline(sets))?;
            }
        }
        Ok(())
    }
}

impl Drop for RedisBacking {
    /// Unlinks every key still stored; on failure they expire with their
    /// time-to-live.
    fn drop(&mut self) {
        let _ = self.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_namespaced_and_unhashed() {
        let k = key_of("uzswap", 0xab, 7);
        assert_eq!(k, format!("uzswap:{:032x}:7", 0xab));
        assert!(!k.contains('{'), "no hash tag: keys spread over a cluster");
    }

    #[test]
    fn unreachable_server_is_refused_with_the_remedy() {
        // Port 1 on loopback: nothing listens there.
        let e = RedisBacking::connect_with(
            "redis://127.0.0.1:1",
            RemoteConfig {
                timeout: Duration::from_millis(500),
                ..RemoteConfig::default()
            },
        )
        .err()
        .expect("nothing listens on port 1");
        assert!(matches!(e, RemoteError::Connect { .. }), "{e}");
        assert!(e.to_string().contains("start it"), "{e}");
        let e = RedisBacking::connect("http://x:1").err().unwrap();
        assert!(e.to_string().contains(URL_FORM), "{e}");
    }
}
