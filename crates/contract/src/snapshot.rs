//! The statistics schema: one [`Snapshot`] of a managed program, which the
//! runtime serves on its socket and writes at exit, and which `uzswap run`
//! and `uzswap stats` read back.
//!
//! # The JSON
//! [`Snapshot::to_json`] writes one object whose keys are sorted at every
//! level:
//! `cache` (the cache's counters, [`CacheStats`]), `config` (the
//! [`RunConfig`]), `pager` ([`PagerStats`] without its `store` object: the
//! cache's counters are there in full), `pid`, `pool` ([`PoolSection`]),
//! `pool_table` (the pool's class table as text), `cosched`
//! ([`CoschedStats`]), `runtime_heap`
//! ([`RuntimeHeap`]), `space` ([`SpaceStats`]), `uptime_s`, `version`
//! ([`SCHEMA_VERSION`]).
//!
//! [`Snapshot::from_json`] is strict where a mismatch would otherwise
//! read as zeros: a missing field is an error (a renamed one is missing),
//! and so is an unknown field at the top level, in `config`, `pager`,
//! `cache`, `space`, `runtime_heap`, `cosched` and `pool`.

use crate::RunConfig;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use std::fmt;
use uzswap_cache::CacheStats;
use uzswap_region::PagerStats;
use uzswap_zpool::{ClassStats, PoolStats};

/// The schema's version, the snapshot's `version`. Raised when a field
/// changes meaning or goes away.
pub const SCHEMA_VERSION: u32 = 1;

/// Everything the runtime of one program reports.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Snapshot {
    /// [`SCHEMA_VERSION`] of the writer.
    pub version: u32,
    /// The program's process id.
    pub pid: u32,
    /// Seconds since the runtime started.
    pub uptime_s: f64,
    /// What the runtime was started with.
    pub config: RunConfig,
    /// The pager's counters; its `store` is not in the JSON (read back it
    /// is all zeros): the cache's own counters are `cache`.
    #[serde(with = "pager_section")]
    pub pager: PagerStats,
    /// The cache's counters.
    #[serde(deserialize_with = "strict")]
    pub cache: CacheStats,
    /// The managed address space.
    pub space: SpaceStats,
    /// The runtime's own heap.
    pub runtime_heap: RuntimeHeap,
    /// Co-scheduling.
    pub cosched: CoschedStats,
    /// The compressed pool.
    pub pool: PoolSection,
    /// The pool's class table, as text (`PoolStats::table`).
    pub pool_table: String,
}

impl Default for Snapshot {
    /// This schema's version, all counters zero, a default configuration:
    /// for tests of what renders a snapshot.
    fn default() -> Snapshot {
        Snapshot {
            version: SCHEMA_VERSION,
            pid: 0,
            uptime_s: 0.0,
            config: RunConfig::default(),
            pager: PagerStats::default(),
            cache: CacheStats::default(),
            space: SpaceStats::default(),
            runtime_heap: RuntimeHeap::default(),
            cosched: CoschedStats::default(),
            pool: PoolSection::default(),
            pool_table: String::new(),
        }
    }
}

/// The managed address space: one reservation carved into the program's
/// mappings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpaceStats {
    /// Bytes reserved (`RunConfig::reserve` rounded up to chunks).
    pub reserved_bytes: u64,
    /// Bytes of it the program has mapped now.
    pub mapped_bytes: u64,
    /// Highest `mapped_bytes` seen.
    pub peak_mapped_bytes: u64,
    /// Chunks made into pager regions.
    pub active_chunks: u64,
    /// `mmap` calls served from the reservation.
    pub mmaps: u64,
    /// `munmap` calls on it.
    pub munmaps: u64,
    /// `mremap` calls on it.
    pub mremaps: u64,
    /// Of those, the ones that had to copy (the mapping could not grow in
    /// place).
    pub mremap_copies: u64,
    /// `mmap(MAP_FIXED)` calls over a range the program held of it, served
    /// in place (the range stays managed): how the JVM and Go commit and
    /// uncommit their heaps.
    pub fixed_in_place: u64,
    /// Bytes of it the program's own `MAP_FIXED` mappings replaced (an
    /// executable, shared or file mapping, or one over a free range): not
    /// managed from then on.
    pub retired_bytes: u64,
}

/// The runtime's own heap (glibc's: the cache index, the pager's tables and
/// every other allocation of the runtime).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeHeap {
    /// Bytes in use.
    pub in_use_bytes: u64,
    /// Bytes glibc holds from the OS for it: what the budget pays for.
    pub held_bytes: u64,
}

/// Co-scheduling (the preload runtime's `cosched` module): whether it
/// runs, where the program's thread is pinned now, how often it was pinned
/// and let go.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CoschedStats {
    /// The watcher runs: asked for (`--no-cosched` not given), possible
    /// here (more than one CPU, the right to leave idle priority) and not
    /// with CPU handlers.
    pub active: bool,
    /// The CPU the program's thread is pinned to now.
    pub pinned_cpu: Option<u32>,
    /// Times it was pinned.
    pub pins: u64,
    /// Times it was let go (a thread of its own started, or crowded).
    pub releases: u64,
    /// Of those, because it waited for its CPU.
    pub crowded: u64,
}

/// The pool: [`PoolStats`] (each field as there; `allocator` owned, to be
/// read back) and its overhead.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolSection {
    pub allocator: String,
    pub classes: Vec<ClassStats>,
    pub pages_held: u64,
    pub pool_bytes: u64,
    pub objects: u64,
    pub payload_bytes: u64,
    pub metadata_bytes: u64,
    pub limit_bytes: Option<u64>,
    pub compactions: u64,
    pub objects_moved: u64,
    pub pages_compacted: u64,
    pub extra: Vec<(String, u64)>,
    /// [`PoolStats::overhead`]: pool_bytes / payload_bytes − 1, or 0 for an
    /// empty pool.
    pub overhead: f64,
}

impl From<&PoolStats> for PoolSection {
    fn from(p: &PoolStats) -> PoolSection {
        // Every field named: one added to PoolStats must be placed here.
        let PoolStats {
            allocator,
            classes,
            pages_held,
            pool_bytes,
            objects,
            payload_bytes,
            metadata_bytes,
            limit_bytes,
            compactions,
            objects_moved,
            pages_compacted,
            extra,
        } = p;
        PoolSection {
            allocator: allocator.to_string(),
            classes: classes.clone(),
            pages_held: *pages_held,
            pool_bytes: *pool_bytes,
            objects: *objects,
            payload_bytes: *payload_bytes,
            metadata_bytes: *metadata_bytes,
            limit_bytes: *limit_bytes,
            compactions: *compactions,
            objects_moved: *objects_moved,
            pages_compacted: *pages_compacted,
            extra: extra.clone(),
            overhead: p.overhead(),
        }
    }
}

/// Why statistics could not be read as a [`Snapshot`].
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// Not JSON, or JSON of another schema (a field missing, unknown or of
    /// another type).
    #[error(
        "the statistics do not match this uzswap's schema ({0}): the preload library is \
         probably from another build; use the one built with this uzswap (--preload-lib, \
         UZSWAP_PRELOAD_LIB)"
    )]
    Json(#[source] serde_json::Error),
    /// Another [`SCHEMA_VERSION`].
    #[error(
        "the statistics are of schema version {found} and this uzswap reads version \
         {SCHEMA_VERSION}: use the uzswap binary and the preload library of one build"
    )]
    Version {
        /// The version the writer gave.
        found: u64,
    },
}

impl Snapshot {
    /// The snapshot as one line of JSON, keys sorted at every level.
    pub fn to_json(&self) -> Result<String, serde_json::Error> {
        // Through a Value: its maps are sorted, which gives the key order
        // of the JSON the runtime wrote before the schema was typed.
        Ok(serde_json::to_value(self)?.to_string())
    }

    /// Reads a snapshot from the JSON [`Snapshot::to_json`] wrote.
    pub fn from_json(text: &[u8]) -> Result<Snapshot, SnapshotError> {
        #[derive(Deserialize)]
        struct Head {
            version: u64,
        }
        // The version first: another schema is named as such, not as the
        // first field that differs.
        if let Ok(head) = serde_json::from_slice::<Head>(text) {
            if head.version != u64::from(SCHEMA_VERSION) {
                return Err(SnapshotError::Version {
                    found: head.version,
                });
            }
        }
        serde_json::from_slice(text).map_err(SnapshotError::Json)
    }
}

/// One line of JSON ([`Snapshot::to_json`]).
impl fmt::Display for Snapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_json().map_err(|_| fmt::Error)?)
    }
}

/// A type without `deny_unknown_fields` of its own (it belongs to another
/// crate) read strictly: a key its default does not serialize is refused.
fn strict<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Serialize + DeserializeOwned + Default,
{
    use serde::de::Error;
    let v = Value::deserialize(d)?;
    check_keys::<T>(&v, &[]).map_err(D::Error::custom)?;
    serde_json::from_value(v).map_err(D::Error::custom)
}

/// Refuses a key of object `v` that `T` (by its default's serialization)
/// does not have, or that is one of `omitted`.
fn check_keys<T: Serialize + Default>(v: &Value, omitted: &[&str]) -> Result<(), String> {
    let Value::Object(given) = v else {
        return Err(format!("expected an object, found {v}"));
    };
    let known = serde_json::to_value(T::default()).map_err(|e| e.to_string())?;
    let Value::Object(known) = known else {
        return Err("the type does not serialize as an object".into());
    };
    match given
        .keys()
        .find(|k| !known.contains_key(*k) || omitted.contains(&k.as_str()))
    {
        Some(k) => Err(format!("unknown field `{k}`")),
        None => Ok(()),
    }
}

/// [`PagerStats`] in the snapshot: without its `store` object.
pub mod pager_section {
    use super::*;

    /// The field of [`PagerStats`] the snapshot leaves out.
    const STORE: &str = "store";

    /// The pager's counters as they appear in the snapshot's JSON.
    pub fn to_value(p: &PagerStats) -> Result<Value, serde_json::Error> {
        let mut v = serde_json::to_value(p)?;
        if let Value::Object(m) = &mut v {
            m.remove(STORE);
        }
        Ok(v)
    }

    /// Serializes as [`to_value`].
    pub fn serialize<S: Serializer>(p: &PagerStats, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::Error;
        to_value(p).map_err(S::Error::custom)?.serialize(s)
    }

    /// Reads what [`serialize`] wrote; `store` comes back as zeros.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<PagerStats, D::Error> {
        use serde::de::Error;
        let mut v = Value::deserialize(d)?;
        check_keys::<PagerStats>(&v, &[STORE]).map_err(D::Error::custom)?;
        if let Value::Object(m) = &mut v {
            let zeros = serde_json::to_value(uzswap_region::StoreStats::default())
                .map_err(D::Error::custom)?;
            m.insert(STORE.into(), zeros);
        }
        serde_json::from_value(v).map_err(D::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uzswap_cache::{Cache, CacheConfig};

    /// A snapshot of a real cache holding a few pages, and counters that
    /// are all different from their defaults where it matters.
    fn sample() -> Snapshot {
        let cache = Cache::new(CacheConfig::default()).unwrap();
        cache.open_area(1).unwrap();
        let mut page = vec![0u8; 4096];
        for i in 0..64u64 {
            for (j, b) in page.iter_mut().enumerate() {
                *b = ((j as u64 * (i + 1)) % 251) as u8;
            }
            cache.store(1, i, &page).unwrap();
        }
        let pool = cache.pool_stats();
        let mut pager = PagerStats {
            faults_pool: 3,
            evictions: 70,
            budget_pages: 256,
            over_budget: true,
            ..PagerStats::default()
        };
        pager.fault_latency.count = 3;
        pager.fault_latency.p50_us = 12.7;
        pager.fault_latency.p99_us = 1e-3 / 3.0;
        let mut config = RunConfig::new(24 << 20);
        config.pool_max = Some(8 << 20);
        config.cold_compressor = Some("zstd:-1".parse().unwrap());
        config.backing = Some("/var/tmp".into());
        config.dedup = true;
        Snapshot {
            version: SCHEMA_VERSION,
            pid: 4242,
            uptime_s: 1.0 / 3.0,
            config,
            pager,
            cache: cache.stats(),
            space: SpaceStats {
                reserved_bytes: 1 << 40,
                mapped_bytes: 5 << 20,
                ..SpaceStats::default()
            },
            runtime_heap: RuntimeHeap {
                in_use_bytes: 1000,
                held_bytes: 2000,
            },
            cosched: CoschedStats {
                active: true,
                pinned_cpu: Some(1),
                pins: 2,
                releases: 1,
                crowded: 0,
            },
            pool: PoolSection::from(&pool),
            pool_table: pool.table(),
        }
    }

    fn json_of(s: &Snapshot) -> Value {
        serde_json::from_str(&s.to_json().unwrap()).unwrap()
    }

    fn parse(v: &Value) -> Result<Snapshot, SnapshotError> {
        Snapshot::from_json(v.to_string().as_bytes())
    }

    #[test]
    fn what_the_runtime_writes_the_cli_reads_back_the_same() {
        let s = sample();
        assert!(s.cache.stored_pages > 0 && !s.pool.classes.is_empty());
        let back = Snapshot::from_json(s.to_json().unwrap().as_bytes()).unwrap();
        assert_eq!(back, s);
        assert_eq!(back.to_string(), s.to_json().unwrap());
        let empty = Snapshot::default();
        assert_eq!(
            Snapshot::from_json(empty.to_string().as_bytes()).unwrap(),
            empty
        );
    }

    #[test]
    fn the_json_keeps_its_shape() {
        // One sample for both sides: two caches built alike need not hold
        // the same pool pages (its size differed once in about 30 runs).
        let snap = sample();
        let v = json_of(&snap);
        let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
        assert_eq!(
            keys,
            [
                "cache",
                "config",
                "cosched",
                "pager",
                "pid",
                "pool",
                "pool_table",
                "runtime_heap",
                "space",
                "uptime_s",
                "version"
            ]
        );
        let config: Vec<&String> = v["config"].as_object().unwrap().keys().collect();
        assert_eq!(
            config,
            [
                "access_signal",
                "backing",
                "cold_compressor",
                "compressor",
                "cosched",
                "cpu_handlers",
                "dedup",
                "keep_clean",
                "latency_hold",
                "memory_max",
                "pool_max"
            ]
        );
        assert_eq!(v["config"]["cold_compressor"], "zstd:-1");
        assert_eq!(v["config"]["compressor"], "lz4");
        assert_eq!(v["config"]["backing"], "/var/tmp");
        assert!(v["pager"].get("store").is_none());
        assert_eq!(v["pager"]["fault_latency"]["p50_us"], 12.7);
        assert_eq!(v["pager"]["over_budget"], true);
        // The cache's counters are its pairs, all of them.
        let pairs = snap.cache.pairs();
        assert_eq!(v["cache"].as_object().unwrap().len(), pairs.len());
        for (k, n) in pairs {
            assert_eq!(v["cache"][k], n, "{k}");
        }
        // The pool is PoolStats::to_json.
        let cache = Cache::new(CacheConfig::default()).unwrap();
        let pool = cache.pool_stats();
        assert_eq!(
            serde_json::to_value(PoolSection::from(&pool)).unwrap(),
            pool.to_json()
        );
    }

    #[test]
    fn a_missing_or_renamed_field_is_refused() {
        let good = json_of(&sample());
        for (section, field) in [
            (None, "pager"),
            (None, "uptime_s"),
            (Some("pager"), "evictions"),
            (Some("pager"), "fault_latency"),
            (Some("cache"), "stored_pages"),
            (Some("config"), "memory_max"),
            (Some("space"), "mapped_bytes"),
            (Some("runtime_heap"), "held_bytes"),
            (Some("cosched"), "pins"),
            (Some("pool"), "overhead"),
        ] {
            let mut v = good.clone();
            let obj = match section {
                None => v.as_object_mut().unwrap(),
                Some(s) => v[s].as_object_mut().unwrap(),
            };
            let x = obj.remove(field).unwrap();
            let missing = parse(&v).unwrap_err().to_string();
            assert!(
                missing.contains(&format!("missing field `{field}`")),
                "{field}: {missing}"
            );
            // The same value under a new name.
            let obj = match section {
                None => v.as_object_mut().unwrap(),
                Some(s) => v[s].as_object_mut().unwrap(),
            };
            obj.insert(format!("{field}_renamed"), x);
            assert!(parse(&v).is_err(), "{section:?} {field} renamed was read");
        }
    }

    #[test]
    fn an_unknown_field_is_refused() {
        let good = json_of(&sample());
        for section in [
            None,
            Some("config"),
            Some("pager"),
            Some("cache"),
            Some("space"),
            Some("runtime_heap"),
            Some("pool"),
        ] {
            let mut v = good.clone();
            let obj = match section {
                None => v.as_object_mut().unwrap(),
                Some(s) => v[s].as_object_mut().unwrap(),
            };
            obj.insert("surprise".into(), Value::from(1));
            let e = parse(&v).unwrap_err().to_string();
            assert!(e.contains("unknown field `surprise`"), "{section:?}: {e}");
        }
        // The pager's store is left out, and not read either.
        let mut v = good.clone();
        v["pager"]["store"] = serde_json::json!({});
        assert!(parse(&v).unwrap_err().to_string().contains("`store`"));
    }

    #[test]
    fn another_version_or_no_json_is_named_as_such() {
        let mut v = json_of(&sample());
        v["version"] = Value::from(2);
        assert!(matches!(
            parse(&v),
            Err(SnapshotError::Version { found: 2 })
        ));
        assert!(matches!(
            Snapshot::from_json(b"{\"pid\": 1"),
            Err(SnapshotError::Json(_))
        ));
        let mut v = json_of(&sample());
        v["config"]["compressor"] = Value::from("lzo");
        let e = parse(&v).unwrap_err().to_string();
        assert!(e.contains("lzo is not built in"), "{e}");
    }
}
