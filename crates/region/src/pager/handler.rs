//! The fault handler threads: the main handler (`uzswap-uffd`) and the
//! optional CPU handlers (`uzswap-uffd-cpu`), how they read the descriptor
//! and share messages in order (`Dispatch`), and when they wake faulting
//! threads (`Wakes`, in `types.rs`). What a fault or an event does is in
//! `fault.rs` and `events.rs`.

use super::types::{Fault, Load, Outcome, PageBuf, Wakes};
use super::PagerCore;
use crate::sys::{self, Msg, RawMsg};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A CPU handler that did not run for this long was preempted: a thread of
/// its CPU ran meanwhile, and may just have faulted.
pub(super) const CPU_GAP: Duration = Duration::from_micros(3);

/// How long after such a gap a CPU handler takes faults as its own CPU's.
pub(super) const CPU_FRESH: Duration = Duration::from_micros(10);

/// How long faults wait for the handler of the faulting thread's CPU
/// before any handler takes them (that CPU may be busy with other work).
pub(super) const HANDOFF_WAIT: Duration = Duration::from_micros(20);

/// How often the main handler looks at the descriptor while the CPU
/// handlers spin (a backstop for when none of them gets a CPU).
pub(super) const MAIN_BACKSTOP_MS: i32 = 1;

/// Messages between reading and handling, shared by the handlers.
///
/// Ordering rule: the descriptor is read only with this lock held and
/// `handoff` empty, and what was read is handled (or put in `handoff`)
/// before the lock is released; a batch in `handoff` is handled with the
/// lock held too. So batches are handled in the order they were read, one
/// at a time, as by a single thread: a fault read after a remove event is
/// never handled before it; within a batch the events go first (see
/// `PagerCore::handle_batch`).
#[derive(Default)]
pub(super) struct Dispatch {
    /// Faults read by a CPU handler that had been spinning on an idle CPU,
    /// so they came from another CPU: left for the handler of that CPU,
    /// which runs as soon as the faulting thread sleeps; after
    /// [`HANDOFF_WAIT`] any handler takes them.
    pub(super) handoff: Vec<RawMsg>,
    pub(super) handoff_at: Option<Instant>,
    /// Faults a CPU handler could not resolve yet (EAGAIN, budget full),
    /// for the main handler's retries.
    pub(super) deferred: Vec<Fault>,
}

/// What a CPU handler's step came to.
pub(super) enum Step {
    /// Nothing it could do.
    Idle,
    /// It handled messages; `woke_at`: just before it woke the faulting
    /// threads (which preempt it).
    Worked { woke_at: Instant },
}

impl PagerCore {
    pub(super) fn handler_loop(self: Arc<Self>) {
        self.serve(None);
    }

    /// The main handler's loop; with `until`, it returns once the flag is
    /// set (its deferred faults left for the next handler), so that a
    /// thread can serve faults while it waits for something (see
    /// `start_handler`).
    pub(super) fn serve(&self, until: Option<&AtomicBool>) {
        let mut msgs = vec![RawMsg::default(); 64];
        let mut batch: Vec<RawMsg> = Vec::with_capacity(64);
        let mut buf = PageBuf::new(self.cfg.readahead_max + 1);
        let mut deferred: Vec<Fault> = Vec::new();
        let mut loads: Vec<Load> = Vec::new();
        let mut w = Wakes::now();
        let mut last = Instant::now();
        let mut spins = 0u32;
        let mut spin = AdaptiveSpin::new(self.cfg.spin);
        // When the handler last blocked in poll on the descriptor.
        let mut polled_at: Option<Instant> = None;
        // When the handler last read a message, while it holds the CPU
        // latency request (`PagerConfig::latency_hold`).
        let mut holding: Option<Instant> = None;
        while !self.shutdown.load(Ordering::Relaxed)
            && !until.is_some_and(|f| f.load(Ordering::Acquire))
        {
            let n = {
                let mut d = self.dispatch.lock();
                deferred.append(&mut d.deferred);
                batch.clear();
                if !d.handoff.is_empty() {
                    // Nobody else took them: the faulting CPUs are busy.
                    if d.handoff_at.is_none_or(|t| t.elapsed() >= HANDOFF_WAIT) {
                        batch.append(&mut d.handoff);
                    }
                } else {
                    let n = match self.uffd.read_msgs(&mut msgs) {
                        Ok(n) => n,
                        Err(e) => panic!("reading userfaultfd failed: {e}"),
                    };
                    if n > 0 {
                        self.note_read();
                        if self.cfg.latency_hold {
                            uzswap_os::latency::read(n);
                            holding = Some(Instant::now());
                        }
                        match polled_at.take() {
                            Some(t) => spin.woke_after(t.elapsed()),
                            None if spins > 0 => spin.caught(),
                            None => {}
                        }
                    }
                    batch.extend_from_slice(&msgs[..n]);
                }
                let t0 = Instant::now();
                self.handle_batch(&batch, t0, &mut buf, &mut w, &mut deferred, &mut loads);
                batch.len()
            };
            // Loads started in the batch finish with the dispatch lock
            // released: meanwhile other handlers read and handle messages.
            self.finish_loads(&mut loads, &mut buf, &mut w, &mut deferred);
            if n == 0 {
                if !deferred.is_empty() {
                    self.retry(&mut deferred, &mut buf, &mut w);
                    if !deferred.is_empty() {
                        // What a deferred fault waits for (the evictor to
                        // free room, or a thread in madvise to finish after
                        // its remove event was read) needs a CPU: on a
                        // small machine spinning here would take it.
                        std::thread::yield_now();
                    }
                }
                if self.cpu_handlers_spinning() {
                    // They read the descriptor and send what they cannot
                    // resolve here through `wake`. Polling the
                    // descriptor too would have every fault wake this
                    // thread, on another CPU; the timeout covers the case
                    // where no CPU handler gets a CPU, and paces the
                    // retries of deferred faults.
                    sys::poll2(-1, self.wake.raw_fd(), MAIN_BACKSTOP_MS);
                    self.wake.drain();
                    last = Instant::now();
                    continue;
                }
                spins += 1;
                // Each spin is a read system call: the clock is cheap
                // beside it.
                if spin.limit() > Duration::ZERO && last.elapsed() < spin.limit() {
                    std::hint::spin_loop();
                    continue;
                }
                if polled_at.is_none() && spin.limit() > Duration::ZERO {
                    spin.missed();
                }
                // With `until`, the flag is read again every millisecond;
                // faults handed off to a CPU handler are taken after
                // HANDOFF_WAIT (their messages are read already: the
                // descriptor will not wake anyone for them).
                let mut timeout =
                    if deferred.is_empty() && until.is_none() && !self.handoff_pending() {
                        -1
                    } else {
                        1
                    };
                // The request goes once no message came for RELEASE_AFTER;
                // until then the poll wakes in time to let it go.
                if let Some(t) = holding {
                    let left = uzswap_os::latency::RELEASE_AFTER.saturating_sub(t.elapsed());
                    if left.is_zero() {
                        uzswap_os::latency::release();
                        holding = None;
                    } else {
                        let ms = left.as_millis().max(1) as i32;
                        timeout = if timeout < 0 { ms } else { timeout.min(ms) };
                    }
                }
                polled_at.get_or_insert_with(Instant::now);
                sys::poll2(self.uffd.raw_fd(), self.wake.raw_fd(), timeout);
                self.wake.drain();
                last = Instant::now();
                continue;
            }
            if !deferred.is_empty() {
                self.retry(&mut deferred, &mut buf, &mut w);
            }
            last = Instant::now();
            spins = 0;
        }
        if !deferred.is_empty() {
            self.dispatch.lock().deferred.append(&mut deferred);
        }
        if holding.is_some() {
            uzswap_os::latency::release();
        }
    }

    /// Handles a batch of messages read at once, with the dispatch lock
    /// held since the read: its events first, then its faults, whatever
    /// their order in the batch. Once a remove or unmap event is read, the
    /// thread that raised it goes on and zaps the range at any moment; a
    /// page a fault maps there before the event is applied could be mapped
    /// after the zap, and the event would then mark it `Absent` while it is
    /// present: the program's writes to it would go to no fault, and the
    /// next discard span of the evictor with it in a gap would drop them.
    /// Applied first, the event leaves the page `Absent`, and the fault's
    /// mapping makes it `Dirty`: should the zap come after, the page is
    /// `Dirty` and missing, which the next fault on it resolves as zeros
    /// (`faults_rezeroed`), what a discarded page reads. A fault in the
    /// batch raced the event that follows it, so either order is one the
    /// program may see. (Every other mapping is made under the dispatch
    /// lock too: no event is read and not yet applied meanwhile.)
    pub(super) fn handle_batch(
        &self,
        batch: &[RawMsg],
        t0: Instant,
        buf: &mut PageBuf,
        w: &mut Wakes,
        deferred: &mut Vec<Fault>,
        loads: &mut Vec<Load>,
    ) {
        let is_fault = |m: &&RawMsg| matches!(m.decode(), Msg::Fault { .. });
        for m in batch.iter().filter(|m| !is_fault(m)) {
            self.handle_msg(m, t0, buf, w, deferred, loads);
        }
        for m in batch.iter().filter(is_fault) {
            self.handle_msg(m, t0, buf, w, deferred, loads);
        }
    }

    /// Handles one message on the main handler (events) or any handler
    /// (faults); a fault that must wait goes to `deferred`, a load it
    /// started to `loads` (to finish once the dispatch lock is released).
    fn handle_msg(
        &self,
        m: &RawMsg,
        t0: Instant,
        buf: &mut PageBuf,
        w: &mut Wakes,
        deferred: &mut Vec<Fault>,
        loads: &mut Vec<Load>,
    ) {
        match m.decode() {
            Msg::Fault { addr, write, wp } => {
                let f = Fault {
                    addr,
                    write,
                    wp,
                    t0,
                    retried: false,
                };
                self.file(self.fault(f, buf, w), f, deferred, loads);
            }
            Msg::Remove { start, end } => {
                self.discard_range(start, end, true, w);
                self.let_raiser_run(w);
            }
            Msg::Unmap { start, end } => {
                self.discard_range(start, end, false, w);
                self.forget_range(start, end);
                self.let_raiser_run(w);
            }
            Msg::Remap { from, to, len } => {
                self.remap(from, to, len);
                self.let_raiser_run(w);
            }
            Msg::Fork { fd } => {
                // Not negotiated; close it should it ever come.
                // SAFETY: the kernel gave us this descriptor.
                drop(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) });
            }
            Msg::Unknown(_) => {}
        }
    }

    /// After an event: until the thread that raised it runs again, every
    /// resolving ioctl fails with EAGAIN (the kernel counts the event as
    /// pending until then). On a CPU handler (the only one whose wakes are
    /// deferred) that thread usually slept on this CPU: its CPU went idle,
    /// so the handler ran. Yielding lets it run now rather than when the
    /// handler next finds nothing to do, so the faults after the event in
    /// this batch resolve at once instead of going to the main handler's
    /// retries. A discarding evictor resumes, drops its pages and waits for
    /// the dispatch lock held here (see `evict`). The main handler runs at
    /// the normal policy and does not yield: an idle-policy thread would
    /// not get its CPU anyway.
    pub(super) fn let_raiser_run(&self, w: &Wakes) {
        if w.defer {
            std::thread::yield_now();
        }
    }

    /// Records that messages were just read (the CPU handlers spin on).
    pub(super) fn note_read(&self) {
        let ns = self.epoch.elapsed().as_nanos() as u64;
        // Relaxed: a hint for when to spin, ordered with nothing else.
        self.last_read_ns.store(ns, Ordering::Relaxed);
    }

    /// Time since messages were last read.
    pub(super) fn since_read(&self) -> Duration {
        let ns = self.epoch.elapsed().as_nanos() as u64;
        Duration::from_nanos(ns.saturating_sub(self.last_read_ns.load(Ordering::Relaxed)))
    }

    /// Faults wait in the handoff: their messages are read, so only a
    /// handler that looks again takes them.
    fn handoff_pending(&self) -> bool {
        !self.dispatch.lock().handoff.is_empty()
    }

    /// The CPU handlers are spinning on the descriptor.
    pub(super) fn cpu_handlers_spinning(&self) -> bool {
        self.cpu_handlers.load(Ordering::Relaxed) > 0 && self.since_read() < self.cfg.cpu_spin
    }

    /// A CPU handler: bound to `cpu` at idle priority, so it runs exactly
    /// when nothing else can run there, as when a thread of that CPU has
    /// just blocked on a fault. Resolving the fault there wakes the thread
    /// on its own CPU: no cross-CPU wake-up, which costs more than the
    /// rest of a fault on a virtual machine. See the crate documentation.
    pub(super) fn cpu_handler_loop(self: Arc<Self>, cpu: usize) {
        if sys::pin_idle(cpu).is_err() {
            // Not bound, it would be no better than the main handler.
            return;
        }
        self.cpu_handlers.fetch_add(1, Ordering::Relaxed);
        let mut msgs = vec![RawMsg::default(); 16];
        let mut buf = PageBuf::new(self.cfg.readahead_max + 1);
        let mut w = Wakes::deferred();
        let mut loads = Vec::new();
        let mut last = Instant::now();
        let mut fresh_until = last + CPU_FRESH;
        while !self.shutdown.load(Ordering::Relaxed) {
            let now = Instant::now();
            if now.duration_since(last) > CPU_GAP {
                fresh_until = now + CPU_FRESH;
            }
            last = now;
            if self.since_read() >= self.cfg.cpu_spin {
                // Nothing for a while: block until a message comes. The
                // wake-up is cross-CPU for all but one handler; whoever
                // runs first takes the message.
                let timeout = if self.handoff_pending() { 1 } else { -1 };
                sys::poll2(self.uffd.raw_fd(), self.stop.raw_fd(), timeout);
                // Spin again from now (the message is not read yet).
                self.note_read();
                last = Instant::now();
                fresh_until = last + CPU_FRESH;
                continue;
            }
            match self.cpu_step(now < fresh_until, &mut msgs, &mut buf, &mut w, &mut loads) {
                // Yield: an evictor discarding at the idle policy (see
                // `evict`) may be waiting for this CPU.
                Step::Idle => std::thread::yield_now(),
                Step::Worked { woke_at } => {
                    // Its own work is no gap, but the thread it woke
                    // preempts it at once: time after the wake-up is.
                    last = woke_at;
                }
            }
        }
    }

    /// One step of a CPU handler; `fresh`: it was just preempted, so the
    /// faults pending are likely its own CPU's.
    pub(super) fn cpu_step(
        &self,
        fresh: bool,
        msgs: &mut [RawMsg],
        buf: &mut PageBuf,
        w: &mut Wakes,
        loads: &mut Vec<Load>,
    ) -> Step {
        let Some(mut d) = self.dispatch.try_lock() else {
            return Step::Idle;
        };
        let (n, t0) = if !d.handoff.is_empty() {
            let waited = d.handoff_at.is_none_or(|t| t.elapsed() >= HANDOFF_WAIT);
            if !fresh && !waited {
                return Step::Idle;
            }
            let n = d.handoff.len();
            msgs[..n].copy_from_slice(&d.handoff);
            d.handoff.clear();
            (n, d.handoff_at.unwrap_or_else(Instant::now))
        } else {
            let n = self.uffd.read_msgs(msgs).unwrap_or(0);
            if n == 0 {
                return Step::Idle;
            }
            self.note_read();
            let t0 = Instant::now();
            // A batch with an event is handled at once by whoever read it:
            // the thread that caused the event is not waiting for it (it
            // went on once the event was read), but every later message is.
            let events = msgs[..n]
                .iter()
                .any(|m| !matches!(m.decode(), Msg::Fault { .. }));
            if !fresh && !events {
                d.handoff.extend_from_slice(&msgs[..n]);
                d.handoff_at = Some(t0);
                return Step::Idle;
            }
            (n, t0)
        };
        let counter = if fresh {
            &self.faults_local
        } else {
            &self.faults_remote
        };
        counter.fetch_add(n as u64, Ordering::Relaxed);
        let before = d.deferred.len();
        self.handle_batch(&msgs[..n], t0, buf, w, &mut d.deferred, loads);
        let deferred = d.deferred.len() > before;
        drop(d);
        if deferred {
            self.wake.signal();
        }
        let woke_at = Instant::now();
        w.finish(self);
        if !loads.is_empty() {
            // With the dispatch lock released, so that another handler can
            // read and resolve the next fault, and load, meanwhile. Each
            // load wakes its thread when mapped; what must be retried goes
            // to the main handler.
            let mut again = Vec::new();
            self.finish_loads(loads, buf, w, &mut again);
            if !again.is_empty() {
                self.dispatch.lock().deferred.append(&mut again);
                self.wake.signal();
            }
        }
        Step::Worked { woke_at }
    }

    /// Finishes the loads in `loads` (steps 2 and 3 of `load.rs`), with no
    /// pager lock held; faults to retry go to `deferred`.
    pub(super) fn finish_loads(
        &self,
        loads: &mut Vec<Load>,
        buf: &mut PageBuf,
        w: &mut Wakes,
        deferred: &mut Vec<Fault>,
    ) {
        for l in loads.drain(..) {
            let f = l.f;
            let o = self.finish_load(l, buf, w);
            if self.deferred(o, &f) {
                deferred.push(f);
            }
        }
    }

    /// Files what handling `f` came to: a started load goes to `loads`, a
    /// fault that must be retried to `deferred`.
    fn file(&self, o: Outcome, f: Fault, deferred: &mut Vec<Fault>, loads: &mut Vec<Load>) {
        match o {
            Outcome::Load(l) => loads.push(l),
            o => {
                if self.deferred(o, &f) {
                    deferred.push(f);
                }
            }
        }
    }

    /// Whether a fault must be retried; counts and flags what it waits for.
    pub(super) fn deferred(&self, o: Outcome, f: &Fault) -> bool {
        match o {
            Outcome::Done => false,
            Outcome::Load(_) => unreachable!("a started load is filed, not retried"),
            Outcome::Foreign => unreachable!("only with in-thread faults, which no handler reads"),
            Outcome::Defer => true,
            Outcome::Again => {
                if !f.retried {
                    self.faults_again.fetch_add(1, Ordering::Relaxed);
                }
                // The evictor signals `wake` when its discard returns.
                self.again_waiting.store(true, Ordering::Relaxed);
                true
            }
        }
    }

    /// Retries deferred faults (call with no pager lock held). Under the
    /// dispatch lock, as a batch's faults: an event another handler has
    /// read is applied before any page is mapped (see `handle_batch`).
    pub(super) fn retry(&self, deferred: &mut Vec<Fault>, buf: &mut PageBuf, w: &mut Wakes) {
        let old = std::mem::take(deferred);
        let mut loads = Vec::new();
        {
            let _d = self.dispatch.lock();
            for mut f in old {
                f.retried = true;
                self.file(self.fault(f, buf, w), f, deferred, &mut loads);
            }
        }
        self.finish_loads(&mut loads, buf, w, deferred);
        if !deferred.is_empty() {
            self.throttled.store(true, Ordering::Relaxed);
            let _g = self.state.lock();
            self.work_cv.notify_one();
        }
    }
}

/// How long the main handler spins on the descriptor after its last
/// message before it blocks in poll: `PagerConfig::spin` while spinning
/// pays, less while it does not. A spin that finds a message doubles it (a
/// sixteenth of the most at least); a spin that ends in poll halves it, to
/// nothing below a thirty-second; a wake-up from poll sooner than the most
/// (a spin would have found that message) doubles it again. Spinning is a
/// read system call after another: with faults some hundred µs apart (a
/// compiler under a budget) a fixed spin burnt a CPU that the program's own
/// processes needed, on a small machine most of what the handler cost.
struct AdaptiveSpin {
    max: Duration,
    now: Duration,
}

impl AdaptiveSpin {
    fn new(max: Duration) -> AdaptiveSpin {
        AdaptiveSpin { max, now: max }
    }

    fn limit(&self) -> Duration {
        self.now
    }

    fn caught(&mut self) {
        self.now = (self.now * 2).max(self.max / 16).min(self.max);
    }

    fn missed(&mut self) {
        self.now /= 2;
        if self.now < self.max / 32 {
            self.now = Duration::ZERO;
        }
    }

    fn woke_after(&mut self, blocked: Duration) {
        if blocked < self.max {
            self.caught();
        }
    }
}
