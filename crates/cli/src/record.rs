//! `uzswap run --record FILE`: the run as a time series, and reading it
//! back for `uzswap plot`.
//!
//! # The file (JSON Lines, format [`FORMAT`])
//!
//! The first line is a [`Header`] (what ran, the budget, when, how often it
//! was sampled); every further line is a [`Sample`]. Each line is written
//! and flushed as it is taken, so a run killed midway leaves a file that
//! reads up to its last whole line (a cut last line is ignored).
//!
//! Byte figures are bytes. Faults and evictions are cumulative counters,
//! as the processes report them; [`rates`] derives the per-second rates
//! from two samples in a row (what `uzswap plot` draws).
//!
//! # Who writes
//!
//! The arbiter thread (`arbiter.rs`) builds a sample every recording interval
//! and hands it over a bounded queue to a thread of its own, which writes
//! it: a slow or stalled disk never delays the sharing of the budget, and
//! nothing is written under a lock. If the queue is full (the disk is that
//! far behind) the sample is dropped, which shows as a longer step in `t`.
//! A write error is said once on stderr, with the remedy, and recording
//! stops; the program keeps running.

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::Path;
use std::sync::mpsc;

/// The format this build writes, and the newest it reads.
pub const FORMAT: u32 = 1;
/// [`Header::kind`] of every recording.
pub const KIND: &str = "uzswap-recording";
/// Samples the writer may be behind before new ones are dropped (about
/// 100 s at the default interval).
const QUEUE: usize = 1024;

/// The first line of a recording.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Header {
    /// Always [`KIND`]: what tells a recording from other JSON Lines.
    pub kind: String,
    /// The format version ([`FORMAT`] when written by this build).
    pub format: u32,
    /// The `uzswap` that wrote it.
    pub uzswap_version: String,
    /// The program and its arguments.
    pub command: Vec<String>,
    /// `--memory-max`: the budget of the whole tree.
    pub budget_bytes: u64,
    /// When the program started, milliseconds since the Unix epoch.
    pub started_unix_ms: u64,
    /// How often a sample is taken.
    pub interval_ms: u64,
}

/// The tree at one instant.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Seconds since the program started.
    pub t: f64,
    /// The budget in force (constant so far; kept per sample so that a
    /// budget changed during the run would read right).
    pub budget_bytes: u64,
    /// The tree's memory as the kernel counts it: `Pss_Anon` of every
    /// process of the program and of `uzswap run` itself, what the budget
    /// is checked against.
    pub measured_bytes: u64,
    /// The processes' reports added up: the byte figures over the live
    /// processes; faults and evictions over every process seen so far
    /// (an ended one's last report stays in), so that they only grow.
    pub total: Usage,
    /// Every live process, by its last report.
    pub processes: Vec<ProcessSample>,
}

/// What a process reported (or the processes together).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    /// Its resident managed and anonymous memory.
    pub resident_bytes: u64,
    /// Its compressed pool.
    pub pool_bytes: u64,
    /// uzswap's own bookkeeping in it (the runtime).
    pub runtime_bytes: u64,
    /// Written back to its backing file: on disk, not memory.
    pub backing_bytes: u64,
    /// What the arbiter allots it.
    pub allot_bytes: u64,
    /// Faults resolved so far (cumulative).
    pub faults: u64,
    /// Pages evicted so far (cumulative).
    pub evictions: u64,
}

impl Usage {
    /// What counts against the budget by its own reports.
    pub fn charged(&self) -> u64 {
        self.resident_bytes + self.pool_bytes + self.runtime_bytes
    }
}

/// One process in a sample.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcessSample {
    pub pid: u32,
    /// Its command name.
    pub comm: String,
    #[serde(flatten)]
    pub usage: Usage,
}

// ---- writing ----------------------------------------------------------------

/// Checks where `--record` will write, before the program starts: an
/// existing directory, and a file that can be created there.
pub fn check_path(path: &Path) -> Result<()> {
    if path.is_dir() {
        bail!(
            "--record {}: is a directory: name a file in it, e.g. {}",
            path.display(),
            path.join("run.jsonl").display()
        );
    }
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !dir.is_dir() {
        bail!(
            "--record {}: directory {} does not exist: make it first or name another path",
            path.display(),
            dir.display()
        );
    }
    Ok(())
}

/// The writer thread and the queue to it.
pub struct Recorder {
    queue: Option<mpsc::SyncSender<Sample>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Recorder {
    /// Creates (or truncates) `path` and starts the writer, which writes
    /// `header` first.
    pub fn create(path: &Path, header: Header) -> Result<Recorder> {
        let file = std::fs::File::create(path).with_context(|| {
            format!(
                "cannot create --record {}: check the path and its permissions",
                path.display()
            )
        })?;
        let (tx, rx) = mpsc::sync_channel(QUEUE);
        let path = path.to_owned();
        let thread = std::thread::Builder::new()
            .name("uzswap-record".into())
            .spawn(move || write_all(file, &path, &header, &rx))
            .context("cannot start the recording thread")?;
        Ok(Recorder {
            queue: Some(tx),
            thread: Some(thread),
        })
    }

    /// Hands `sample` to the writer; never blocks. After a write error
    /// (said by the writer) samples are no longer taken.
    pub fn record(&mut self, sample: Sample) {
        if let Some(q) = &self.queue {
            match q.try_send(sample) {
                Ok(()) | Err(mpsc::TrySendError::Full(_)) => {}
                Err(mpsc::TrySendError::Disconnected(_)) => self.queue = None,
            }
        }
    }

    /// Whether samples are still wanted.
    pub fn active(&self) -> bool {
        self.queue.is_some()
    }

    /// Waits until everything handed over is written.
    pub fn finish(mut self) {
        self.queue = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The writer thread: the header, then every sample as it comes, each
/// flushed; on the first error, says so and returns (which disconnects the
/// queue).
fn write_all(file: std::fs::File, path: &Path, header: &Header, rx: &mpsc::Receiver<Sample>) {
    let mut out = std::io::BufWriter::new(file);
    let mut result = write_line(&mut out, header);
    while result.is_ok() {
        let Ok(s) = rx.recv() else { break };
        result = write_line(&mut out, &s);
    }
    if let Err(e) = result {
        crate::note(&format!(
            "uzswap: error: cannot write the recording {}: {e}; recording stopped (the program \
             keeps running; what was written so far is usable): free space there, or record \
             to another disk next time",
            path.display()
        ));
    }
}

/// Writes `v` as one JSON line and flushes it.
fn write_line<T: Serialize>(
    out: &mut std::io::BufWriter<std::fs::File>,
    v: &T,
) -> std::io::Result<()> {
    serde_json::to_writer(&mut *out, v)?;
    out.write_all(b"\n")?;
    out.flush()
}

// ---- reading ----------------------------------------------------------------

/// A recording read back.
#[derive(Debug)]
pub struct Recording {
    pub header: Header,
    pub samples: Vec<Sample>,
}

/// Reads the recording at `path`, with a message that says what is wrong
/// and what to do when it cannot.
pub fn read(path: &Path) -> Result<Recording> {
    let body = std::fs::read(path).map_err(|e| {
        anyhow::anyhow!(
            "cannot read the recording {}: {e}: give the FILE that `uzswap run --record FILE` \
             wrote",
            path.display()
        )
    })?;
    let body = String::from_utf8_lossy(&body);
    parse(&body).with_context(|| format!("{}", path.display()))
}

/// Parses a recording's text.
pub fn parse(body: &str) -> Result<Recording> {
    let not_one = "write one with `uzswap run --record FILE -- PROG`";
    if body.trim().is_empty() {
        bail!(
            "the file is empty, not a recording (a run that could not start writes nothing): \
             {not_one}"
        );
    }
    // A run killed while writing leaves its last line cut: what precedes
    // it is whole, and the cut line is dropped.
    let complete = body.ends_with('\n');
    let lines: Vec<&str> = body.lines().collect();
    let last = lines.len() - 1;
    let mut it = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    let (_, first) = it.next().expect("not blank");
    let header = header_of(first)
        .map_err(|e| anyhow::anyhow!("not a uzswap recording ({e:#}): {not_one}"))?;
    if header.format > FORMAT {
        bail!(
            "a recording of format {}, newer than this uzswap reads ({FORMAT}): plot it with \
             the uzswap that recorded it (version {}) or a newer one",
            header.format,
            header.uzswap_version
        );
    }
    let mut samples = Vec::new();
    for (i, l) in it {
        match serde_json::from_str::<Sample>(l) {
            Ok(s) => samples.push(s),
            Err(_) if i == last && !complete => break,
            Err(e) => bail!(
                "line {}: not a sample of this format ({e}): the file was changed or is \
                 damaged; record the run again",
                i + 1
            ),
        }
    }
    if samples.is_empty() {
        bail!(
            "the recording has no samples: the program ended (or the run was stopped) before \
             the first, {} ms in; record a longer run",
            header.interval_ms
        );
    }
    Ok(Recording { header, samples })
}

/// The header on the first line, refusing JSON of another kind.
fn header_of(line: &str) -> Result<Header> {
    let v: serde_json::Value = serde_json::from_str(line).context("its first line is not JSON")?;
    if v.get("kind").and_then(|k| k.as_str()) != Some(KIND) {
        bail!("its first line is not a recording's header, which has \"kind\": \"{KIND}\"");
    }
    // A newer format may have changed the header too: its version is
    // read on its own, so that the error names it.
    let format = v.get("format").and_then(|f| f.as_u64()).unwrap_or(0);
    if format > u64::from(FORMAT) {
        return Ok(Header {
            kind: KIND.into(),
            format: u32::try_from(format).unwrap_or(u32::MAX),
            uzswap_version: v
                .get("uzswap_version")
                .and_then(|s| s.as_str())
                .unwrap_or("unknown")
                .into(),
            command: Vec::new(),
            budget_bytes: 0,
            started_unix_ms: 0,
            interval_ms: 0,
        });
    }
    serde_json::from_value(v).context("its header is damaged")
}

/// Faults and evictions per second of the whole tree at each sample but
/// the first: the growth of the cumulative counters since the sample
/// before, over the time between. A counter that went down (a pid reused
/// by a new process) counts as no growth.
pub fn rates(samples: &[Sample]) -> Vec<Rate> {
    samples
        .windows(2)
        .filter(|w| w[1].t > w[0].t)
        .map(|w| {
            let (a, b) = (&w[0], &w[1]);
            let dt = b.t - a.t;
            Rate {
                t: b.t,
                faults: b.total.faults.saturating_sub(a.total.faults) as f64 / dt,
                evictions: b.total.evictions.saturating_sub(a.total.evictions) as f64 / dt,
            }
        })
        .collect()
}

/// Per-second rates at one instant.
#[derive(Clone, Debug, PartialEq)]
pub struct Rate {
    pub t: f64,
    pub faults: f64,
    pub evictions: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Header {
        Header {
            kind: KIND.into(),
            format: FORMAT,
            uzswap_version: "0.1.0".into(),
            command: vec!["prog".into(), "arg".into()],
            budget_bytes: 32 << 20,
            started_unix_ms: 1,
            interval_ms: 100,
        }
    }

    fn sample(t: f64, faults: u64, evictions: u64) -> Sample {
        Sample {
            t,
            budget_bytes: 32 << 20,
            measured_bytes: 20 << 20,
            total: Usage {
                faults,
                evictions,
                ..Usage::default()
            },
            processes: vec![ProcessSample {
                pid: 7,
                comm: "prog".into(),
                usage: Usage {
                    pool_bytes: 4096,
                    faults,
                    evictions,
                    ..Usage::default()
                },
            }],
        }
    }

    fn text(lines: &[String]) -> String {
        lines.iter().map(|l| format!("{l}\n")).collect()
    }

    fn json<T: Serialize>(v: &T) -> String {
        serde_json::to_string(v).unwrap()
    }

    #[test]
    fn rates_are_growth_over_time_and_never_negative() {
        let s = [
            sample(0.1, 0, 0),
            sample(0.2, 50, 10),
            sample(0.4, 250, 10),
            sample(0.4, 300, 10), // same instant: no rate
            sample(0.5, 100, 20), // a counter went down
        ];
        let r = rates(&s);
        assert_eq!(r.len(), 3);
        assert_eq!(r[0].t, 0.2);
        assert!((r[0].faults - 500.0).abs() < 1e-6, "{r:?}");
        assert!((r[0].evictions - 100.0).abs() < 1e-6, "{r:?}");
        assert!((r[1].faults - 1000.0).abs() < 1e-6, "{r:?}");
        assert_eq!(r[1].evictions, 0.0);
        assert_eq!(r[2].faults, 0.0, "{r:?}");
        assert!((r[2].evictions - 100.0).abs() < 1e-6, "{r:?}");
        assert!(rates(&s[..1]).is_empty());
    }

    #[test]
    fn a_recording_reads_back_as_written() {
        let s = [sample(0.1, 1, 2), sample(0.2, 3, 4)];
        let body = text(&[json(&header()), json(&s[0]), json(&s[1])]);
        let r = parse(&body).unwrap();
        assert_eq!(r.header, header());
        assert_eq!(r.samples, s);
        // The flattened usage of a process is at its top level.
        assert!(json(&s[0]).contains(r#""pid":7,"comm":"prog","resident_bytes":0"#));
    }

    #[test]
    fn a_cut_last_line_is_dropped_and_a_damaged_one_refused() {
        let s = json(&sample(0.1, 1, 2));
        let cut = text(&[json(&header()), s.clone()]) + &s[..s.len() / 2];
        assert_eq!(parse(&cut).unwrap().samples.len(), 1);
        let damaged = text(&[json(&header()), s[..s.len() / 2].into(), s.clone()]);
        let e = format!("{:#}", parse(&damaged).unwrap_err());
        assert!(e.contains("line 2: not a sample"), "{e}");
    }

    #[test]
    fn what_is_not_a_recording_is_refused_with_the_reason() {
        let e = |body: &str| format!("{:#}", parse(body).unwrap_err());
        assert!(e("").contains("the file is empty"));
        assert!(e("\n \n").contains("the file is empty"));
        assert!(e("hello\n").contains("not a uzswap recording"));
        assert!(e("hello\n").contains("not JSON"));
        assert!(e("{\"a\":1}\n").contains("not a recording's header"));
        let only = text(&[json(&header())]);
        assert!(e(&only).contains("has no samples"), "{}", e(&only));
        let mut newer = serde_json::to_value(header()).unwrap();
        newer["format"] = (FORMAT + 1).into();
        newer["budget_bytes"] = "changed".into();
        let m = e(&text(&[newer.to_string(), "{}".into()]));
        assert!(m.contains(&format!("of format {}", FORMAT + 1)), "{m}");
        assert!(m.contains("version 0.1.0"), "{m}");
    }
}
