//! Which of our mappings were used: `/proc/self/clear_refs` clears the
//! accessed bits of every anonymous page of the process, and
//! `/proc/self/smaps` then says, per mapping (VMA), how much of it was
//! touched since (`Referenced:`), reads included. No privilege is needed.
//!
//! A region is one VMA to the kernel unless something splits it. The
//! pager splits its regions into chunks ([`split_chunks`]) by giving every
//! other chunk `MADV_RANDOM`: adjacent mappings whose flags differ are
//! never merged. The advice only tells the kernel's own swap readahead and
//! reclaim that the chunk has no locality (they do not act on registered
//! memory that the pager holds resident), and shows as `rr` among a
//! mapping's `VmFlags` in smaps.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};

use super::mem::madvise;
use super::PAGE_SIZE;

/// One mapping of the smaps report: `[lo, hi)`, what of it is resident
/// and what of that was touched since the last clear, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Used {
    pub lo: usize,
    pub hi: usize,
    pub rss: usize,
    pub referenced: usize,
}

/// The two files of the access signal, at guarded numbers
/// (`uzswap_os::fdguard`), and the buffer the report is read into.
pub struct AccessScan {
    /// The files' numbers, guarded (before them, so that they are unmarked
    /// first).
    _marks: [uzswap_os::fdguard::Mark; 2],
    smaps: File,
    clear_refs: File,
    buf: Vec<u8>,
}

impl AccessScan {
    /// Opens the calling process's files. Fails where `/proc` is not
    /// mounted or the files cannot be opened (a clear_refs write needs the
    /// process's own credentials, which a thread of it has).
    pub fn new() -> io::Result<AccessScan> {
        let (m1, smaps) = uzswap_os::fdguard::guard(File::open("/proc/self/smaps")?);
        let (m2, clear_refs) = uzswap_os::fdguard::guard(
            std::fs::OpenOptions::new()
                .write(true)
                .open("/proc/self/clear_refs")?,
        );
        Ok(AccessScan {
            _marks: [m1, m2],
            smaps,
            clear_refs,
            buf: Vec::new(),
        })
    }

    /// Opens the calling process's own files in place of those opened
    /// before a fork (they name the parent whichever process reads them).
    pub fn renew(&mut self) -> io::Result<()> {
        let fresh = AccessScan::new()?;
        let buf = std::mem::take(&mut self.buf);
        // The old numbers' marks go first, then their files.
        *self = AccessScan { buf, ..fresh };
        Ok(())
    }

    /// Clears the accessed bits of every anonymous page of the process
    /// (`clear_refs` 2). The kernel flushes the TLB after: a page touched
    /// from here on is seen.
    pub fn clear(&mut self) -> io::Result<()> {
        self.clear_refs.write_all(b"2")
    }

    /// Reads the report and calls `each` for every mapping that lies in
    /// `[lo, hi)` at least in part, in address order. Returns the report's
    /// size in bytes.
    pub fn read(&mut self, lo: usize, hi: usize, mut each: impl FnMut(Used)) -> io::Result<usize> {
        self.smaps.seek(SeekFrom::Start(0))?;
        self.buf.clear();
        self.smaps.read_to_end(&mut self.buf)?;
        parse(&self.buf, lo, hi, &mut each);
        Ok(self.buf.len())
    }
}

/// Parses a smaps report (see [`AccessScan::read`]). A mapping's header is
/// the line that starts with its range in hex (`lo-hi perms ...`); its
/// `Rss:` and `Referenced:` lines follow, in kB.
fn parse(text: &[u8], lo: usize, hi: usize, each: &mut impl FnMut(Used)) {
    let mut cur: Option<Used> = None;
    for line in text.split(|&b| b == b'\n') {
        if let Some((a, b)) = header(line) {
            if let Some(u) = cur.take() {
                each(u);
            }
            if a < hi && b > lo {
                cur = Some(Used {
                    lo: a,
                    hi: b,
                    rss: 0,
                    referenced: 0,
                });
            }
            continue;
        }
        let Some(u) = cur.as_mut() else {
            continue;
        };
        if let Some(kb) = field(line, b"Rss:") {
            u.rss = kb << 10;
        } else if let Some(kb) = field(line, b"Referenced:") {
            u.referenced = kb << 10;
        }
    }
    if let Some(u) = cur {
        each(u);
    }
}

/// `(lo, hi)` of a header line (`7f12a0000000-7f12a0080000 rw-p ...`).
fn header(line: &[u8]) -> Option<(usize, usize)> {
    let dash = line.iter().position(|&b| b == b'-')?;
    let end = line.iter().position(|&b| b == b' ')?;
    if dash == 0 || end <= dash + 1 {
        return None;
    }
    let a = hex(&line[..dash])?;
    let b = hex(&line[dash + 1..end])?;
    (a < b).then_some((a, b))
}

fn hex(s: &[u8]) -> Option<usize> {
    if s.is_empty() || s.len() > 16 {
        return None;
    }
    let mut v = 0usize;
    for &c in s {
        v = v << 4 | (c as char).to_digit(16)? as usize;
    }
    Some(v)
}

/// The kB of a `Name:   123 kB` line.
fn field(line: &[u8], name: &[u8]) -> Option<usize> {
    let rest = line.strip_prefix(name)?;
    let digits: Vec<u8> = rest
        .iter()
        .copied()
        .skip_while(|b| *b == b' ')
        .take_while(u8::is_ascii_digit)
        .collect();
    std::str::from_utf8(&digits).ok()?.parse().ok()
}

/// Gives every other `chunk`-byte chunk of `[addr, addr + len)` (counted
/// from address 0, so that neighbouring regions agree) `MADV_RANDOM`, so
/// that the kernel keeps the chunks as separate mappings. `chunk` is a
/// multiple of the page size.
pub fn split_chunks(addr: usize, len: usize, chunk: usize) -> io::Result<()> {
    debug_assert!(chunk >= PAGE_SIZE && chunk.is_multiple_of(PAGE_SIZE));
    let end = addr + len;
    let mut at = addr - addr % chunk;
    while at < end {
        let next = at + chunk;
        if (at / chunk) % 2 == 1 {
            let (a, b) = (at.max(addr), next.min(end));
            // SAFETY: the advice changes no contents; the range is ours.
            unsafe { madvise(a, b - a, libc::MADV_RANDOM) }?;
        }
        at = next;
    }
    Ok(())
}

/// The mappings the process has now (lines of `/proc/self/maps`), and the
/// most it may have (`vm.max_map_count`).
pub fn map_count() -> io::Result<(usize, usize)> {
    let (_m, mut f) = uzswap_os::fdguard::guard(File::open("/proc/self/maps")?);
    let mut s = Vec::new();
    f.read_to_end(&mut s)?;
    let have = s.iter().filter(|&&b| b == b'\n').count();
    let max = std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(65530);
    Ok((have, max))
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPORT: &str = "\
00400000-00452000 r-xp 00000000 08:02 173521      /usr/bin/dbus-daemon
Size:                328 kB
Rss:                 100 kB
Referenced:           40 kB
7f0000000000-7f0000080000 rw-p 00000000 00:00 0
Size:                512 kB
Rss:                 256 kB
Pss:                 256 kB
Referenced:           12 kB
Anonymous:           256 kB
VmFlags: rd wr mr mw me ac um
7f0000080000-7f0000100000 rw-p 00000000 00:00 0
Size:                512 kB
Rss:                   0 kB
Referenced:            0 kB
VmFlags: rd wr mr mw me ac rr um
";

    #[test]
    fn a_report_gives_the_mappings_in_range_with_their_counts() {
        let mut got = Vec::new();
        parse(
            REPORT.as_bytes(),
            0x7f00_0000_0000,
            0x7f00_0010_0000,
            &mut |u| got.push(u),
        );
        assert_eq!(
            got,
            vec![
                Used {
                    lo: 0x7f00_0000_0000,
                    hi: 0x7f00_0008_0000,
                    rss: 256 << 10,
                    referenced: 12 << 10
                },
                Used {
                    lo: 0x7f00_0008_0000,
                    hi: 0x7f00_0010_0000,
                    rss: 0,
                    referenced: 0
                },
            ]
        );
    }

    #[test]
    fn lines_that_are_not_headers_are_not_taken_for_ones() {
        // "VmFlags: rd-wr" has a dash but no hex range before it.
        assert_eq!(header(b"VmFlags: rd wr"), None);
        assert_eq!(header(b"Size:   4 kB"), None);
        assert_eq!(header(b"ab-cd rw-p"), Some((0xab, 0xcd)));
        assert_eq!(field(b"Referenced:   12 kB", b"Referenced:"), Some(12));
    }
}
