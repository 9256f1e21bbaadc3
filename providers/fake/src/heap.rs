//! The fake's own heap, counted apart from its host's: the plugin's global allocator is the
//! system allocator with two counters (bytes allocated now, and the most ever). Benchmarks read
//! them (`heapFile`, see `docs/fake-provider.md`) to separate the provider's share from the host
//! process's resident memory: the fake's call log, cloud state and its SDK adapter's parsed
//! copies of the host lists live here, a real provider's live in its cloud.
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

fn grew(by: usize) {
    let now = CURRENT.fetch_add(by, Relaxed) + by;
    PEAK.fetch_max(now, Relaxed);
}

fn shrank(by: usize) {
    CURRENT.fetch_sub(by, Relaxed);
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged; the
// counters only observe sizes.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counted {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is passed on unchanged.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as above.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) };
        shrank(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as above.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            shrank(layout.size());
            grew(new_size);
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
