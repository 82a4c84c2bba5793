//! Side-by-side references from the running kernel. Everything changed on
//! the machine is put back by a guard's `Drop`, so it is restored on every
//! exit path, errors and panics included.

use crate::note;
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
        // Reset and removal fail with EBUSY while something still has the
        // device open (udev probes a device it has just seen change): try
        // again for up to a second rather than leave the device behind.
        for attempt in 0..50 {
            if attempt > 0 {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            let reset = std::fs::write(self.sys("reset"), "1");
            if reset
                .as_ref()
                .is_err_and(|e| e.raw_os_error() == Some(libc::EBUSY))
            {
                continue;
            }
            match std::fs::write("/sys/class/zram-control/hot_remove", self.id.to_string()) {
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => continue,
                Err(e) => note(&format!("could not remove /dev/zram{}: {e}", self.id)),
                Ok(()) => {}
            }
            return;
        }
        note(&format!(
            "/dev/zram{id} is still busy and stays: remove it with `echo {id} > /sys/class/zram-control/hot_remove`",
            id = self.id
        ));
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

/// A swap file, zswap settings and memory cgroups set up for one
/// measurement. `Drop` undoes everything in reverse order: cgroups removed,
/// swap turned off and deleted, every zswap parameter written back.
pub struct KernelSwap {
    swapfile: std::path::PathBuf,
    swapped_on: bool,
    /// (parameter file, value before we touched it).
    saved: Vec<(String, String)>,
    cgroups: Vec<std::path::PathBuf>,
    /// The compressor zswap really uses (None: zswap off).
    pub compressor: Option<String>,
    /// Hold the CPU latency request (0 µs, `uzswap_os::latency`) through
    /// each kernel run, as uzswap's pager holds it while faults arrive:
    /// both sides then run with the same idle states.
    pub latency_hold: bool,
}

const ZSWAP_PARAMS: &str = "/sys/module/zswap/parameters";

/// Kernel zswap figures from /proc/meminfo and /proc/vmstat (bytes/pages).
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct ZswapSample {
    /// Compressed pool size ("Zswap:").
    pub pool_bytes: u64,
    /// Original size of the pages stored ("Zswapped:").
    pub stored_bytes: u64,
    pub zswpout: u64,
    /// Pages loaded back from the zswap pool.
    pub zswpin: u64,
    pub zswpwb: u64,
    pub pswpout: u64,
    /// Pages read back from swap.
    pub pswpin: u64,
    /// Zero-filled pages swapped out and in (from Linux 6.12 on these go
    /// to neither zswap nor the disk: the swap map notes them, and their
    /// pages count in neither `zswpout` nor `pswpout`).
    pub swpout_zero: u64,
    pub swpin_zero: u64,
}

impl ZswapSample {
    pub fn read() -> Result<ZswapSample> {
        let mut s = ZswapSample::default();
        for line in std::fs::read_to_string("/proc/meminfo")?.lines() {
            let kb = |l: &str| -> u64 {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0)
                    * 1024
            };
            if line.starts_with("Zswap:") {
                s.pool_bytes = kb(line);
            } else if line.starts_with("Zswapped:") {
                s.stored_bytes = kb(line);
            }
        }
        for line in std::fs::read_to_string("/proc/vmstat")?.lines() {
            let mut it = line.split_whitespace();
            let (Some(k), Some(v)) = (it.next(), it.next()) else {
                continue;
            };
            let v: u64 = v.parse().unwrap_or(0);
            match k {
                "zswpout" => s.zswpout = v,
                "zswpin" => s.zswpin = v,
                "zswpwb" => s.zswpwb = v,
                "pswpout" => s.pswpout = v,
                "pswpin" => s.pswpin = v,
                "swpout_zero" => s.swpout_zero = v,
                "swpin_zero" => s.swpin_zero = v,
                _ => {}
            }
        }
        Ok(s)
    }
}

impl KernelSwap {
    /// Adds a swap file of `swap_bytes` and sets zswap on with `compressor`
    /// (or off with `None`).
    pub fn setup(swap_bytes: u64, compressor: Option<&str>) -> Result<KernelSwap> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            bail!("the kernel reference needs root (swapon, zswap parameters, memory cgroups): run as root or drop --vs-kernel");
        }
        let mut ks = KernelSwap {
            swapfile: std::path::PathBuf::from(format!(
                "/var/tmp/uzswap-bench-{}.swap",
                std::process::id()
            )),
            swapped_on: false,
            saved: Vec::new(),
            cgroups: Vec::new(),
            compressor: None,
            latency_hold: false,
        };
        for p in [
            "enabled",
            "compressor",
            "max_pool_percent",
            "accept_threshold_percent",
        ] {
            let path = format!("{ZSWAP_PARAMS}/{p}");
            let v = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {path}: is zswap built into this kernel?"))?;
            ks.saved.push((path, v.trim().to_string()));
        }
        ks.write_swapfile(swap_bytes)?;
        let st = std::process::Command::new("mkswap")
            .arg(&ks.swapfile)
            .stdout(std::process::Stdio::null())
            .status()
            .context("running mkswap (util-linux)")?;
        anyhow::ensure!(st.success(), "mkswap failed on {}", ks.swapfile.display());
        let st = std::process::Command::new("swapon")
            .arg(&ks.swapfile)
            .status()
            .context("running swapon")?;
        anyhow::ensure!(st.success(), "swapon failed on {}", ks.swapfile.display());
        ks.swapped_on = true;
        match compressor {
            Some(c) => {
                let param = format!("{ZSWAP_PARAMS}/compressor");
                if std::fs::write(&param, c).is_err() {
                    // The same compressor as uzswap's where the kernel
                    // has it, else its default, lzo.
                    note(&format!(
                        "the kernel has no {c} compressor for zswap: using lzo"
                    ));
                    std::fs::write(&param, "lzo")
                        .context("the kernel's zswap has neither the asked compressor nor lzo")?;
                    ks.compressor = Some("lzo".into());
                } else {
                    ks.compressor = Some(c.into());
                }
                std::fs::write(format!("{ZSWAP_PARAMS}/enabled"), "Y")?;
                // What the kernel really uses, as it reports it.
                if let Ok(v) = std::fs::read_to_string(&param) {
                    ks.compressor = Some(v.trim().to_string());
                }
            }
            None => std::fs::write(format!("{ZSWAP_PARAMS}/enabled"), "N")?,
        }
        Ok(ks)
    }

    fn write_swapfile(&self, bytes: u64) -> Result<()> {
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&self.swapfile)
            .with_context(|| format!("creating {}", self.swapfile.display()))?;
        // Written, not sparse: swapon refuses files with holes.
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..bytes.div_ceil(1 << 20) {
            f.write_all(&zeros).with_context(|| {
                format!("writing {}: is the disk full?", self.swapfile.display())
            })?;
        }
        f.sync_all()?;
        Ok(())
    }

    /// Writes `value` to the machine setting `path` (a zswap parameter,
    /// `/proc/sys/vm/page-cluster`, ...), saving the value it had the first
    /// time, so that drop puts it back.
    pub fn set(&mut self, path: &str, value: &str) -> Result<()> {
        if !self.saved.iter().any(|(p, _)| p == path) {
            let v = std::fs::read_to_string(path)
                .with_context(|| format!("reading {path}: this kernel does not have it"))?;
            self.saved.push((path.to_string(), v.trim().to_string()));
        }
        std::fs::write(path, value).with_context(|| format!("writing {value} to {path}"))
    }

    /// Makes a memory cgroup (v1) limited to `limit` bytes; removed on drop.
    pub fn cgroup(&mut self, limit: u64) -> Result<std::path::PathBuf> {
        let dir = std::path::PathBuf::from(format!(
            "/sys/fs/cgroup/memory/uzswap-bench-{}-{}",
            std::process::id(),
            self.cgroups.len()
        ));
        std::fs::create_dir(&dir).with_context(|| {
            format!(
                "creating {}: are memory cgroups (v1) mounted at /sys/fs/cgroup/memory?",
                dir.display()
            )
        })?;
        self.cgroups.push(dir.clone());
        std::fs::write(dir.join("memory.limit_in_bytes"), limit.to_string())?;
        let _ = std::fs::write(dir.join("memory.swappiness"), "100");
        Ok(dir)
    }
}

impl Drop for KernelSwap {
    fn drop(&mut self) {
        for cg in self.cgroups.drain(..).rev() {
            // Any task left (a child that outlived an error) is killed first.
            if let Ok(tasks) = std::fs::read_to_string(cg.join("tasks")) {
                for pid in tasks.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                    // SAFETY: kill has no memory preconditions.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
            for _ in 0..100 {
                if std::fs::remove_dir(&cg).is_ok() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
        if self.swapped_on {
            let _ = std::process::Command::new("swapoff")
                .arg(&self.swapfile)
                .status();
        }
        let _ = std::fs::remove_file(&self.swapfile);
        // Compressor before enabled, as they were set.
        for (path, v) in self.saved.iter().rev() {
            let _ = std::fs::write(path, v);
        }
    }
}

/// What the kernel side of a usemem run measured.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct KernelRun {
    pub report: uzswap_workload::usemem::Report,
    /// Peak of the kernel's zswap pool during the run (bytes).
    pub peak_zswap_pool_bytes: u64,
    /// Peak of cgroup usage + zswap pool at the same sample (bytes).
    pub peak_memory_bytes: u64,
    /// The cgroup's own peak usage (memory.max_usage_in_bytes).
    pub cgroup_max_usage_bytes: u64,
    /// zswap at the end of the run, before the child exits.
    pub end: ZswapSample,
    /// Counters over the run (end − start).
    pub zswpout: u64,
    pub zswpwb: u64,
    pub pswpout: u64,
}

/// Runs the usemem workload in a child process inside `cgroup` and samples
/// the kernel's figures while it runs.
pub fn usemem_in_cgroup(
    cgroup: &std::path::Path,
    data: uzswap_workload::corpus::DataKind,
    mib: usize,
    pattern: uzswap_workload::usemem::Pattern,
    passes: u32,
) -> Result<KernelRun> {
    // The child is this binary again (`uzswap-bench internal-usemem`).
    let exe = std::env::current_exe().context("locating the uzswap-bench binary")?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("internal-usemem")
        .arg("--cgroup")
        .arg(cgroup)
        .arg("--data")
        .arg(format!("{data:?}").to_lowercase())
        .arg("--mib")
        .arg(mib.to_string())
        .arg("--pattern")
        .arg(format!("{pattern:?}").to_lowercase())
        .arg("--passes")
        .arg(passes.to_string());
    measure_in_cgroup(cgroup, cmd)
}

/// Runs `cmd`, a workload that joins `cgroup` itself, prints its usemem
/// report as one JSON line and then holds its memory until stdin closes;
/// samples the cgroup's usage and the kernel's zswap pool meanwhile.
pub fn measure_in_cgroup(
    cgroup: &std::path::Path,
    mut cmd: std::process::Command,
) -> Result<KernelRun> {
    use std::io::BufRead;
    let start = ZswapSample::read()?;
    let mut child = cmd
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("starting the workload child")?;
    let stdout = child.stdout.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let usage_path = cgroup.join("memory.usage_in_bytes");
    let mut run = KernelRun::default();
    let line = loop {
        let s = ZswapSample::read()?;
        let usage: u64 = std::fs::read_to_string(&usage_path)
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        run.peak_zswap_pool_bytes = run.peak_zswap_pool_bytes.max(s.pool_bytes);
        run.peak_memory_bytes = run.peak_memory_bytes.max(usage + s.pool_bytes);
        match rx.recv_timeout(std::time::Duration::from_millis(20)) {
            Ok(line) => break line,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => continue,
            Err(_) => break String::new(),
        }
    };
    run.end = ZswapSample::read()?;
    run.cgroup_max_usage_bytes = std::fs::read_to_string(cgroup.join("memory.max_usage_in_bytes"))
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    drop(child.stdin.take()); // lets the child exit
    let status = child.wait()?;
    anyhow::ensure!(
        !line.is_empty(),
        "the workload child died ({status}) before reporting: was it killed by the cgroup's OOM killer? Give it more swap or memory"
    );
    run.report = serde_json::from_str(line.trim()).context("parsing the child's report")?;
    run.zswpout = run.end.zswpout - start.zswpout;
    run.zswpwb = run.end.zswpwb - start.zswpwb;
    run.pswpout = run.end.pswpout - start.pswpout;
    Ok(run)
}

/// The child side: joins `cgroup` after loading its pages (so the page
/// cache and the reference copy are charged outside the limit), runs the
/// workload on plain anonymous memory, prints its report, and holds its
/// memory until stdin closes.
pub fn usemem_child(
    cgroup: &std::path::Path,
    data: uzswap_workload::corpus::DataKind,
    mib: usize,
    pattern: uzswap_workload::usemem::Pattern,
    passes: u32,
) -> Result<()> {
    let pages = uzswap_workload::corpus::load_for_workload(data, mib)?;
    std::fs::write(cgroup.join("tasks"), std::process::id().to_string())
        .with_context(|| format!("joining {}", cgroup.display()))?;
    // Page-aligned, as a uzswap region is: the workload's pages are the
    // kernel's pages, so its first read of each is the one that faults.
    let len = mib << 20;
    let addr = uzswap_region::sys::map_anon(len)
        .with_context(|| format!("mapping {mib} MiB for the workload: ask for fewer MiB"))?;
    // SAFETY: the fresh mapping is `len` bytes of readable, writable memory
    // that only this slice refers to until the unmap below.
    let mem = unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len) };
    let report = uzswap_workload::usemem::run(mem, &pages, pattern, passes);
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", serde_json::to_string(&report)?)?;
    out.flush()?;
    drop(out);
    let mut sink = String::new();
    let _ = std::io::stdin().read_line(&mut sink);
    // SAFETY: `mem` is not used after this point.
    unsafe { uzswap_region::sys::unmap(addr, len) };
    Ok(())
}
