//! The fake's counting allocator (`ccm_provider_fake::heap`, the global allocator of any binary
//! linking the crate): the bytes asked for and the allocator's footprint of them, which
//! benchmarks subtract from the process's RSS to get the host's share. The only test in its
//! file, so no other test allocates meanwhile.

use ccm_provider_fake::heap;

#[test]
fn small_blocks_count_their_chunk_and_every_count_returns_on_free() {
    const BLOCKS: usize = 10_000;
    let mut kept: Vec<Box<[u8; 10]>> = Vec::with_capacity(BLOCKS);
    let (asked0, footprint0) = (heap::current(), heap::footprint_current());
    for i in 0..BLOCKS {
        kept.push(Box::new([i as u8; 10]));
    }
    let (asked1, footprint1) = (heap::current(), heap::footprint_current());
    assert_eq!(asked1 - asked0, BLOCKS * 10, "bytes asked for");
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    assert_eq!(
        footprint1 - footprint0,
        BLOCKS * 32,
        "glibc: a 10-byte block takes a 32-byte chunk"
    );
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    assert_eq!(footprint1 - footprint0, BLOCKS * 10);
    assert!(heap::footprint_peak() >= footprint1 && heap::peak() >= asked1);

    // A block grown in place or moved: counted once, at its new size.
    let mut grown: Vec<u8> = Vec::with_capacity(10);
    let (asked2, footprint2) = (heap::current(), heap::footprint_current());
    grown.reserve_exact(1_000);
    assert_eq!(heap::current() - asked2, 1_000 - 10);
    assert!(heap::footprint_current() - footprint2 >= 1_000 - 32);
    drop(grown);

    drop(kept);
    // The Vec's own buffer was allocated before the first reading.
    let buffer = BLOCKS * std::mem::size_of::<Box<[u8; 10]>>();
    assert_eq!(heap::current(), asked0 - buffer);
    assert!(footprint0 - heap::footprint_current() >= buffer);
}
