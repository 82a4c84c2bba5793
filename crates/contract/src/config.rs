//! The run configuration: what `uzswap run` asks of the runtime, checked
//! in one place ([`RunConfig::validate`]) and carried in the environment
//! ([`RunConfig::to_env`] on one side, [`RunConfig::from_env`] on the
//! other).
//!
//! # Encoding
//! Sizes are whole numbers of bytes (no unit), switches are `1` or `0`,
//! compressors are written as `--compressor` takes them (`zstd:-1`),
//! paths as they are. An empty cold compressor, backing path or final
//! statistics path means none (as if unset); any other empty value is
//! refused.

use crate::names;
use serde::{Deserialize, Serialize};
use std::ffi::{OsStr, OsString};
use std::path::PathBuf;
use uzswap_cache::codec::BadCompressor;
use uzswap_cache::Compressor;

/// The address space reserved when [`names::RESERVE`] is unset: 1 TiB.
pub const DEFAULT_RESERVE: u64 = 1 << 40;

/// The smallest budget: 16 pages of 4 KiB.
pub const MIN_MEMORY_MAX: u64 = 64 << 10;

/// What the runtime of one program is started with.
///
/// In a [`crate::Snapshot`] (its `config` object) `final_stats` and
/// `reserve` are not written: the first is a private temporary path, the
/// second is reported as `space.reserved_bytes`; read back they are `None`
/// and [`DEFAULT_RESERVE`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    /// Resident budget in bytes of the program's heap and anonymous
    /// mappings plus the runtime's own heap; at least
    /// [`MIN_MEMORY_MAX`].
    pub memory_max: u64,
    /// The pool's limit in bytes; `None`: 20 % of RAM. Never `Some(0)`.
    pub pool_max: Option<u64>,
    /// The compressor of new stores.
    #[serde(with = "compressor")]
    pub compressor: Compressor,
    /// The compressor of pages that never joined the working set; `None`:
    /// [`RunConfig::compressor`] for every page.
    #[serde(with = "opt_compressor")]
    pub cold_compressor: Option<Compressor>,
    /// The backing tier: a local file or a Redis/Valkey server or cluster
    /// ([`BackingTier`]); `None`: pages the pool cannot take stay resident.
    /// In the environment and a snapshot: the path, or the address.
    #[serde(with = "backing_tier")]
    pub backing: Option<BackingTier>,
    /// Keep the pool's copy of a page brought back (`--keep-clean`).
    pub keep_clean: bool,
    /// A fault handler on every CPU (`--cpu-handlers`).
    pub cpu_handlers: bool,
    /// Co-scheduling (on unless `--no-cosched`): a process with one thread
    /// of its own that is under memory pressure runs on one CPU with the
    /// runtime's threads, which run there only while it waits (see the
    /// preload crate's `cosched` module).
    pub cosched: bool,
    /// Hold a CPU latency request of 0 µs while faults arrive (on unless
    /// `--no-latency-hold`; root only): idle CPUs poll instead of halting,
    /// so a fault's hand-off wakes no halted CPU (`uzswap_os::latency`).
    pub latency_hold: bool,
    /// Victims chosen by use, reads included (`--access-signal`; off by
    /// default: no faster on a parallel build): each process's
    /// regions are cut into chunk mappings whose accessed bits the evictor
    /// samples (the region crate's `pager/access.rs`).
    pub access_signal: bool,
    /// Store identical pages once (`--dedup`).
    pub dedup: bool,
    /// The base path of the final statistics file (the runtime appends
    /// `.PID`: [`names::final_stats_path`]); `None`: none is written.
    #[serde(skip)]
    pub final_stats: Option<PathBuf>,
    /// Bytes of address space (`PROT_NONE`: it costs no memory) reserved
    /// at start for the program's managed mappings, rounded up to 256 MiB
    /// chunks. A program whose anonymous mappings outgrow it sees `mmap`
    /// and `malloc` fail (`ENOMEM`). Default [`DEFAULT_RESERVE`] (1 TiB).
    #[serde(skip, default = "default_reserve")]
    pub reserve: u64,
    /// The ledger of the whole process tree (`uzswap-ledger`): where this
    /// process reports what it holds and reads what it may hold. With a
    /// ledger, [`RunConfig::memory_max`] is the budget of the whole tree
    /// and this process holds only its allotment of it; `None`: the budget
    /// is this process's alone (the library's regions, tests).
    #[serde(skip)]
    pub ledger: Option<PathBuf>,
    /// What the keys of a remote backing tier start with: `uzswap run`
    /// gives each run its own, and deletes at the end every key under it
    /// that the run's processes left (one that exec'd, one that was
    /// killed). `None`: `uzswap`. Unused with a file.
    #[serde(skip)]
    pub remote_prefix: Option<String>,
}

/// Where pages the pool cannot take are written back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackingTier {
    /// A local file: a directory (an unnamed encrypted file is made in
    /// it) or a new file's path.
    File(PathBuf),
    /// A Redis or Valkey node or cluster, as
    /// `redis://HOST:PORT[,HOST:PORT...]` (checked by
    /// [`RunConfig::validate`]).
    Redis(String),
}

impl BackingTier {
    /// The tier a value names: an address if it starts with `redis://`,
    /// else a path.
    pub fn parse(v: OsString) -> BackingTier {
        match v.to_str() {
            Some(s) if uzswap_remote::RedisUrl::is_remote(s) => BackingTier::Redis(s.to_string()),
            _ => BackingTier::File(PathBuf::from(v)),
        }
    }

    /// The value that names it ([`BackingTier::parse`] reads it back).
    pub fn to_os_string(&self) -> OsString {
        match self {
            BackingTier::File(p) => p.clone().into_os_string(),
            BackingTier::Redis(u) => u.into(),
        }
    }

    /// For messages: "the backing file" or "the remote tier".
    pub fn noun(&self) -> &'static str {
        match self {
            BackingTier::File(_) => "the backing file",
            BackingTier::Redis(_) => "the remote tier",
        }
    }

    /// What to check when writing to the tier or reading from it fails,
    /// and the way out.
    pub fn failing_remedy(&self) -> String {
        match self {
            BackingTier::File(_) => "is its disk full? free space there or name another \
                                     directory with --backing-file; check the device under it"
                .into(),
            BackingTier::Redis(u) => format!(
                "is the server at {u} up, reachable, and under its maxmemory \
                 (a server that evicts keys loses pages)? fix it, or use --backing-file"
            ),
        }
    }
}

impl std::fmt::Display for BackingTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BackingTier::File(p) => write!(f, "{}", p.display()),
            BackingTier::Redis(u) => f.write_str(u),
        }
    }
}

impl From<&str> for BackingTier {
    fn from(s: &str) -> BackingTier {
        BackingTier::parse(s.into())
    }
}

fn default_reserve() -> u64 {
    DEFAULT_RESERVE
}

impl Default for RunConfig {
    /// Every setting at its default and a budget of [`MIN_MEMORY_MAX`].
    fn default() -> RunConfig {
        RunConfig::new(MIN_MEMORY_MAX)
    }
}

/// Why a run configuration was refused. Each message says what was wrong
/// and what to give instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A size that is not a whole number of bytes.
    #[error("{name}={value:?} is not a number of bytes: give a whole number, such as 67108864 for 64 MiB")]
    NotBytes {
        /// The variable.
        name: &'static str,
        /// What it held.
        value: String,
    },
    /// A switch that is neither `1` nor `0`.
    #[error("{name}={value:?} is not a switch: use 1 (on) or 0 (off)")]
    NotSwitch {
        /// The variable.
        name: &'static str,
        /// What it held.
        value: String,
    },
    /// A value that is not valid UTF-8 where text is expected.
    #[error("{name} is not valid UTF-8: give it in plain text")]
    NotUnicode {
        /// The variable.
        name: &'static str,
    },
    /// A compressor the cache does not have (or a level out of range).
    #[error("{name}: {source}")]
    BadCompressor {
        /// The variable.
        name: &'static str,
        /// What was wrong with it.
        source: BadCompressor,
    },
    /// A budget below [`MIN_MEMORY_MAX`].
    #[error("the memory max (--memory-max, UZSWAP_MEMORY_MAX) is {bytes} bytes: the budget must be at least 64K (16 pages)")]
    MemoryMaxTooSmall {
        /// The budget given.
        bytes: u64,
    },
    /// A pool limit of 0.
    #[error("the pool max (--pool-max, UZSWAP_POOL_MAX) is 0: the pool needs room (omit it for 20% of RAM)")]
    PoolMaxZero,
    /// A remote tier's address that is malformed.
    #[error("the backing tier (--backing, UZSWAP_BACKING): {0}")]
    BadRemote(#[from] uzswap_remote::BadUrl),
}

impl RunConfig {
    /// A budget of `memory_max` bytes with every other setting at its
    /// default (not yet validated).
    pub fn new(memory_max: u64) -> RunConfig {
        RunConfig {
            memory_max,
            pool_max: None,
            compressor: Compressor::default(),
            cold_compressor: None,
            backing: None,
            keep_clean: false,
            cpu_handlers: false,
            cosched: true,
            latency_hold: true,
            access_signal: false,
            dedup: false,
            final_stats: None,
            reserve: DEFAULT_RESERVE,
            ledger: None,
            remote_prefix: None,
        }
    }

    /// Checks the settings that their types do not: the budget is at
    /// least 16 pages, the pool has room, the compressors' levels are in
    /// range. The one place these rules live: `uzswap run` calls it before
    /// starting the program, the runtime (through
    /// [`RunConfig::from_lookup`]) before managing anything.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.memory_max < MIN_MEMORY_MAX {
            return Err(ConfigError::MemoryMaxTooSmall {
                bytes: self.memory_max,
            });
        }
        if self.pool_max == Some(0) {
            return Err(ConfigError::PoolMaxZero);
        }
        self.compressor
            .validate()
            .map_err(|source| ConfigError::BadCompressor {
                name: names::COMPRESSOR,
                source,
            })?;
        if let Some(c) = self.cold_compressor {
            c.validate().map_err(|source| ConfigError::BadCompressor {
                name: names::COLD_COMPRESSOR,
                source,
            })?;
        }
        if let Some(BackingTier::Redis(url)) = &self.backing {
            uzswap_remote::RedisUrl::parse(url)?;
        }
        Ok(())
    }

    /// The variables that carry this configuration, as `(name, value)`.
    /// Settings at "none" (`pool_max`, `cold_compressor`, `backing`,
    /// `final_stats`) are left out: remove every name of [`names::ALL`]
    /// first, then set these.
    pub fn to_env(&self) -> Vec<(&'static str, OsString)> {
        let switch = |on: bool| OsString::from(if on { "1" } else { "0" });
        let mut env = vec![
            (names::MEMORY_MAX, self.memory_max.to_string().into()),
            (names::COMPRESSOR, self.compressor.to_string().into()),
            (names::DEDUP, switch(self.dedup)),
            (names::KEEP_CLEAN, switch(self.keep_clean)),
            (names::CPU_HANDLERS, switch(self.cpu_handlers)),
            (names::COSCHED, switch(self.cosched)),
            (names::LATENCY_HOLD, switch(self.latency_hold)),
            (names::ACCESS_SIGNAL, switch(self.access_signal)),
            (names::RESERVE, self.reserve.to_string().into()),
        ];
        if let Some(p) = self.pool_max {
            env.push((names::POOL_MAX, p.to_string().into()));
        }
        if let Some(c) = self.cold_compressor {
            env.push((names::COLD_COMPRESSOR, c.to_string().into()));
        }
        if let Some(b) = &self.backing {
            env.push((names::BACKING, b.to_os_string()));
        }
        if let Some(l) = &self.ledger {
            env.push((names::LEDGER, l.clone().into_os_string()));
        }
        if let Some(p) = &self.remote_prefix {
            env.push((names::REMOTE_PREFIX, p.into()));
        }
        if let Some(f) = &self.final_stats {
            env.push((names::FINAL_STATS, f.clone().into_os_string()));
        }
        env
    }

    /// The configuration in this process's environment: `Ok(None)` if
    /// [`names::MEMORY_MAX`] is unset (nothing is to be managed).
    pub fn from_env() -> Result<Option<RunConfig>, ConfigError> {
        RunConfig::from_lookup(|n: &str| std::env::var_os(n))
    }

    /// The configuration in the variables `get` returns (`None`: unset),
    /// parsed and validated: `Ok(None)` if [`names::MEMORY_MAX`] is unset.
    pub fn from_lookup<V: Into<OsString>>(
        get: impl Fn(&str) -> Option<V>,
    ) -> Result<Option<RunConfig>, ConfigError> {
        let get = |name: &str| -> Option<OsString> { get(name).map(Into::into) };
        let Some(memory_max) = get(names::MEMORY_MAX) else {
            return Ok(None);
        };
        let switch_or = |name: &'static str, unset: bool| match get(name) {
            None => Ok(unset),
            Some(v) => match utf8(name, v)?.as_str() {
                "1" => Ok(true),
                "0" => Ok(false),
                other => Err(ConfigError::NotSwitch {
                    name,
                    value: other.to_string(),
                }),
            },
        };
        let switch = |name: &'static str| switch_or(name, false);
        let codec = |name: &'static str, v: OsString| {
            utf8(name, v)?
                .parse::<Compressor>()
                .map_err(|source| ConfigError::BadCompressor { name, source })
        };
        // Empty means none for these (as an unset variable).
        let nonempty = |name: &str| get(name).filter(|v: &OsString| !v.is_empty());
        let config = RunConfig {
            memory_max: parse_bytes(names::MEMORY_MAX, memory_max)?,
            pool_max: get(names::POOL_MAX)
                .map(|v| parse_bytes(names::POOL_MAX, v))
                .transpose()?,
            compressor: get(names::COMPRESSOR)
                .map(|v| codec(names::COMPRESSOR, v))
                .transpose()?
                .unwrap_or_default(),
            cold_compressor: nonempty(names::COLD_COMPRESSOR)
                .map(|v| codec(names::COLD_COMPRESSOR, v))
                .transpose()?,
            backing: nonempty(names::BACKING).map(BackingTier::parse),
            keep_clean: switch(names::KEEP_CLEAN)?,
            cpu_handlers: switch(names::CPU_HANDLERS)?,
            cosched: switch_or(names::COSCHED, true)?,
            latency_hold: switch_or(names::LATENCY_HOLD, true)?,
            access_signal: switch(names::ACCESS_SIGNAL)?,
            dedup: switch(names::DEDUP)?,
            final_stats: nonempty(names::FINAL_STATS).map(PathBuf::from),
            ledger: nonempty(names::LEDGER).map(PathBuf::from),
            remote_prefix: nonempty(names::REMOTE_PREFIX)
                .map(|v| utf8(names::REMOTE_PREFIX, v))
                .transpose()?,
            reserve: RunConfig::reserve_from_lookup(get)?,
        };
        config.validate()?;
        Ok(Some(config))
    }

    /// [`RunConfig::reserve`] as the environment `get` reads gives it
    /// (`uzswap run` has no flag for it: it passes its own environment's
    /// value on, checked before the program starts).
    pub fn reserve_from_lookup<V: Into<OsString>>(
        get: impl Fn(&str) -> Option<V>,
    ) -> Result<u64, ConfigError> {
        Ok(get(names::RESERVE)
            .map(|v| parse_bytes(names::RESERVE, v.into()))
            .transpose()?
            .unwrap_or(DEFAULT_RESERVE))
    }
}

/// The text of variable `name`.
fn utf8(name: &'static str, v: OsString) -> Result<String, ConfigError> {
    v.into_string()
        .map_err(|_| ConfigError::NotUnicode { name })
}

/// A size in bytes from variable `name`.
fn parse_bytes(name: &'static str, v: OsString) -> Result<u64, ConfigError> {
    let v = utf8(name, v)?;
    v.parse::<u64>()
        .map_err(|_| ConfigError::NotBytes { name, value: v })
}

/// A compressor as its name (`zstd:-1`).
mod compressor {
    use super::*;

    pub fn serialize<S: serde::Serializer>(c: &Compressor, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(c)
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Compressor, D::Error> {
        let name = String::deserialize(d)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

/// An optional compressor as its name or `null`.
mod opt_compressor {
    use super::*;

    pub fn serialize<S: serde::Serializer>(
        c: &Option<Compressor>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        c.map(|c| c.to_string()).serialize(s)
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Compressor>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|n| n.parse().map_err(serde::de::Error::custom))
            .transpose()
    }
}

/// An optional backing tier as text: the address, or the path (not valid
/// UTF-8: replaced characters, as it is for display; a path in the
/// statistics is for reading).
mod backing_tier {
    use super::*;

    pub fn serialize<S: serde::Serializer>(
        b: &Option<BackingTier>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        b.as_ref()
            .map(|b| OsStr::to_string_lossy(&b.to_os_string()).into_owned())
            .serialize(s)
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<Option<BackingTier>, D::Error> {
        Ok(Option::<String>::deserialize(d)?.map(|s| BackingTier::parse(s.into())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn lookup(vars: &[(&str, &str)]) -> Result<Option<RunConfig>, ConfigError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        RunConfig::from_lookup(|n| map.get(n).cloned())
    }

    fn every_setting() -> RunConfig {
        RunConfig {
            memory_max: 24 << 20,
            pool_max: Some(8 << 20),
            compressor: "lz4hc:3".parse().unwrap(),
            cold_compressor: Some("zstd:-1".parse().unwrap()),
            backing: Some("/var/tmp".into()),
            keep_clean: true,
            cpu_handlers: true,
            cosched: false,
            latency_hold: false,
            access_signal: true,
            dedup: true,
            final_stats: Some("/tmp/uzswap-run.1.0/stats.json".into()),
            reserve: 1 << 36,
            ledger: Some("/proc/1/fd/3".into()),
            remote_prefix: Some("uzswap:0123456789abcdef".into()),
        }
    }

    #[test]
    fn the_environment_round_trips() {
        let mut remote = every_setting();
        remote.backing = Some(BackingTier::Redis(
            "redis://10.0.0.1:7000,10.0.0.2:7000".into(),
        ));
        for config in [every_setting(), RunConfig::new(1 << 30), remote] {
            config.validate().unwrap();
            let env: HashMap<&str, OsString> = config.to_env().into_iter().collect();
            assert!(env.keys().all(|k| names::ALL.contains(k)), "{env:?}");
            let back = RunConfig::from_lookup(|n| env.get(n).cloned()).unwrap();
            assert_eq!(back, Some(config));
        }
    }

    #[test]
    fn unset_memory_max_manages_nothing() {
        assert_eq!(lookup(&[]), Ok(None));
        assert_eq!(lookup(&[(names::POOL_MAX, "garbage")]), Ok(None));
    }

    #[test]
    fn defaults_and_empty_values() {
        let c = lookup(&[
            (names::MEMORY_MAX, "1048576"),
            (names::COLD_COMPRESSOR, ""),
            (names::BACKING, ""),
            (names::FINAL_STATS, ""),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(c, RunConfig::new(1 << 20));
        assert_eq!(c.reserve, DEFAULT_RESERVE);
        assert_eq!(c.compressor, Compressor::Lz4);
    }

    #[test]
    fn every_bad_value_is_refused_with_its_error() {
        let mm = (names::MEMORY_MAX, "1048576");
        let not_bytes = |name: &'static str, value: &str| {
            Err(ConfigError::NotBytes {
                name,
                value: value.into(),
            })
        };
        assert_eq!(
            lookup(&[(names::MEMORY_MAX, "64M")]),
            not_bytes(names::MEMORY_MAX, "64M")
        );
        assert_eq!(
            lookup(&[(names::MEMORY_MAX, "")]),
            not_bytes(names::MEMORY_MAX, "")
        );
        assert_eq!(
            lookup(&[mm, (names::POOL_MAX, "-1")]),
            not_bytes(names::POOL_MAX, "-1")
        );
        assert_eq!(
            lookup(&[mm, (names::RESERVE, "1T")]),
            not_bytes(names::RESERVE, "1T")
        );
        for name in [
            names::DEDUP,
            names::KEEP_CLEAN,
            names::CPU_HANDLERS,
            names::COSCHED,
        ] {
            assert_eq!(
                lookup(&[mm, (name, "yes")]),
                Err(ConfigError::NotSwitch {
                    name,
                    value: "yes".into()
                })
            );
        }
        for name in [names::COMPRESSOR, names::COLD_COMPRESSOR] {
            let e = lookup(&[mm, (name, "zstd:99")]).unwrap_err();
            assert!(
                matches!(&e, ConfigError::BadCompressor { name: n, .. } if *n == name),
                "{e:?}"
            );
            assert!(e.to_string().contains("zstd level out of range"), "{e}");
        }
        assert!(matches!(
            lookup(&[mm, (names::COMPRESSOR, "")]),
            Err(ConfigError::BadCompressor { .. })
        ));
        assert_eq!(
            lookup(&[(names::MEMORY_MAX, "65535")]),
            Err(ConfigError::MemoryMaxTooSmall { bytes: 65535 })
        );
        assert_eq!(
            lookup(&[mm, (names::POOL_MAX, "0")]),
            Err(ConfigError::PoolMaxZero)
        );
        let not_utf8 = RunConfig::from_lookup(|n| {
            use std::os::unix::ffi::OsStringExt;
            (n == names::MEMORY_MAX).then(|| OsString::from_vec(vec![0xff]))
        });
        assert_eq!(
            not_utf8,
            Err(ConfigError::NotUnicode {
                name: names::MEMORY_MAX
            })
        );
    }

    #[test]
    fn validate_refuses_what_the_types_allow() {
        let mut c = RunConfig::new(MIN_MEMORY_MAX);
        assert_eq!(c.validate(), Ok(()));
        c.memory_max -= 1;
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("at least 64K"));
        c.memory_max = 1 << 30;
        c.cold_compressor = Some(Compressor::Zstd { level: 99 });
        assert!(matches!(
            c.validate(),
            Err(ConfigError::BadCompressor { name, .. }) if name == names::COLD_COMPRESSOR
        ));
    }

    #[test]
    fn a_remote_tier_is_told_from_a_path_and_checked() {
        let mm = (names::MEMORY_MAX, "1048576");
        let c = lookup(&[mm, (names::BACKING, "redis://127.0.0.1:6379")])
            .unwrap()
            .unwrap();
        assert_eq!(
            c.backing,
            Some(BackingTier::Redis("redis://127.0.0.1:6379".into()))
        );
        let c = lookup(&[mm, (names::BACKING, "/var/tmp")])
            .unwrap()
            .unwrap();
        assert_eq!(c.backing, Some(BackingTier::File("/var/tmp".into())));
        let e = lookup(&[mm, (names::BACKING, "redis://host")]).unwrap_err();
        assert!(matches!(e, ConfigError::BadRemote(_)), "{e:?}");
        assert!(e.to_string().contains(uzswap_remote::URL_FORM), "{e}");
    }

    #[test]
    fn the_reserve_is_read_apart() {
        let none = |_: &str| None::<String>;
        assert_eq!(RunConfig::reserve_from_lookup(none), Ok(DEFAULT_RESERVE));
        let some = |n: &str| (n == names::RESERVE).then(|| "4096".to_string());
        assert_eq!(RunConfig::reserve_from_lookup(some), Ok(4096));
        let bad = |n: &str| (n == names::RESERVE).then(|| "lots".to_string());
        assert!(matches!(
            RunConfig::reserve_from_lookup(bad),
            Err(ConfigError::NotBytes { .. })
        ));
    }
}
