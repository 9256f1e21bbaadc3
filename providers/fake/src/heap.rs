//! The fake's own heap, counted apart from its host's: the plugin's global allocator is the
//! system allocator with counters (bytes allocated now, and the most ever; the same for the
//! allocator's footprint of those blocks). Benchmarks read them (`heapFile`, see
//! `docs/fake-provider.md`) to separate the provider's share from the host process's resident
//! memory: the fake's call log, cloud state and its SDK adapter's parsed copies of the host
//! lists live here, a real provider's live in its cloud.
//!
//! The *footprint* is what the C library's allocator spends on each block: with glibc the
//! chunk (`malloc_usable_size` plus its 8-byte header; at least 32 bytes), elsewhere the bytes
//! asked for. The two differ most for small blocks: the fake keeps each load balancer's host
//! names, ten-byte strings in 32-byte chunks, so with 100 load balancers at 20,000 nodes the
//! plugin asks for 81.5 MiB and occupies 129.1 MiB (`bench_scale`). Subtracting only the bytes
//! asked for put those 48 MiB in the host's share.
//!
//! A `cdylib` has its own copy of std and so its own global allocator: everything the plugin
//! allocates is counted, and nothing the host allocates is (ABI-stable values are freed
//! through the vtable of the side that allocated them). Linked as an rlib into a test binary
//! the counters cover that whole binary instead; nothing there reads them.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// The system allocator, counted.
struct Counted;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static FOOTPRINT: AtomicUsize = AtomicUsize::new(0);
static FOOTPRINT_PEAK: AtomicUsize = AtomicUsize::new(0);

/// The allocator's footprint of the live block `p` of `size` bytes.
#[allow(unsafe_code)]
fn footprint(p: *mut u8, size: usize) -> usize {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: `p` is a live block from the system allocator (glibc's malloc family).
        let usable = unsafe { libc::malloc_usable_size(p.cast()) };
        let _ = size;
        usable + std::mem::size_of::<usize>()
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        let _ = p;
        size
    }
}

fn grew(p: *mut u8, by: usize) {
    let now = CURRENT.fetch_add(by, Relaxed) + by;
    PEAK.fetch_max(now, Relaxed);
    let chunk = footprint(p, by);
    let now = FOOTPRINT.fetch_add(chunk, Relaxed) + chunk;
    FOOTPRINT_PEAK.fetch_max(now, Relaxed);
}

/// Called while `p` is still live (before it is freed or moved).
fn shrank(p: *mut u8, by: usize) {
    CURRENT.fetch_sub(by, Relaxed);
    FOOTPRINT.fetch_sub(footprint(p, by), Relaxed);
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged; the
// counters only observe sizes.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counted {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is passed on unchanged.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(p, layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as above.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(p, layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        shrank(ptr, layout.size());
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) };
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // The old block's footprint is read while it is live; on failure it stays live and is
        // counted again.
        shrank(ptr, layout.size());
        // SAFETY: as above.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if p.is_null() {
            grew(ptr, layout.size());
        } else {
            grew(p, new_size);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counted = Counted;

/// Bytes the plugin has allocated and not freed.
pub fn current() -> usize {
    CURRENT.load(Relaxed)
}

/// The most bytes the plugin had allocated at once.
pub fn peak() -> usize {
    PEAK.load(Relaxed)
}

/// The allocator's footprint of the bytes the plugin has allocated and not freed (see the
/// module documentation).
pub fn footprint_current() -> usize {
    FOOTPRINT.load(Relaxed)
}

/// The most footprint at once.
pub fn footprint_peak() -> usize {
    FOOTPRINT_PEAK.load(Relaxed)
}
