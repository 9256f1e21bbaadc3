//! glibc malloc settings for a long-running daemon (applied by `main` before the runtime
//! starts; a no-op on other C libraries).
//!
//! Two glibc defaults cost this process most of its memory beyond the live objects (measured
//! with the memory benchmark, see BENCHMARKS.md):
//!
//! - **Arenas.** A thread that finds the arena it wants locked gets an arena of its own, up to
//!   8 per core, and memory freed into an arena stays there for that arena's next use. Provider
//!   calls run on the provider's call pool (`provider::pool`, up to `--concurrent-node-syncs`
//!   threads at once, 64 by default) and serialise and parse whole nodes there, so each arena ends up holding its own
//!   high-water mark of JSON buffers. Two arenas keep lock contention low for the two runtime
//!   workers and the provider threads.
//! - **The dynamic mmap threshold.** glibc serves large blocks (from 128 KiB) with `mmap`, but
//!   raises that threshold to the size of every mmapped block freed, up to 32 MiB. After the
//!   first watch list page (megabytes of JSON) every later page, and every load-balancer call's
//!   host list, comes from the heap, where freeing it leaves holes that keep the peak RSS up. A
//!   fixed threshold turns off the adjustment, so those buffers go back to the system on free.
//!
//! - **Fast bins.** Freed blocks up to 128 bytes go to "fast bins", which are never merged with
//!   their free neighbours until something consolidates them. A load-balancer call with tens of
//!   thousands of hosts frees millions of such blocks at once (the plugin's parse of the host
//!   list), so their pages stayed resident until the trim after the call had consolidated them
//!   all. Without fast bins (`mxfast` 0; the per-thread cache still serves small blocks) a free
//!   merges at once: at 65,000 nodes the 100 `EnsureLoadBalancer` calls of a convergence took
//!   ~15 % less CPU (68.9 → 58.1 s) and the host's 90th-percentile share of RSS during them fell
//!   from 324 to 240 MiB, with the steady state unchanged (BENCHMARKS.md, "Scale").
//!
//! `MALLOC_ARENA_MAX` / `MALLOC_MMAP_THRESHOLD_`, or `glibc.malloc.arena_max` /
//! `glibc.malloc.mmap_threshold` / `glibc.malloc.mxfast` in `GLIBC_TUNABLES` (glibc's own
//! settings) win: a setting given there is left alone.

/// Arenas allowed (glibc's default: 8 per core).
pub const ARENA_MAX: i32 = 2;
/// Blocks from this size are mmapped and returned to the system on free (glibc's initial
/// value, made fixed).
pub const MMAP_THRESHOLD: i32 = 128 * 1024;
/// Largest block size served from fast bins: none.
pub const MXFAST: i32 = 0;

/// What [`tune`] set: (arenas, mmap threshold, fast-bin limit), `None` where the environment
/// had a setting or the C library is not glibc.
#[allow(unsafe_code)] // mallopt
pub fn tune() -> (Option<i32>, Option<i32>, Option<i32>) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let tunables = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
        let set = |env: &str, tunable: &str, param: libc::c_int, value: i32| {
            if (!env.is_empty() && std::env::var_os(env).is_some()) || tunables.contains(tunable) {
                return None;
            }
            // SAFETY: mallopt only changes allocator parameters; called before other threads
            // exist.
            (unsafe { libc::mallopt(param, value) } == 1).then_some(value)
        };
        (
            set(
                "MALLOC_ARENA_MAX",
                "glibc.malloc.arena_max",
                libc::M_ARENA_MAX,
                ARENA_MAX,
            ),
            set(
                "MALLOC_MMAP_THRESHOLD_",
                "glibc.malloc.mmap_threshold",
                libc::M_MMAP_THRESHOLD,
                MMAP_THRESHOLD,
            ),
            // glibc has no environment variable for this one, only the tunable.
            set("", "glibc.malloc.mxfast", libc::M_MXFAST, MXFAST),
        )
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        (None, None, None)
    }
}

/// Give the pages of free heap memory back to the system (glibc `malloc_trim`, which also
/// releases free pages in the middle of every arena, not only at its top).
///
/// Called after a load-balancer call: its host list is serialised by the host and parsed again
/// by the plugin, tens of megabytes of short-lived allocations with thousands of nodes, and
/// without a trim the pages they used stay resident, partly reused, until the next such call
/// grows the heap around them. A trim walks the free lists once (about a millisecond per
/// hundred megabytes of heap) and is rare next to cloud calls. A no-op on other C libraries.
#[allow(unsafe_code)] // malloc_trim
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free memory to the system; it is thread-safe.
    unsafe {
        libc::malloc_trim(0);
    }
}
