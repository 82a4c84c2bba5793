//! Side-by-side references from the running kernel. Everything changed on
//! the machine is put back by a guard's `Drop`, so it is restored on every
//! exit path, errors and panics included.

use anyhow::{bail, Context, Result};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;

/// A zram device made for one measurement; reset and removed on drop.
pub struct ZramDevice {
    pub id: u32,
}

/// mm_stat of a zram device (bytes).
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct ZramStat {
    pub orig_data_size: u64,
    pub compr_data_size: u64,
    pub mem_used_total: u64,
    pub same_pages: u64,
    pub huge_pages: u64,
}

impl ZramDevice {
    /// Adds a zram device with `algorithm` and `disksize` bytes.
    pub fn create(algorithm: &str, disksize: u64) -> Result<ZramDevice> {
        let ctl = "/sys/class/zram-control/hot_add";
        let id: u32 = std::fs::read_to_string(ctl)
            .with_context(|| {
                format!("cannot add a zram device through {ctl}: load the module (modprobe zram) and run as root")
            })?
            .trim()
            .parse()
            .context("zram hot_add returned no device number")?;
        let dev = ZramDevice { id };
        dev.set("comp_algorithm", algorithm)
            .with_context(|| format!("zram has no compressor {algorithm}"))?;
        dev.set("disksize", &disksize.to_string())?;
        Ok(dev)
    }

    fn sys(&self, attr: &str) -> String {
        format!("/sys/block/zram{}/{attr}", self.id)
    }

    fn set(&self, attr: &str, value: &str) -> Result<()> {
        std::fs::write(self.sys(attr), value)
            .with_context(|| format!("writing {value} to {}", self.sys(attr)))
    }

    /// Writes `pages` (a multiple of 4096 bytes) at the start of the device
    /// with O_DIRECT, so every page reaches zram now.
    pub fn write_pages(&self, pages: &[u8]) -> Result<()> {
        let path = format!("/dev/zram{}", self.id);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
            .with_context(|| format!("opening {path}"))?;
        // O_DIRECT wants an aligned buffer: copy through one.
        let layout = std::alloc::Layout::from_size_align(1 << 20, 4096).expect("layout");
        let buf = AlignedBuf::new(layout)?;
        for chunk in pages.chunks(1 << 20) {
            let b = buf.slice(chunk.len());
            b.copy_from_slice(chunk);
            f.write_all(b)
                .with_context(|| format!("writing to {path}"))?;
        }
        f.sync_all()?;
        Ok(())
    }

    pub fn compact(&self) -> Result<()> {
        self.set("compact", "1")
    }

    pub fn mm_stat(&self) -> Result<ZramStat> {
        let s = std::fs::read_to_string(self.sys("mm_stat"))?;
        let v: Vec<u64> = s
            .split_whitespace()
            .map(|x| x.parse().unwrap_or(0))
            .collect();
        if v.len() < 8 {
            bail!("unexpected mm_stat format: {s:?}");
        }
        Ok(ZramStat {
            orig_data_size: v[0],
            compr_data_size: v[1],
            mem_used_total: v[2],
            same_pages: v[5],
            huge_pages: v[7],
        })
    }
}

impl Drop for ZramDevice {
    fn drop(&mut self) {
        let _ = std::fs::write(self.sys("reset"), "1");
        let _ = std::fs::write("/sys/class/zram-control/hot_remove", self.id.to_string());
    }
}

struct AlignedBuf {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

impl AlignedBuf {
    fn new(layout: std::alloc::Layout) -> Result<AlignedBuf> {
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            bail!("out of memory for an I/O buffer");
        }
        Ok(AlignedBuf { ptr, layout })
    }

    #[allow(clippy::mut_from_ref)] // one user at a time, inside this module
    fn slice(&self, len: usize) -> &mut [u8] {
        assert!(len <= self.layout.size());
        // SAFETY: ptr is a live allocation of layout.size() >= len bytes,
        // and the caller uses one slice at a time.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in new() with this layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

/// Writes a progress line to stderr (benchmarks keep stdout for JSON).
pub fn note(msg: &str) {
    let _ = writeln!(std::io::stderr(), "{msg}");
}
