//! The cache's counters. Names up to `same_filled_pages` are the kernel's
//! zswap debugfs names with the kernel's meanings; the rest are uzswap's.

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! counters {
    ($( $(#[$doc:meta])* $name:ident ),* $(,)?) => {
        /// Live counters (atomics, relaxed: each is exact on its own, a
        /// snapshot of several is not one instant).
        #[derive(Default)]
        pub(crate) struct Counters { $( pub $name: AtomicU64, )* }

        /// A snapshot of the cache's counters.
        #[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
        pub struct CacheStats {
            $( $(#[$doc])* pub $name: u64, )*
            /// Bytes the pool holds (pages × 4096): the kernel's
            /// `pool_total_size`.
            pub pool_total_size: u64,
            /// Bytes of the cache's own index (entries, LRU, dedup table).
            pub index_bytes: u64,
            /// Backing slots in use in the current file (those in files
            /// shared since a fork are `backing_shared_slots`).
            pub backing_slots_used: u64,
            /// Backing files this process shares with processes forked
            /// from it or that it was forked from.
            #[serde(default)]
            pub backing_shared_files: u64,
            /// The slots of those files this process still uses.
            #[serde(default)]
            pub backing_shared_slots: u64,
            /// The pool limit in bytes (`u64::MAX`: none).
            pub pool_limit_bytes: u64,
            /// Whether the pool is in its "full" state (refusing until it
            /// falls below the accept threshold).
            pub pool_full: u64,
            /// A remote tier's round trips (0 for a file).
            pub tier_round_trips: u64,
            /// A remote tier's bytes sent (keys and values).
            pub tier_bytes_sent: u64,
            /// A remote tier's bytes received.
            pub tier_bytes_received: u64,
            /// A remote tier's failed calls (connection, timeout, error
            /// reply, missing key).
            pub tier_errors: u64,
            /// Of those, loads whose key was gone.
            pub tier_missing: u64,
            /// A remote tier's connections made.
            pub tier_connects: u64,
            /// Loads a remote tier served from pages it read ahead.
            pub tier_read_ahead_hits: u64,
            /// Bytes a remote tier holds for the cache: `backing_pages`
            /// × 4096 and the freed pages it cannot release yet.
            pub tier_held_bytes: u64,
        }

        impl Counters {
            pub fn snapshot(&self) -> CacheStats {
                CacheStats {
                    $( $name: self.$name.load(Ordering::Relaxed), )*
                    ..CacheStats::default()
                }
            }
        }

        impl CacheStats {
            /// (name, value) pairs, in declaration order.
            pub fn pairs(&self) -> Vec<(&'static str, u64)> {
                vec![
                    $( (stringify!($name), self.$name), )*
                    ("pool_total_size", self.pool_total_size),
                    ("index_bytes", self.index_bytes),
                    ("backing_slots_used", self.backing_slots_used),
                    ("backing_shared_files", self.backing_shared_files),
                    ("backing_shared_slots", self.backing_shared_slots),
                    ("pool_limit_bytes", self.pool_limit_bytes),
                    ("pool_full", self.pool_full),
                    ("tier_round_trips", self.tier_round_trips),
                    ("tier_bytes_sent", self.tier_bytes_sent),
                    ("tier_bytes_received", self.tier_bytes_received),
                    ("tier_errors", self.tier_errors),
                    ("tier_missing", self.tier_missing),
                    ("tier_connects", self.tier_connects),
                    ("tier_read_ahead_hits", self.tier_read_ahead_hits),
                    ("tier_held_bytes", self.tier_held_bytes),
                ]
            }
        }
    };
}

counters! {
    /// Stores that found the pool at its limit.
    pool_limit_hit,
    /// Stores refused because the pool was full and nothing could be
    /// written back to make room (no backing tier, or it failed).
    reject_reclaim_fail,
    /// Stores refused because the allocator could not take the object.
    reject_alloc_fail,
    /// Stores refused for want of index memory (kept for the kernel's name;
    /// Rust aborts on allocation failure, so this stays 0).
    reject_kmemcache_fail,
    /// Stores whose compression failed outright.
    reject_compress_fail,
    /// Stores refused because the page compressed too poorly (with the
    /// "reject" policy for incompressible pages).
    reject_compress_poor,
    /// Loads whose object did not decompress (pool corruption).
    decompress_fail,
    /// Pages written back from the pool to the backing tier.
    written_back_pages,
    /// Pages held in the pool, same-filled ones included (a gauge).
    stored_pages,
    /// Of those, pages held uncompressed because they did not compress.
    stored_incompressible_pages,
    /// Of those, pages recorded as one repeated word, without pool memory.
    same_filled_pages,
    /// Sum of the sizes of the pool objects entries refer to (a gauge;
    /// duplicates counted once per entry).
    stored_payload_bytes,
    /// Stores compressed with the cold compressor (`Cache::store_cold`
    /// with `CacheConfig::cold_compressor` set).
    cold_stores,
    /// Pages held in the backing tier (a gauge).
    backing_pages,
    /// Stores that went straight to the backing tier (pool full, page
    /// refused by the pool, or IO-aware admission).
    stores_to_backing,
    /// Pages the IO-aware admission sent to the backing tier because the
    /// device was idle.
    reject_io,
    /// Stores of pages identical to a stored one, which share its object.
    duplicate_pages,
    /// Pool bytes sharing saves now: for every shared object, its size
    /// times the references beyond the first (a gauge).
    dedup_saved_bytes,
    /// Loads served by decompressing from the pool.
    loads_pool,
    /// Loads served from the backing tier.
    loads_backing,
    /// Time the loads from the pool took, in all (ns: lookup, decompression
    /// and free; what a fault from the pool costs beyond its round trip).
    load_pool_ns,
    /// Time the loads from the backing tier took, in all (ns: the read,
    /// its check and decompression).
    load_backing_ns,
    /// Loads of same-filled pages (no decompression).
    loads_same_filled,
    /// Loads of keys the cache does not hold.
    load_misses,
    /// Entries dropped by invalidate or invalidate_area.
    invalidated_pages,
    /// Writeback batches (each one or a few vectored writes).
    writeback_batches,
    /// Vectored writes issued to the backing tier.
    backing_writes,
    /// Writeback batches that failed to write; their pages stayed in the pool.
    writeback_fail,
    /// Entries skipped by writeback because they were used since the last
    /// pass (second chance).
    writeback_second_chance,
    /// Pages written back in the background by the age or share policy.
    proactive_written_back_pages,
    /// Loads that failed because the backing tier could not be read.
    backing_read_fail,
    /// Loads that failed because a backing slot did not authenticate
    /// (corrupt, tampered or stale).
    backing_corrupt,
    /// Times the writer compacted the pool to turn freed objects into pages.
    writer_compactions,
}
