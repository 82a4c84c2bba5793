//! Pool statistics: the per-class table zsmalloc shows in its debugfs
//! `classes` file, plus totals.

use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// Number of buckets in the fullness histogram: 0 %, 1–10 %, …, 91–100 %.
pub const FULLNESS_BUCKETS: usize = 11;

/// One row of the class table (the columns of zsmalloc's `classes` file).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ClassStats {
    /// Class index (position in the pool's class table).
    pub class: u32,
    /// Slot size in bytes.
    pub size: u32,
    /// Zspages that are partly used with at least 3/4 of their slots in use.
    pub almost_full: u64,
    /// Zspages that are partly used with fewer than 3/4 of slots in use.
    pub almost_empty: u64,
    /// Slots in all zspages of the class.
    pub obj_allocated: u64,
    /// Slots holding a live object.
    pub obj_used: u64,
    /// Pages held by the class.
    pub pages_used: u64,
    /// Pages per zspage of this class.
    pub pages_per_zspage: u32,
    /// Pages compaction could free: whole zspages' worth of unused slots.
    pub freeable: u64,
    /// Zspages per fullness bucket (index 0: empty, 10: 91–100 % used).
    pub fullness: [u64; FULLNESS_BUCKETS],
}

/// A snapshot of a pool.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PoolStats {
    /// Allocator name.
    pub allocator: &'static str,
    /// Rows for classes that hold at least one page (all rows in `all_classes`).
    pub classes: Vec<ClassStats>,
    /// Pages held from the OS.
    pub pages_held: u64,
    /// pages_held × 4096.
    pub pool_bytes: u64,
    /// Live objects.
    pub objects: u64,
    /// Sum of the sizes of live objects, as requested by callers.
    pub payload_bytes: u64,
    /// Heap memory of the pool's own bookkeeping (handle tables, lists).
    pub metadata_bytes: u64,
    /// Hard limit, if any.
    pub limit_bytes: Option<u64>,
    /// Compaction runs (manual and automatic).
    pub compactions: u64,
    /// Objects moved by compaction.
    pub objects_moved: u64,
    /// Pages returned to the OS by compaction.
    pub pages_compacted: u64,
    /// Allocator-specific counters (name, value).
    pub extra: Vec<(String, u64)>,
}

/// What one compaction pass did.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq, Eq)]
pub struct CompactReport {
    /// Objects moved.
    pub objects_moved: u64,
    /// Pages given back to the OS.
    pub pages_freed: u64,
}

impl PoolStats {
    /// The allocator-specific counter `name`, if this allocator has one.
    pub fn extra(&self, name: &str) -> Option<u64> {
        self.extra.iter().find(|(k, _)| k == name).map(|&(_, v)| v)
    }

    /// pool_bytes / payload_bytes − 1, or 0 for an empty pool.
    pub fn overhead(&self) -> f64 {
        if self.payload_bytes == 0 {
            0.0
        } else {
            self.pool_bytes as f64 / self.payload_bytes as f64 - 1.0
        }
    }

    /// Sum of the freeable column.
    pub fn freeable(&self) -> u64 {
        self.classes.iter().map(|c| c.freeable).sum()
    }

    /// The class table in the layout of the kernel's debugfs file, with the
    /// fullness histogram appended and a totals line.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{:>5} {:>5} {:>11} {:>12} {:>13} {:>10} {:>10} {:>16} {:>8}  fullness(0%,..,100%)",
            "class",
            "size",
            "almost_full",
            "almost_empty",
            "obj_allocated",
            "obj_used",
            "pages_used",
            "pages_per_zspage",
            "freeable"
        );
        let mut t = ClassStats::default();
        for c in &self.classes {
            let hist: Vec<String> = c.fullness.iter().map(|n| n.to_string()).collect();
            let _ = writeln!(
                s,
                "{:>5} {:>5} {:>11} {:>12} {:>13} {:>10} {:>10} {:>16} {:>8}  {}",
                c.class,
                c.size,
                c.almost_full,
                c.almost_empty,
                c.obj_allocated,
                c.obj_used,
                c.pages_used,
                c.pages_per_zspage,
                c.freeable,
                hist.join(",")
            );
            t.almost_full += c.almost_full;
            t.almost_empty += c.almost_empty;
            t.obj_allocated += c.obj_allocated;
            t.obj_used += c.obj_used;
            t.pages_used += c.pages_used;
            t.freeable += c.freeable;
        }
        let _ = writeln!(
            s,
            "{:>5} {:>5} {:>11} {:>12} {:>13} {:>10} {:>10} {:>16} {:>8}",
            "Total",
            "",
            t.almost_full,
            t.almost_empty,
            t.obj_allocated,
            t.obj_used,
            t.pages_used,
            "",
            t.freeable
        );
        let _ = writeln!(
            s,
            "allocator {}  objects {}  payload {} B  pool {} B ({} pages)  overhead {:.2} %  metadata {} B  compactions {}  moved {}  pages_compacted {}",
            self.allocator,
            self.objects,
            self.payload_bytes,
            self.pool_bytes,
            self.pages_held,
            self.overhead() * 100.0,
            self.metadata_bytes,
            self.compactions,
            self.objects_moved,
            self.pages_compacted
        );
        for (k, v) in &self.extra {
            let _ = writeln!(s, "{k} {v}");
        }
        s
    }

    /// The snapshot as one JSON object.
    pub fn to_json(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self).expect("stats serialize");
        v["overhead"] = serde_json::json!(self.overhead());
        v
    }
}
