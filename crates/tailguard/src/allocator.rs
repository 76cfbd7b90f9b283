//! The allocator's freed memory given back to the system while the gateway idles.
//!
//! mimalloc gives the pages of freed blocks back to the system (`MADV_DONTNEED`) only
//! `purge_delay` (1 s) after they were freed, and only when some thread later frees a page or
//! collects: a purge is never run by a timer. After a storm of connections closes, the
//! serving threads have nothing to free or allocate, so the storm's memory stayed resident
//! (76-78 MB after 3000 connections, from 23 MB idle, issue 25). One thread collects once a
//! second instead; mimalloc purges whatever has waited its delay, from every thread's
//! arenas, so freed memory goes back within about two seconds of being freed. The collect is
//! cheap when nothing is due (a clock read and a comparison), and no serving thread pays it.
//!
//! This module is the crate's only `unsafe`: one call into mimalloc's C API, which take no
//! pointer and have no precondition beyond mimalloc being the process's allocator (it is:
//! `ALLOCATOR` in `main.rs`).
#![allow(unsafe_code)]

use std::time::Duration;

// mimalloc's C API, linked in by the `mimalloc` crate (its `libmimalloc-sys` declares it
// only behind a feature that needs another crate).
unsafe extern "C" {
    /// Collects the calling thread's heap and purges the arenas' expired freed ranges;
    /// `force` purges at once, ignoring the delay.
    fn mi_collect(force: bool);
}

/// How often freed memory is looked at: mimalloc's own purge delay (1 s), so memory waits
/// at most about twice that.
const COLLECT_EVERY: Duration = Duration::from_secs(1);

/// Each serving thread's collection, once a second: an idle serving thread's empty pages
/// stay in its own heap until that thread collects, so the collector thread's purge never
/// sees them (a parked or closed connection's freed task stayed resident).
fn collect_this_thread() {
    // SAFETY: as in `give_back_freed_memory`; here the serving thread's own heap.
    unsafe { mi_collect(false) };
}

/// Starts the thread that gives freed memory back, and has each serving thread collect its
/// own heap (for `run` only: the load generator and the lab's short-lived commands do not
/// need it).
pub(crate) fn give_back_freed_memory() {
    // No transparent huge pages for the process: a 2 MiB page stays resident while any byte
    // of it is used, and cannot be given back 64 KiB at a time, so the memory of closed and
    // parked connections stayed counted (an idle HTTP/1.1 connection 2.2 KB instead of
    // 1.0 KB, `docs/benchmarks/2026-11-28-idle-park/`). The `no_thp` build of mimalloc stops
    // it asking for them (`madvise`); this covers hosts whose THP mode is `always`.
    if let Err(e) = rustix::thread::disable_transparent_huge_pages(true) {
        eprintln!("tailguard: transparent huge pages stay on: {e}");
    }
    tailguard_proxy::server::set_serving_thread_housekeeping(collect_this_thread);
    let started = std::thread::Builder::new()
        .name("tailguard-free".into())
        .spawn(|| {
            loop {
                std::thread::sleep(COLLECT_EVERY);
                // SAFETY: `mi_collect` takes no pointer and may be called from any thread at
                // any time; `false` asks for the ordinary (non-forced) collection of this
                // thread's heap and of the process's arenas.
                unsafe { mi_collect(false) };
            }
        });
    if let Err(e) = started {
        // Memory is then returned only as traffic frees pages, as before: no reason to stop.
        eprintln!("tailguard: the freed-memory thread did not start: {e}");
    }
}
