//! Start-up and exit: the constructor that reads the configuration and
//! starts the cache, the pager, the space and the statistics socket before
//! `main`, and the exit hook that writes the last statistics.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use uzswap_cache::{Backing, Cache, CacheConfig, PoolLimit};
use uzswap_contract::{BackingTier, RunConfig};
use uzswap_region::{Pager, PagerConfig, PAGE_SIZE};
use uzswap_remote::RedisBacking;

use crate::alloc::setup_runtime_heap;
use crate::fork::{fork_child, fork_parent, fork_prepare};
use crate::state::{
    enter_internal, leave_internal, mark_thread_internal, Runtime, OWNER_PID, READY, RUNTIME,
};
use crate::{cosched, share, space, stats, sys};

/// Starts the runtime if `uzswap run` asked for it: joins the ledger,
/// starts the cache and the pager over the reserved space, then
/// [`switch_on`]. `Ok` without a runtime if nothing is to be managed.
fn start() -> Result<(), String> {
    // Parsed and checked by the contract `uzswap run` wrote it with.
    let Some(config) = RunConfig::from_env().map_err(|e| e.to_string())? else {
        return Ok(()); // not asked to manage anything
    };
    if config.cosched {
        // Started with `vfork`/`posix_spawn` by a thread co-scheduling
        // pinned: the tree's affinity back (cosched.rs).
        if let Some(run) = config.ledger.as_deref().and_then(share::run_pid) {
            cosched::release_inherited(run);
        }
    }
    // With a ledger the budget is the whole tree's and this process holds
    // its allotment of it (share.rs). Joined first: nothing of the runtime
    // is set up yet if the run has ended and the program runs unmanaged.
    let share = match &config.ledger {
        Some(path) => match share::Share::join(path, config.memory_max, config.pool_max)? {
            Some(sh) => Some(Arc::new(sh)),
            None => {
                sys::warn(&format!(
                    "the `uzswap run` that started this program has ended (its ledger {} \
                     is gone): this process runs unmanaged",
                    path.display()
                ));
                return Ok(());
            }
        },
        None => None,
    };
    // Before the cache and the pager start their threads.
    setup_runtime_heap();
    let budget_pages = (config.memory_max / PAGE_SIZE as u64) as usize;
    let cache_cfg = cache_config(&config, share.as_ref())?;
    // The helpers below (the pool's compactor, the cache's writer, the
    // pager's handler and evictor, the statistics server, co-scheduling's
    // watcher) start together: each runs `mark_thread_internal` before
    // anything is switched on (`READY`), but this thread waits once for
    // them all instead of once for each, a scheduler's time slice apiece on
    // a busy machine, in every process of a tree.
    let started = uzswap_os::StartBatch::open();
    let cache = Arc::new(Cache::new(cache_cfg).map_err(|e| e.to_string())?);
    let pcfg = pager_config(&config, share.as_ref(), budget_pages);
    let pager = Pager::new(cache.clone(), pcfg).map_err(|e| e.to_string())?;
    let reserve = config.reserve;
    let space =
        space::Space::new(pager, usize::try_from(reserve).unwrap_or(usize::MAX)).map_err(|e| {
            format!(
                "cannot reserve {reserve} bytes of address space ({e}): set {} lower",
                uzswap_contract::names::RESERVE
            )
        })?;
    let rt = Runtime {
        space,
        cache,
        share,
        config,
        started: std::time::Instant::now(),
    };
    if RUNTIME.set(rt).is_err() {
        return Err("started twice".into());
    }
    switch_on(started)
}

/// The cache's configuration: its pool capped by the ledger's share or
/// `--pool-max`, its backing tier (a remote server connected here).
fn cache_config(
    config: &RunConfig,
    share: Option<&Arc<share::Share>>,
) -> Result<CacheConfig, String> {
    // An unreachable server stops the program before it starts (as a
    // backing directory that cannot take a file does).
    let remote = match &config.backing {
        Some(BackingTier::Redis(url)) => {
            let mut rc = uzswap_remote::RemoteConfig::default();
            if let Some(p) = &config.remote_prefix {
                rc.prefix = p.clone();
            }
            Some(Arc::new(
                RedisBacking::connect_with(url, rc).map_err(|e| e.to_string())?,
            ))
        }
        _ => None,
    };
    Ok(CacheConfig {
        compressor: config.compressor,
        cold_compressor: config.cold_compressor,
        pool_limit: match share {
            Some(sh) => PoolLimit::Bytes(sh.initial_pool_limit()),
            None => config
                .pool_max
                .map_or(PoolLimit::Percent(20), PoolLimit::Bytes),
        },
        backing: match (&config.backing, &remote) {
            (Some(BackingTier::File(p)), _) => Backing::File(p.clone()),
            (Some(BackingTier::Redis(_)), Some(r)) => Backing::Store(Box::new(Arc::clone(r))),
            _ => Backing::None,
        },
        thread_start: Some(mark_thread_internal),
        // Stores come from the evictor alone: one shard, one set of size
        // classes, one partly filled zspage per class (a shard per CPU
        // keeps two on two CPUs, and every process of a tree pays them).
        pool_shards: Some(1),
        dedup: config.dedup,
        // Every area belongs to this one program: a page may share with
        // any other it holds.
        dedup_scope: uzswap_cache::DedupScope::Global,
        ..CacheConfig::default()
    })
}

/// The pager's configuration: the budget, what it charges to the budget
/// beside the resident pages, and, in a tree, its floor and the room it
/// makes before a fork.
fn pager_config(
    config: &RunConfig,
    share: Option<&Arc<share::Share>>,
    budget_pages: usize,
) -> PagerConfig {
    let mut pcfg = PagerConfig::new(budget_pages);
    pcfg.thread_start = Some(mark_thread_internal);
    // The budget pays for the runtime's own heap (the cache index, the
    // pager's tables), as a memory cgroup pays for the kernel's
    // allocations on a task's behalf; the pool is capped apart.
    pcfg.charge = Some(uzswap_region::Charge(match share {
        None => Arc::new(|| stats::runtime_heap().held_bytes),
        Some(sh) => {
            let sh = Arc::clone(sh);
            // The pager and cache exist once RUNTIME is set; until then the
            // share reports the heap alone.
            Arc::new(move || {
                let rt = RUNTIME.get();
                sh.charge(rt.map(|r| r.space.pager()), rt.map(|r| &*r.cache))
            })
        }
    }));
    if share.is_some() {
        pcfg.floor_pages = Some(share::FLOOR_PAGES.min(budget_pages));
        // A forked child's writes soon make its copy of this memory its
        // own: the parent makes that much room before each fork.
        pcfg.fork_room = Some(uzswap_region::Charge(Arc::new(|| {
            RUNTIME.get().map_or(0, |r| {
                share::unmanaged(&r.space.pager().usage(), &r.cache.usage())
            })
        })));
    }
    pcfg.keep_clean = config.keep_clean;
    pcfg.latency_hold = config.latency_hold;
    pcfg.access_chunk = if config.access_signal {
        uzswap_region::ACCESS_CHUNK
    } else {
        0
    };
    // The budget is the program's memory: pages that map the zero page
    // hold none.
    pcfg.uncharged_zero_pages = true;
    pcfg.cpu_handlers = config.cpu_handlers;
    pcfg
}

/// Registers the fork and exit hooks, opens the statistics socket, starts
/// co-scheduling's watcher, waits for the helpers `started` counts, and
/// switches the program's memory over (`READY`).
fn switch_on(started: uzswap_os::StartBatch) -> Result<(), String> {
    OWNER_PID.store(std::process::id() as i32, Ordering::Relaxed);
    // Ours run before the pager's prepare hook (registered earlier), so the
    // pager's fork-time loads run marked internal.
    sys::at_fork(fork_prepare, fork_parent, fork_child).map_err(|r| {
        format!(
            "pthread_atfork failed: {}",
            std::io::Error::from_raw_os_error(r)
        )
    })?;
    stats::serve(mark_thread_internal)
        .map_err(|e| format!("cannot open the statistics socket: {e}"))?;
    start_cosched();
    started
        .wait()
        .map_err(|e| format!("a runtime thread did not start: {e}"))?;
    sys::at_exit(at_exit);
    crate::glibc::make_fork_state();
    crate::loader::find();
    READY.store(true, Ordering::Release);
    Ok(())
}

/// Co-scheduling's watcher, where it is asked for and can work
/// (cosched.rs): not with CPU handlers, which are bound per CPU.
pub(crate) fn start_cosched() {
    let Some(rt) = RUNTIME.get() else {
        return;
    };
    if !rt.config.cosched || rt.config.cpu_handlers || !cosched::possible() {
        return;
    }
    if let Err(e) = cosched::start(mark_thread_internal) {
        sys::warn(&format!(
            "co-scheduling is off: cannot start its thread: {e}"
        ));
    }
}

extern "C" fn init() {
    enter_internal();
    let r = start();
    leave_internal();
    if let Err(e) = r {
        sys::warn(&format!("cannot start: {e}"));
        // Ends the process before the program runs.
        sys::exit_now(125);
    }
}

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;

extern "C" fn at_exit() {
    if OWNER_PID.load(Ordering::Relaxed) != std::process::id() as i32 {
        return; // a forked child: the statistics are the parent's
    }
    enter_internal();
    if let Some(rt) = RUNTIME.get() {
        stats::write_final(rt);
        if let Some(sh) = &rt.share {
            // The last report, with the CPU time of the whole run.
            sh.measure();
            sh.charge(Some(rt.space.pager()), Some(&*rt.cache));
            sh.leave();
        }
        // The remote tier's keys stay until `uzswap run` sweeps the run's
        // prefix, once no process of the tree is left: another thread of
        // this program may still touch an evicted page while it exits,
        // and deleting them here would turn that load into a SIGBUS. A
        // killed run's keys expire with their time-to-live.
    }
    leave_internal();
}
