//! uzswap-region: memory regions whose cold pages live in a compressed
//! store, made real through userfaultfd (zswap rebuilt in userspace).
//!
//! # Glossary
//! - **page**: a 4096-byte OS page.
//! - **region**: an anonymous private mapping registered with the pager's
//!   userfaultfd for missing and write-protect faults ([`Region`]).
//! - **area**: a region's id; the store's keys are `(area, page index)`.
//! - **resident**: a page that may be mapped (states `Dirty`, `Clean`,
//!   `Evicting`, `EvictAborted`, `Discarding` of [`PageState`]) or is about
//!   to be (`Loading`: the budget is reserved for it). The pager keeps
//!   `resident ≤ limit` for all its regions together.
//! - **limit**: the budget less the *charge*, memory outside the regions
//!   that the budget pays for (`PagerConfig::charge`: `uzswap run` charges
//!   its own heap, as a memory cgroup charges the kernel's allocations for
//!   a task); never below `PagerConfig::floor_pages` (default a quarter of
//!   the budget). Without a charge the
//!   limit is the budget. The evictor reads the charge every 10 ms
//!   (`CHARGE_PERIOD`), also while nothing faults; while the resident set
//!   does not move and the limit does not come down, the period doubles up
//!   to 80 ms (`IDLE_CHARGE_PERIOD`).
//! - **store**: where evicted pages go ([`PageStore`]; the real one is
//!   `uzswap_cache::Cache`, [`MemStore`] serves tests).
//! - **parked fault**: a fault on a page the evictor is working on, or one
//!   a load is bringing back; the handler only flags it, and whoever
//!   settles the page (or ends the load) wakes it (with in-thread faults:
//!   bumps the settle sequence the faulting thread waits on).
//! - **pin**: a page kept resident and writable for a system call
//!   ([`Region::pin`]); the evictor never claims it.
//!
//! # Moving parts
//! One [`Pager`] owns one userfaultfd, one handler thread (`uzswap-uffd`),
//! one evictor thread (`uzswap-evict`), one store and one budget. Regions
//! made by it share all of these. Architecture invariant: only `sys`
//! touches userfaultfd and `libc`.
//!
//! # Fault protocol (handler thread)
//! The handler reads messages in batches (up to 64), spinning on the
//! non-blocking descriptor for `PagerConfig::spin` after the last message
//! before blocking in `poll`: the wake-up from `poll` is most of the 15 µs
//! a plain handler costs here. It never blocks on the evictor. Per message:
//! - **missing fault, `Absent` page** (never touched, or discarded): zeros.
//!   A read gets `UFFDIO_ZEROPAGE`; a write gets `UFFDIO_COPY` of a zero
//!   page (it would copy the zero page at once anyway). → `Dirty`. With it
//!   goes the run of `Absent` pages after it (zero readahead: the window
//!   doubles up to `zero_readahead_max` while first touches land right
//!   after the last run, and halves otherwise), mapped as the zero page by
//!   one `UFFDIO_ZEROPAGE` within the free budget: a heap that grows costs
//!   one round trip per run instead of one per page. While more than a
//!   quarter of the limit is free the run is `zero_readahead_wide` pages
//!   whatever the window (first touches that skip pages never grow it),
//!   halved until it fits when it would cross into another mapping. A
//!   later write to such a page is the kernel's copy-on-write, with no
//!   round trip; they are `Dirty` too (counted resident: the budget is
//!   charged for them before they are written).
//! - **missing fault, `Stored` page**: load it with `LoadMode::Keep` plus
//!   the run of `Stored` pages after it (readahead; the window doubles up to
//!   `readahead_max` while faults land right after the previous window and
//!   halves otherwise), with no lock held (see "Loads" below). The faulting
//!   page is mapped first, alone, so its thread is woken at once; then the
//!   followers are loaded and mapped with one `UFFDIO_COPY`. Pages are mapped in `MODE_WP` and become `Clean`
//!   (write-protected, the store keeps an identical copy). For a write
//!   fault the faulting page is mapped writable instead and its entry
//!   invalidated (`Dirty`).
//!   With `PagerConfig::keep_clean = false` (what `uzswap run` uses) every
//!   page is mapped writable and `Dirty`, its entry invalidated once it is
//!   mapped, as the kernel's zswap frees an entry on load: no pool memory
//!   for resident pages and no write-protect fault on the first write, at
//!   the price of compressing a page again when it is evicted unwritten.
//! - **write-protect fault on a `Clean` page**: invalidate the store's
//!   entry, clear the protection (`UFFDIO_WRITEPROTECT`, which wakes the
//!   writer). → `Dirty`. The state lock is held from the look at the page
//!   to the end of the ioctl (as for every unprotect of a fault): released
//!   in between, the evictor could claim, protect, read and store the page
//!   and then have its protection undone, the write going in unseen and
//!   the page dropped with the copy from before it.
//! - **any fault on a page mid-eviction**: park it (see below). A
//!   write-protect fault on an `Evicting` page also aborts that eviction.
//!   One exception: a missing fault on a dirty victim the evictor has not
//!   dropped yet (not `zapping`) means the kernel dropped it behind the
//!   pager's back (the program's discard: see "a fault on a page already
//!   resolved" below); the evictor's own read of the page raises it and would wait for
//!   ever. The page is mapped as zeros, write-protected (a write still
//!   aborts the eviction; `faults_rezeroed`), and the evictor stores
//!   those.
//! - **any fault on a `Loading` page**: park it; the load wakes it when it
//!   mapped the page or gave it up.
//! - **a fault on a page already resolved** (several threads faulted on it,
//!   or a readahead mapped it): `UFFDIO_WAKE`. `EEXIST` from COPY/ZEROPAGE
//!   means the same and is treated as resolved. A second such fault before
//!   the page is queued again means nothing is mapped after all: the
//!   program's own `MADV_DONTNEED` zapped the page after its remove event
//!   was read and a fault had mapped it again. The page is mapped as zeros
//!   (what a discarded page reads; `faults_rezeroed`) instead of being
//!   woken into the same fault for ever.
//! - **a missing fault on a page the evictor is about to drop**
//!   (`zapping`: committed to `MADV_DONTNEED`, not yet done) is parked
//!   whatever the page's state, and woken when the drop returned. A remove
//!   event only marks the page read; the drop happens after, so a page the
//!   program discarded and touched again in that window would otherwise be
//!   mapped anew and then taken by the evictor's drop, with the program's
//!   writes to it.
//! - **`EAGAIN`** from a resolving ioctl: a remove/unmap/remap event is
//!   being delivered and must be *read* first; the fault is deferred and
//!   retried after the next read, and at once when the evictor's discard
//!   returned (it signals the main handler; `faults_again`). Events can be read after faults that
//!   follow them causally; the page states make each step idempotent.
//! - **budget full**: a fault that would map a page with `resident ≥
//!   limit` is deferred (the thread stays blocked) until the evictor has
//!   made room; it signals the handler's eventfd. One exception: a page
//!   claimed by the eviction batch in flight that the program discarded
//!   meanwhile is served at once, because the faulting thread is then the
//!   evictor itself (reading the page to store it). The budget can so be
//!   exceeded by at most one batch, only while the program discards pages
//!   under eviction.
//!   A second exception keeps a program from blocking for ever: when the
//!   store refuses a whole eviction batch (its pool is full and it has
//!   nowhere to write back), the budget turns *soft*: faults are served
//!   over it (`store_full_episodes`, `over_budget`), and the evictor retries
//!   every 20 ms (faults do not cut the pause short); the first batch the
//!   store takes whole makes it hard again.
//! - **load failure**: a failed load is tried twice more (1 and 4 ms later,
//!   `load_retries`, no lock held): a transient device error or a torn read
//!   is survived.
//!   If it still fails, the page gets a poison marker (`UFFDIO_POISON`), so
//!   the access raises SIGBUS as a swap read error does; never made-up data.
//!
//! # Loads: no lock across the store
//! As the cache holds no lock across compression, decompression or I/O,
//! the pager holds none across a load (the store's read, decompression,
//! decryption, the retry pauses): two handlers load at once, and a slow
//! read stalls neither the evictor nor the rest of the pager. A load goes
//! in three steps (`pager/load.rs`):
//! 1. *start* (state lock): the faulting page and its stored followers
//!    become `Loading`: resident (the budget is reserved), on no list (never
//!    a victim, never in a discard span's gap), each with a ticket (its
//!    queue generation, bumped; every way out of `Loading` but the load's
//!    own bumps it again).
//! 2. *load* (no lock): `PageStore::load`, retried as above. Meanwhile a
//!    remove or unmap event takes the page as it takes a `Stored` one (the
//!    entry is invalidated, the page `Absent`), a region drop removes it,
//!    a remap moves it; a fault on it parks.
//! 3. *map* (dispatch lock, then state lock): a page still `Loading` with
//!    its ticket, at the same address, is mapped (`UFFDIO_COPY`) and
//!    committed; otherwise the event won: the bytes are thrown away, pages
//!    still the load's go back to `Stored`, parked faults and the faulting
//!    thread are woken and fault again against the page as it is now. The
//!    dispatch lock is held from the re-check to the copy because the
//!    program's `MADV_DONTNEED` zaps the page as soon as a handler has
//!    *read* its remove event: with no event read in between, a copy never
//!    lands after a discard it did not see. EAGAIN from the copy gives the
//!    pages back and retries the fault.
//!
//! With the main handler alone, faults are still resolved one at a time
//! (the handler is busy with the load); what the release buys there is the
//! evictor, the fork hook and the API (`stats`, region drops) going on.
//!
//! Kernel-mode accesses (`read(2)` into, `write(2)` from region memory) fault
//! through the same handler: this is why the pager runs a handler thread
//! by default rather than `UFFD_FEATURE_SIGBUS` mode, which fails them with
//! EFAULT (that mode is opt-in: "In-thread faults" below).
//!
//! # CPU handlers (`PagerConfig::cpu_handlers`, off by default)
//! On a virtual machine most of a handled fault is the cross-CPU wake-up:
//! the faulting thread sleeps on one CPU, the handler wakes it from
//! another, and the interrupt that takes costs about 10 µs here. With
//! `cpu_handlers` the pager also runs one handler per CPU (at most
//! `MAX_CPU_HANDLERS`), bound to it and at the `SCHED_IDLE` policy: it runs
//! exactly when its CPU has nothing else to do, as right after a thread
//! there blocked on a fault, and the thread it wakes preempts it at once.
//! The fault is then resolved and woken on the thread's own CPU. Kernel-mode
//! accesses keep working: this is the same userfaultfd, read by more
//! threads.
//! - **Whose fault is it.** A CPU handler that was just preempted (its
//!   loop saw a gap of over 3 µs) takes what it reads as its CPU's. One that
//!   kept spinning on an idle CPU knows the fault came from elsewhere and
//!   leaves it in a hand-off slot for the handler of that CPU, which runs as
//!   soon as the faulting thread sleeps; after 20 µs (that CPU is busy) any
//!   handler takes it.
//! - **Order.** Batches are handled in the order they were read, one
//!   at a time, as by a single thread: the descriptor is read only under
//!   the dispatch lock with the hand-off slot empty, and a batch is handled
//!   (or handed off) before the lock is released. So a fault read after a
//!   remove event is never resolved before the event is handled (it would
//!   map the discarded page's old contents). Within a batch the events are
//!   handled before the faults, and faults retried later or resolved
//!   in-thread take the dispatch lock too: a page mapped between the read
//!   of a remove event and its handling could outlive the zap that the
//!   read let go on, and would then be held `Absent` while mapped (see
//!   `pager/handler.rs`, `handle_batch`).
//! - **No lock held when preempted by our own wake-up.** A CPU handler
//!   resolves with `DONTWAKE`, releases every lock, and only then wakes the
//!   faulting thread (`UFFDIO_WAKE`) and, after it, the evictor.
//! - **After an event it yields.** Until the thread that raised a remove,
//!   unmap or remap event runs again, the kernel counts the event as
//!   pending and every resolving ioctl fails with EAGAIN. That thread
//!   usually slept on this CPU (which is why its handler ran), so the
//!   handler yields at once after handling the event: the discarding evictor resumes, drops
//!   its pages and waits for the dispatch lock, and the faults after the
//!   event in the batch resolve instead of being deferred. This cut the
//!   skewed pattern's EAGAIN deferrals by a third.
//! - **Faults it cannot resolve** (EAGAIN, budget full) go to the main
//!   handler's retries. The main handler stays: while the CPU handlers spin
//!   it watches only its eventfd, and the descriptor every millisecond as a
//!   backstop for when no CPU handler gets a CPU.
//! - **Spinning.** CPU handlers spin for `cpu_spin` (2 ms) after the last
//!   message, only on CPUs with nothing else to run, yielding as they go,
//!   then block in poll.
//! - **The evictor discards at the idle policy.** Its `MADV_DONTNEED`
//!   sleeps until a handler reads the remove event, and that read wakes it
//!   on the CPU it slept on, where a CPU handler is now running. At the
//!   normal policy it would preempt that handler while it holds the
//!   dispatch lock, and no fault would be read until the evictor slept
//!   again (after its next batch: hundreds of µs). So while CPU handlers
//!   run, the evictor switches to `SCHED_IDLE` for its discards and back
//!   after (one pair of calls, about 3 µs, per discard call); woken, it
//!   waits for the handler to yield, which it does right after handling
//!   the event. The price: under a full machine
//!   its discards get CPU time only slowly. Only where the process may
//!   leave the idle policy again (`CAP_SYS_NICE` or a high enough
//!   `RLIMIT_NICE`; the default limit does not allow it): elsewhere the
//!   discards stay at the normal policy.
//!
//! Measured here (docs/BENCHMARKS.md): the fault example's random touches
//! fall from 29 to 9.4–9.8 µs at the median; usemem's fill is 1.4–2 ×
//! faster and its sequential pass 1.3 ×; its skewed pass, where the evictor
//! discards scattered pages all the time, is about the same speed with a
//! higher p99. Off by default: the handlers spin on idle CPUs (2 ms after
//! each fault), which a user should choose.
//!
//! # In-thread faults (`PagerConfig::in_thread_faults`, off by default)
//! Hidden from the API documentation (experimental). A write to a page
//! under eviction could be lost (seen under AddressSanitizer, about 1 run
//! in 40 of `faults_on_a_page_under_eviction`): a write fault cleared the
//! page's protection after dropping the state lock, undoing the evictor's
//! protection of a page it had claimed meanwhile, in either mode; it now
//! unprotects under the lock (`PagerConfig::in_thread_faults` says more).
//!
//! For programs that use regions through the library and know which
//! memory they hand to system calls. The userfaultfd is negotiated with
//! `UFFD_FEATURE_SIGBUS`: the kernel then raises SIGBUS (`BUS_ADRERR`, at
//! the faulting address) on the faulting thread for every userfault,
//! missing or write-protect (`handle_userfault` returns `VM_FAULT_SIGBUS`
//! before it looks at the reason), and queues no message. The pager's
//! SIGBUS handler resolves the fault right there, as the handler thread
//! would (`PagerCore::fault`, then the load's steps 2 and 3 on this thread),
//! and returns; the access runs again. No hand-off, no wake-up: measured
//! here 3.9 µs a fault against 13.6 µs for a spinning handler thread.
//! - **Contract.** A system call that reads or writes region memory that
//!   is not resident (or a write-protected clean page) fails with `EFAULT`:
//!   the kernel cannot raise SIGBUS for its own access. Make the range
//!   resident and keep it so for the call with [`Region::pin`] (a guard;
//!   the evictor leaves pinned pages until it is dropped). The program's
//!   allocator must not place its heap in such a region (the handler then
//!   could interrupt it inside itself). The program's own signal handlers
//!   must not touch region memory that is not pinned: such a handler can
//!   interrupt the thread inside a pager call that holds the state lock
//!   (`evict`, `pin`, a region's drop), and the SIGBUS its access raises
//!   would then wait for that lock on the same thread for ever. One pager
//!   per process may have the mode (`PagerError::InThreadTaken`); x86-64
//!   only (the handler reads
//!   the page fault's error code to tell a write-protect fault from a
//!   missing page); not with `cpu_handlers`; a kernel without the feature
//!   is `PagerError::NoSigbus`.
//! - **Ours or not.** A SIGBUS is ours if its `si_code` is `BUS_ADRERR`
//!   and its address lies in a segment of the pager. Anything else (a
//!   poison marker's `BUS_MCEERR_AR` after a failed load, a file mapping
//!   read past its end, a forked child that did not take the pager over)
//!   goes to the disposition SIGBUS had before ours (Rust's runtime
//!   handler, a program's own, or the default action): a genuine SIGBUS
//!   still kills. The handler runs on the thread's own stack (no
//!   `SA_ONSTACK`: Rust's alternate stack is too small for a load).
//! - **Waits.** A fault on a page the evictor or another thread's load is
//!   working on, or one deferred (budget full, a fork preparing), waits on
//!   the pager's *settle sequence*, a futex word read under the state lock
//!   before the page is looked at and bumped by every settle (each way a
//!   parked fault is woken, the end of an eviction batch or a fork): no
//!   wake-up is lost, and the handler then returns so the access runs
//!   again and everything is re-checked. EAGAIN (an event is being
//!   delivered) yields and runs the access again: the handler thread reads
//!   the event. Events (remove, unmap, remap) still arrive on the
//!   userfaultfd and the handler thread handles them as ever.
//! - **Async-signal-safety** (`pager/inthread.rs`): the SIGBUS is
//!   synchronous, so the interrupted code holds only what code accessing
//!   region memory holds; no code of the pager or the store accesses
//!   region memory in user mode (the evictor reads with
//!   `process_vm_readv`, loads map with `UFFDIO_COPY`, moved pages are read
//!   in the staging area of another userfaultfd), so the handler may take
//!   the pager's and the store's locks. It allocates nothing of its own:
//!   page buffers come from a pool made with the pager, a load's tickets
//!   are a fixed array, pages are queued into list capacity reserved
//!   beforehand (a fault that finds too little is deferred until the
//!   evictor reserved more), and it saves `errno`.
//! - **Counters.** `faults_waited` (waits on the settle sequence) and
//!   `waits_timed_out` (of those, waits that ran to their 2 ms bound).
//!
//! Measured (docs/BENCHMARKS.md, "In-thread faults"; usemem, 1 GiB in
//! 256 MiB, on a machine shared with other builds): the skewed pattern's
//! program-side fault p50 is 10.3–10.5 µs in-thread against 18.6 µs with
//! the handler thread, and the kernel's zswap at 8.1–8.2 µs; 5.9 µs of it
//! inside the pager, the rest the kernel's signal round trip. The pass is
//! 1.3–1.5 × the kernel's on the sequential pattern and 0.90–1.11 × on the skewed
//! one. Off by default: the EFAULT contract is the program's to keep.
//!
//! # Eviction: write-protect (or move) before copy (evictor thread)
//! The evictor sleeps until `resident > limit − margin` and then evicts in
//! batches until `resident ≤ limit − 2·margin` (margin = budget/32, 2..256),
//! so faults rarely find the budget full. A batch (64 pages) is sorted by
//! address and cut into *spans*: victims with no resident page between
//! them (at most 512 pages apart, in one segment). Steps 2, 3 and 5 act on
//! a span with one call: each `MADV_DONTNEED` is a round trip through the
//! handler (a remove event; while one is pending the handler's copies fail
//! with EAGAIN), and each `MADV_DONTNEED` and `UFFDIO_WRITEPROTECT` flushes
//! the TLB of every CPU the program runs on, an interrupt per CPU, each a
//! VM exit on a virtual machine. The pages between victims are not
//! resident, so the calls do nothing there; what must hold meanwhile:
//! - a remove event for them is ours: each span keeps a bit per page,
//!   cleared when the handler reads our event for it; an event for a page
//!   whose bit is clear is the program's. The span lives until the call
//!   returned and the evictor then took the dispatch lock once (a batch
//!   with an event is handled by whoever read it before that lock is
//!   released, so by then every event of the call was handled);
//! - a missing fault on any page of a span in flight is parked, and woken
//!   when the call returned: mapped now, the page would be dropped by it
//!   with what the program wrote. Readahead stops at such a page;
//! - a page between victims that a fault maps after the write-protect was
//!   planned is protected too; its first write faults and is unprotected,
//!   as a `Dirty` page's would be. The discard is planned at commit, under
//!   the state lock, so it never covers a page mapped by then.
//!
//! For each victim:
//! 1. *claim* (state lock): `Dirty` → `Evicting`; `Clean` → `Discarding`.
//! 2. `UFFDIO_WRITEPROTECT` the page. When the ioctl returns the TLB is
//!    flushed and no CPU can write it; a write now faults with the WP flag,
//!    and the handler marks the page `EvictAborted` and parks the writer.
//!    (A `Clean` page is already protected and skips steps 2–3.)
//! 3. copy the bytes out (`process_vm_readv` on ourselves, so a concurrent
//!    unmap is an error, not a crash) and `store` them.
//! 4. *commit* (state lock): still `Evicting` → `Discarding`; `EvictAborted`
//!    → drop the stored copy, unprotect (which wakes the writer), `Dirty`;
//!    anything else (the program discarded the page meanwhile) → drop the
//!    stored copy.
//! 5. *drop* the page: (5a) a span of at most 4 victims is *moved* out, page by
//!    page (`UFFDIO_MOVE`), into a staging area registered with a second
//!    userfaultfd that has no events (`sys::Staging`), and the staging
//!    pages are dropped together after the batch: no remove event, so no
//!    round trip through a handler and no window in which its copies fail
//!    with EAGAIN. On the skewed usemem pattern, where victims are
//!    scattered, this took EAGAIN deferrals from about 20,000 to 5,000 and
//!    discard calls from 44,000 to 11,000 (docs/BENCHMARKS.md). A program
//!    discard of a page being moved is the program's event (the page is in
//!    no span of ours): if it came first the move finds no page (ENOENT),
//!    and the evictor takes the dispatch lock once so that the event was
//!    handled before settle. Moves go one page per ioctl and never with
//!    `ALLOW_SRC_HOLES`: on Linux 6.18 the kernel's move loop keeps an
//!    EAGAIN across its retries, so a move that met one and then a hole
//!    spins in the kernel for ever (a test hung so), and one that met one
//!    and then moved the page reports EEXIST for it, which `Staging::take`
//!    checks with `mincore` (the slot was empty before). (5b) Longer spans,
//!    pages the kernel will not move (EBUSY: shared with a forked child;
//!    EINVAL: a mapping with other flags) and kernels without
//!    `UFFDIO_MOVE` get `MADV_DONTNEED` of the span. Because EVENT_REMOVE
//!    is on, that raises a remove event; the span's bits tell the handler
//!    that event is ours, so it keeps the entries. If the program discards
//!    a page of the span at the same moment, the two events are counted,
//!    whichever is seen first, and the page ends `Absent` either way.
//! 6. *settle* (state lock): `Discarding` → `Stored`; wake parked faults,
//!    which retry and fault as missing, now loading the page.
//!
//! **Moved first.** A dirty victim of a short span (the spans step 5
//! would drop, at most 4 victims, while the staging area has room) takes
//! steps 2 to 6 in another order, one page at a time
//! (`PagerCore::move_out`), before the rest of the batch: marked `zapping`
//! (state lock), moved into a staging slot (`UFFDIO_MOVE`: the program
//! loses the page atomically, with one TLB flush and no write protection,
//! so no second flush), stored from the slot, and settled at once (state
//! lock: `Stored` if still `Evicting`, else the program discarded it and
//! the copy is dropped), waking what parked on it. A fault on it parks
//! only while that one page is compressed. If the store refuses it, it is
//! copied back (`UFFDIO_COPY`) under the dispatch lock and then the state
//! lock, only if still `Evicting`, at the address its key has now (a
//! remap may have moved it): as a load maps a page, no event is read
//! between that re-check and the copy, and a copy that meets a pending
//! event (EAGAIN) lets go and looks again. A page the kernel will not move
//! goes on through steps 2 to 6 as above. On gomap (Go, cgo) in 48 MiB
//! this took the run's CPU time to 0.77 × and its wall time to 0.86 × of
//! protecting first (docs/BENCHMARKS.md, "programs").
//!
//! No write is lost: a write before step 2 (or the move) is in the copy; a
//! write after step 2 faults and either aborts the eviction (before step
//! 4) or waits until step 6 and then reloads the stored bytes; a write
//! after a move faults as missing and waits until the page is settled. A `Clean` page was never
//! written since it was loaded (any write would have faulted), so dropping
//! it needs no store: the store kept its copy (`clean_drops`).
//!
//! # Victim choice: two lists and refault distance
//! Reads of mapped anonymous memory cannot be observed here (no accessed
//! bits, WP_ASYNC would disable the synchronous protection eviction needs),
//! so the policy uses what is seen: faults, refaults and writes to clean
//! pages. As the kernel's workingset code does, every eviction ticks a
//! clock and the page keeps the tick; on a refault the *refault distance*
//! (evictions since) is compared with the budget: a page that would still
//! have been resident with twice the memory is part of the working set and
//! goes to the *active* list, other pages to the *inactive* list. Victims
//! come from the head of the inactive list; a page seen written since it
//! was queued gets a second chance on the active list; the active list is
//! kept at most 7/8 of the resident pages by demoting its head. On a
//! skewed pattern this refaults markedly less than FIFO (which
//! `VictimPolicy::Fifo` provides for comparison; see the test
//! `policy_beats_fifo_on_skewed_access`).
//!
//! Two refinements use where pages lie, as the kernel's multi-gen LRU looks
//! around a young page: a victim takes with it the inactive pages near it
//! (up to 256 pages either side, not past a resident page that is not
//! one), so that victims form spans; and an inactive page between two
//! active ones gets one turn on the active list per residency instead of
//! leaving (it is likely in use as they are, and alone it would cost a
//! discard call of its own). Which inactive pages go first matters little:
//! none of them has been seen in use since it came in.
//!
//! The lists also choose the codec. A victim that was on the active list
//! at some point of its residency is part of the working set and likely
//! back soon: it is stored with [`PageStore::store`]. One that never was
//! (it came in by a first touch or a long-distance refault) goes to
//! [`PageStore::store_cold`], which the cache serves with its
//! `cold_compressor` when one is set: a denser, slower codec for pages
//! that mostly stay in the pool, the fast one on the refault path.
//!
//! # Events
//! - **remove** (`MADV_DONTNEED`, `MADV_REMOVE`) and **unmap**: the pages
//!   become `Absent` and the store's entries are invalidated; an eviction in
//!   flight notices at commit or settle. Unmapped ranges leave the segment
//!   map.
//! - **remap** (`mremap`): the segment map moves; pages keep their `(area,
//!   page)` keys, so the store's entries move with them at no cost.
//!   Limitation: an eviction in flight on a page being moved acts on the old
//!   address; its ioctls fail there and the eviction is abandoned, unless a
//!   new mapping is placed at the old address within those microseconds.
//! - **fork**: EVENT_FORK is not used (it needs CAP_SYS_PTRACE and would
//!   have the parent serve the child's faults). Without it the child's
//!   copy of a region is plain memory, where an evicted page would read as
//!   zeros. By default (`ForkChild::Managed`) the child takes over its
//!   copy of the pager before `fork()` returns: a new userfaultfd, every
//!   segment registered again, its own threads, its own store (the cache
//!   shares its backing file's slots and gives it a file of its own for
//!   new ones); nothing is brought back for the fork
//!   (see `pager/fork.rs`). `ForkChild::Prefault` brings every stored page
//!   back before the fork instead (the child then has no pager);
//!   `ForkChild::Unmanaged` does neither, for programs that fork only to
//!   exec. A host that shares one budget among processes can have the
//!   parent make room first for what the child will copy at once
//!   (`PagerConfig::fork_room`, `Pager::make_room_for_fork`).
//!
//! # Lock order
//! The pager's locks, the order they are taken in and what no lock is held
//! across are written once, in the [`pager`] module documentation ("Lock
//! order"), beside the struct that owns them.

mod cache_store;
pub mod pager;
pub mod region;
pub mod stats;
pub mod store;
pub mod sys;

pub use pager::{
    fork_child_managed, Charge, ForkChild, PageState, Pager, PagerConfig, PagerError, PagerUsage,
    RegionError, VictimPolicy, ACCESS_CHUNK, CHARGE_PERIOD, IDLE_CHARGE_PERIOD, MANAGE_MIN_PAGES,
};
pub use region::{PinError, Pinned, Region};
pub use stats::{LatencySummary, PagerStats};
pub use store::{LoadError, LoadMode, Loaded, MemStore, PageStore, StoreError, StoreStats, Stored};
pub use sys::{OpenError, PAGE_SIZE};
