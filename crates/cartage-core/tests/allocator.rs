//! The caching allocator over a GPU-free mock device ([`MockSource`]): reuse, splitting and
//! merging, the two pools, statistics and peaks, `empty_cache`, out-of-memory reports (what they
//! name, fragmentation as the cause, recovery), a limit, and a property test of random
//! alloc/free sequences against the allocator's invariants.

use std::collections::HashMap;
use std::panic::Location;
use std::sync::Arc;

use cartage_core::allocator::testing::MockSource;
use cartage_core::raw::{Allocation, SegmentError, SegmentHandle, SegmentSource};
use cartage_core::{AllocatorConfig, CachingAllocator, Device, Error, MemoryInfo};
use proptest::prelude::*;

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

/// A [`MockSource`] shared between the allocator and the test, so the test can see the calls.
#[derive(Clone)]
struct Shared(Arc<MockSource>);

impl SegmentSource for Shared {
    fn allocate_segment(&self, bytes: usize) -> Result<SegmentHandle, SegmentError> {
        self.0.allocate_segment(bytes)
    }
    unsafe fn release_segment(&self, segment: SegmentHandle) {
        // SAFETY: forwarded with the caller's guarantee (the allocator releases each segment
        // of this source once, unused).
        unsafe { self.0.release_segment(segment) }
    }
    fn memory_info(&self) -> Option<MemoryInfo> {
        self.0.memory_info()
    }
}

fn allocator(capacity: usize) -> (CachingAllocator, Arc<MockSource>) {
    let source = Arc::new(MockSource::new(capacity));
    let alloc = CachingAllocator::new(
        Device::cuda(0),
        Box::new(Shared(source.clone())),
        AllocatorConfig::default(),
    );
    (alloc, source)
}

#[test]
fn freed_blocks_are_reused_from_the_cache() {
    let (alloc, source) = allocator(64 * MIB);
    let a = alloc.alloc(1000).unwrap();
    let (segment, offset) = (a.slice().segment(), a.slice().offset());
    assert_eq!(a.slice().len(), 1000);
    assert_eq!(a.requested(), 1000);
    alloc.free(a);
    let b = alloc.alloc(900).unwrap();
    assert_eq!(
        (b.slice().segment(), b.slice().offset()),
        (segment, offset),
        "the freed block is reused"
    );
    let s = alloc.stats();
    assert_eq!((s.cache_hits, s.cache_misses, s.segment_allocs), (1, 1, 1));
    assert_eq!(source.calls(), (1, 0), "no second segment was taken from the device");
    alloc.free(b);
}

#[test]
fn blocks_split_and_free_neighbours_merge() {
    let (alloc, _) = allocator(64 * MIB);
    let a = alloc.alloc(1000).unwrap();
    let b = alloc.alloc(1000).unwrap();
    let c = alloc.alloc(1000).unwrap();
    // One small segment, split into consecutive 1 KiB blocks.
    assert_eq!(alloc.stats().segments, 1);
    assert_eq!(
        [a.slice().offset(), b.slice().offset(), c.slice().offset()],
        [0, 1024, 2048]
    );
    let s = alloc.stats();
    assert_eq!(
        (s.active_blocks, s.inactive_blocks),
        (3, 1),
        "three blocks and the free rest"
    );
    alloc.free(b);
    assert_eq!(alloc.stats().inactive_blocks, 2, "B is a hole between A and C");
    alloc.free(a);
    let s = alloc.stats();
    assert_eq!(s.inactive_blocks, 2, "A merged with B into one block");
    // The merged block serves a 2 KiB request exactly where A was.
    let ab = alloc.alloc(2000).unwrap();
    assert_eq!(ab.slice().offset(), 0);
    alloc.free(ab);
    alloc.free(c);
    let s = alloc.stats();
    assert_eq!(
        (s.active_blocks, s.inactive_blocks),
        (0, 1),
        "everything merged back into one block"
    );
    assert_eq!(s.largest_free_block, 2 * MIB);
    assert_eq!(s.fragmentation(), 0.0);
}

#[test]
fn small_and_large_requests_use_separate_pools() {
    let (alloc, source) = allocator(256 * MIB);
    // The largest small requests: two fill one 2 MiB segment.
    let small = [alloc.alloc(MIB).unwrap(), alloc.alloc(MIB).unwrap()];
    assert_eq!(alloc.stats().reserved_bytes, 2 * MIB);
    let medium = alloc.alloc(MIB + 1).unwrap(); // large pool, a 20 MiB segment
    let medium_segment = medium.slice().segment();
    assert_eq!(alloc.stats().reserved_bytes, 22 * MIB);
    // ≥ 10 MiB and larger than the medium segment's rest: its own segment, rounded to 2 MiB.
    let large = alloc.alloc(25 * MIB).unwrap();
    assert_eq!(alloc.stats().reserved_bytes, 48 * MIB);
    assert_eq!(alloc.stats().segments, 3);
    alloc.free(medium);
    // A small request never takes a block of the large pool, even with 20 MiB free there.
    let misses = alloc.stats().cache_misses;
    let tiny = alloc.alloc(512).unwrap();
    assert_eq!(alloc.stats().cache_misses, misses + 1);
    assert_ne!(tiny.slice().segment(), medium_segment);
    // A large request reuses the large pool's free block.
    let again = alloc.alloc(5 * MIB).unwrap();
    assert_eq!(
        alloc.stats().cache_misses,
        misses + 1,
        "served from the cached 20 MiB segment"
    );
    assert_eq!(again.slice().segment(), medium_segment);
    assert_eq!(source.calls().0, 4);
    let [s1, s2] = small;
    for a in [s1, s2, large, tiny, again] {
        alloc.free(a);
    }
}

#[test]
fn statistics_track_allocated_reserved_peaks_and_counts() {
    let (alloc, _) = allocator(256 * MIB);
    let a = alloc.alloc(1000).unwrap();
    let b = alloc.alloc(3 * MIB).unwrap();
    let s = alloc.stats();
    assert_eq!(s.allocated_bytes, 1024 + 3 * MIB);
    assert_eq!(s.requested_bytes, 1000 + 3 * MIB);
    assert_eq!(s.reserved_bytes, 2 * MIB + 20 * MIB);
    assert_eq!(
        (s.peak_allocated_bytes, s.peak_reserved_bytes),
        (s.allocated_bytes, s.reserved_bytes)
    );
    assert_eq!((s.active_blocks, s.alloc_count, s.free_count), (2, 2, 0));
    assert_eq!(s.inactive_bytes, s.reserved_bytes - s.allocated_bytes);
    assert_eq!((s.segments, s.segment_allocs, s.segment_frees), (2, 2, 0));
    alloc.free(b);
    let s = alloc.stats();
    assert_eq!(s.allocated_bytes, 1024);
    assert_eq!(s.reserved_bytes, 22 * MIB, "freed memory stays reserved");
    assert_eq!(s.peak_allocated_bytes, 1024 + 3 * MIB, "the peak remembers");
    assert_eq!((s.free_count, s.active_blocks), (1, 1));
    alloc.reset_peaks();
    let s = alloc.stats();
    assert_eq!((s.peak_allocated_bytes, s.peak_reserved_bytes), (1024, 22 * MIB));
    alloc.free(a);
    assert_eq!(alloc.stats().allocated_bytes, 0);
    assert_eq!(alloc.stats().requested_bytes, 0);
}

#[test]
fn empty_cache_releases_only_wholly_free_segments() {
    let (alloc, source) = allocator(256 * MIB);
    let kept = alloc.alloc(1000).unwrap(); // keeps its small segment alive
    let freed = alloc.alloc(3 * MIB).unwrap();
    let partly = alloc.alloc(5 * MIB).unwrap(); // the same 20 MiB segment as `freed`
    alloc.free(freed);
    assert_eq!(alloc.empty_cache(), 0, "both segments still hold a live block");
    alloc.free(partly);
    let released = alloc.empty_cache();
    assert_eq!(released, 20 * MIB);
    let s = alloc.stats();
    assert_eq!((s.reserved_bytes, s.segments, s.segment_frees), (2 * MIB, 1, 1));
    assert_eq!(source.used(), 2 * MIB);
    assert_eq!(source.calls(), (2, 1));
    alloc.free(kept);
    assert_eq!(alloc.empty_cache(), 2 * MIB);
    assert_eq!(alloc.stats().reserved_bytes, 0);
    assert_eq!(source.used(), 0);
    assert_eq!(alloc.stats().empty_cache_count, 3);
}

#[test]
fn out_of_memory_names_sizes_and_the_largest_live_blocks() {
    let (alloc, _) = allocator(64 * MIB);
    let (big, big_line) = (alloc.alloc(40 * MIB).unwrap(), line!());
    let (small, small_line) = (alloc.alloc(1000).unwrap(), line!());
    let before = alloc.stats();
    let (err, err_line) = (alloc.alloc(30 * MIB).unwrap_err(), line!());
    let Error::OutOfMemory(report) = &err else {
        panic!("expected OutOfMemory, got {err:?}")
    };
    assert_eq!(report.requested, 30 * MIB);
    assert_eq!(report.capacity, Some(64 * MIB as u64));
    assert_eq!(report.free, Some(22 * MIB as u64));
    assert_eq!((report.allocated, report.reserved), (40 * MIB + 1024, 42 * MIB));
    assert!(!report.fragmentation_is_cause());
    let message = err.to_string();
    let file = Location::caller().file();
    for needle in [
        "out of memory on cuda:0".to_string(),
        "tried to allocate 30.00 MiB".to_string(),
        format!("at {file}:{err_line}:"),
        "64.00 MiB in total, 22.00 MiB free".to_string(),
        "42.00 MiB reserved".to_string(),
        "40.00 MiB allocated by live tensors".to_string(),
        "largest free block".to_string(),
        "Live tensors hold the memory".to_string(),
        format!("Largest live allocations: 40.00 MiB at {file}:{big_line}:"),
        format!("1.00 KiB at {file}:{small_line}:"),
    ] {
        assert!(message.contains(&needle), "missing `{needle}` in: {message}");
    }
    // Recovery: nothing changed but the OOM counter, and a request that fits succeeds.
    let after = alloc.stats();
    assert_eq!(after.oom_count, before.oom_count + 1);
    assert_eq!(
        (
            after.allocated_bytes,
            after.reserved_bytes,
            after.alloc_count,
            after.segments
        ),
        (
            before.allocated_bytes,
            before.reserved_bytes,
            before.alloc_count,
            before.segments
        )
    );
    let fits = alloc.alloc(10 * MIB).unwrap();
    assert_eq!(alloc.stats().allocated_bytes, before.allocated_bytes + 10 * MIB);
    for a in [big, small, fits] {
        alloc.free(a);
    }
    // After freeing, the 30 MiB request fits (the cache is emptied and retried).
    let retry = alloc.alloc(30 * MIB).unwrap();
    alloc.free(retry);
}

#[test]
fn a_request_beyond_capacity_says_so_and_overflow_is_an_error() {
    let (alloc, _) = allocator(64 * MIB);
    let message = alloc.alloc(100 * MIB).unwrap_err().to_string();
    assert!(message.contains("exceeds the device's capacity"), "{message}");
    for huge in [usize::MAX, usize::MAX - 100, 1 << 62] {
        match alloc.alloc(huge) {
            Err(Error::OutOfMemory(report)) => assert_eq!(report.requested, huge),
            other => panic!("alloc({huge}) gave {other:?}"),
        }
    }
    let s = alloc.stats();
    assert_eq!(s.oom_count, 4, "every out-of-memory error is counted");
    assert_eq!((s.alloc_count, s.allocated_bytes), (0, 0));
}

#[test]
fn fragmentation_is_reported_as_the_cause() {
    // Room for exactly two small segments.
    let (alloc, _) = allocator(4 * MIB);
    let blocks: Vec<Allocation> = (0..8).map(|_| alloc.alloc(512 * KIB).unwrap()).collect();
    assert_eq!(alloc.stats().segments, 2);
    let mut kept = Vec::new();
    for (i, block) in blocks.into_iter().enumerate() {
        if i % 2 == 0 {
            alloc.free(block);
        } else {
            kept.push(block);
        }
    }
    let s = alloc.stats();
    assert_eq!((s.inactive_bytes, s.largest_free_block), (2 * MIB, 512 * KIB));
    assert!((s.fragmentation() - 0.75).abs() < 1e-12, "{}", s.fragmentation());
    // 2 MiB are free, but no hole holds 1 MiB and the device has no room for a new segment.
    let err = alloc.alloc(MIB).unwrap_err();
    let Error::OutOfMemory(report) = &err else {
        panic!("expected OutOfMemory, got {err:?}")
    };
    assert!(report.fragmentation_is_cause());
    let message = err.to_string();
    assert!(message.contains("Fragmentation is the cause"), "{message}");
    assert!(message.contains("largest free block 512.00 KiB"), "{message}");
    // Freeing the neighbours merges the holes, and the request fits.
    for block in kept {
        alloc.free(block);
    }
    let fits = alloc.alloc(MIB).unwrap();
    assert_eq!(alloc.stats().segments, 2, "served from the merged cache");
    alloc.free(fits);
}

#[test]
fn a_limit_caps_reserved_memory() {
    let (alloc, _) = allocator(1 << 30);
    alloc.set_limit(Some(4 * MIB));
    assert_eq!(alloc.limit(), Some(4 * MIB));
    // Four 1 MiB blocks fill two 2 MiB segments: 4 MiB reserved, the limit.
    let mut blocks: Vec<Allocation> = (0..4).map(|_| alloc.alloc(MIB).unwrap()).collect();
    let err = alloc.alloc(MIB).unwrap_err();
    let message = err.to_string();
    assert!(message.contains("the allocator's limit is 4.00 MiB"), "{message}");
    assert!(matches!(&err, Error::OutOfMemory(r) if r.limit == Some(4 * MIB)));
    assert_eq!(alloc.stats().reserved_bytes, 4 * MIB);
    alloc.set_limit(None);
    blocks.push(alloc.alloc(MIB).unwrap());
    assert_eq!(alloc.stats().reserved_bytes, 6 * MIB);
    for x in blocks {
        alloc.free(x);
    }
}

/// One step of a random allocator workload.
#[derive(Clone, Debug)]
enum Step {
    Alloc(usize),
    Free(usize),
    EmptyCache,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (1usize..=4096).prop_map(Step::Alloc),
        2 => (4097usize..=2 * MIB).prop_map(Step::Alloc),
        1 => (2 * MIB..=12 * MIB).prop_map(Step::Alloc),
        5 => any::<usize>().prop_map(Step::Free),
        1 => Just(Step::EmptyCache),
    ]
}

/// The invariants that hold after every step.
fn check_invariants(alloc: &CachingAllocator, source: &MockSource, live: &[Allocation]) -> Result<(), TestCaseError> {
    let s = alloc.stats();
    let blocks = alloc.largest_live(usize::MAX);
    prop_assert_eq!(blocks.len(), live.len());
    prop_assert_eq!(s.active_blocks, live.len());
    prop_assert_eq!(s.allocated_bytes, blocks.iter().map(|b| b.bytes).sum::<usize>());
    prop_assert_eq!(s.requested_bytes, live.iter().map(Allocation::requested).sum::<usize>());
    prop_assert_eq!(s.reserved_bytes, source.used(), "reserved = the segments taken");
    prop_assert_eq!(s.reserved_bytes, s.allocated_bytes + s.inactive_bytes);
    prop_assert!(s.peak_allocated_bytes >= s.allocated_bytes && s.peak_reserved_bytes >= s.reserved_bytes);
    prop_assert!(s.largest_free_block <= s.inactive_bytes);
    // No two live blocks overlap.
    let mut by_segment: HashMap<u64, Vec<(usize, usize)>> = HashMap::new();
    for a in live {
        let slice = a.slice();
        by_segment
            .entry(slice.segment().id)
            .or_default()
            .push((slice.offset(), slice.offset() + slice.len().max(1)));
    }
    for ranges in by_segment.values_mut() {
        ranges.sort_unstable();
        for pair in ranges.windows(2) {
            prop_assert!(pair[0].1 <= pair[1].0, "overlapping blocks {:?}", pair);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn random_workloads_keep_the_invariants(steps in proptest::collection::vec(step(), 1..80)) {
        let (alloc, source) = allocator(48 * MIB);
        let mut live: Vec<Allocation> = Vec::new();
        for step in steps {
            match step {
                Step::Alloc(bytes) => {
                    let before = alloc.stats();
                    match alloc.alloc(bytes) {
                        Ok(a) => {
                            prop_assert!(a.slice().len() == bytes);
                            live.push(a);
                        }
                        Err(Error::OutOfMemory(report)) => {
                            let after = alloc.stats();
                            prop_assert_eq!(report.requested, bytes);
                            prop_assert_eq!(after.allocated_bytes, before.allocated_bytes);
                            prop_assert_eq!(after.oom_count, before.oom_count + 1);
                        }
                        Err(other) => prop_assert!(false, "unexpected error {}", other),
                    }
                }
                Step::Free(pick) if !live.is_empty() => {
                    let a = live.swap_remove(pick % live.len());
                    alloc.free(a);
                }
                Step::Free(_) => {}
                Step::EmptyCache => {
                    alloc.empty_cache();
                }
            }
            check_invariants(&alloc, &source, &live)?;
        }
        for a in live.drain(..) {
            alloc.free(a);
        }
        let s = alloc.stats();
        prop_assert_eq!((s.allocated_bytes, s.requested_bytes, s.active_blocks), (0, 0, 0));
        alloc.empty_cache();
        let s = alloc.stats();
        prop_assert_eq!((s.reserved_bytes, s.segments, source.used()), (0, 0, 0));
    }
}

/// A private pool (a captured graph's) keeps its blocks to itself while it lives: blocks freed
/// into it are reused only by allocations made while it is active, never by the shared cache,
/// and `empty_cache` leaves its segments alone. Released, its segments become shared cache.
#[test]
fn private_pools_keep_their_blocks_until_released() {
    let source = MockSource::new(256 << 20);
    let alloc = CachingAllocator::new(Device::cpu(), Box::new(source), AllocatorConfig::default());
    // A free block in the shared cache that the pool must not take.
    let shared = alloc.alloc(4096).unwrap();
    let shared_addr = shared.slice().addr();
    alloc.free(shared);

    let pool = alloc.begin_private_pool().unwrap();
    assert!(alloc.begin_private_pool().is_err(), "one capture at a time");
    let a = alloc.alloc(4096).unwrap();
    let a_addr = a.slice().addr();
    assert_ne!(a_addr, shared_addr, "the pool took a block of the shared cache");
    alloc.free(a);
    // Freed inside the capture: reused inside it.
    let b = alloc.alloc(4096).unwrap();
    assert_eq!(b.slice().addr(), a_addr);
    let big = alloc.alloc(8 << 20).unwrap();
    alloc.end_private_pool();
    let reserved_by_pool = alloc.private_pool_bytes(pool);
    assert!(reserved_by_pool >= (8 << 20) + 4096, "{reserved_by_pool}");

    // After the capture: the pool's freed blocks are not handed to anyone else.
    let b_addr = b.slice().addr();
    let big_addr = big.slice().addr();
    alloc.free(b);
    alloc.free(big);
    let outside = alloc.alloc(4096).unwrap();
    let outside_big = alloc.alloc(8 << 20).unwrap();
    assert_ne!(outside.slice().addr(), b_addr);
    assert_ne!(outside_big.slice().addr(), big_addr);
    alloc.free(outside);
    alloc.free(outside_big);
    // empty_cache frees shared segments only.
    alloc.empty_cache();
    assert_eq!(alloc.private_pool_bytes(pool), reserved_by_pool);
    assert_eq!(alloc.stats().reserved_bytes, reserved_by_pool);

    // Released: the segments are shared cache again, reused and freed like any other.
    alloc.release_private_pool(pool);
    assert_eq!(alloc.private_pool_bytes(pool), 0);
    let again = alloc.alloc(8 << 20).unwrap();
    assert_eq!(
        again.slice().addr(),
        big_addr,
        "the released segment serves the shared cache"
    );
    alloc.free(again);
    alloc.empty_cache();
    assert_eq!(alloc.stats().reserved_bytes, 0);
    assert_eq!(alloc.stats().allocated_bytes, 0);
}

/// A source that hands out segment id 0, reserved for imported memory, and counts releases.
struct ReservedIdSource(Arc<std::sync::atomic::AtomicUsize>);

impl SegmentSource for ReservedIdSource {
    fn allocate_segment(&self, _bytes: usize) -> Result<SegmentHandle, SegmentError> {
        Ok(SegmentHandle {
            id: cartage_core::raw::EXTERNAL_SEGMENT_ID,
            addr: 1 << 40,
        })
    }
    unsafe fn release_segment(&self, _segment: SegmentHandle) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
    fn memory_info(&self) -> Option<MemoryInfo> {
        None
    }
}

#[test]
fn a_segment_with_the_imported_memory_id_is_refused_and_released() {
    let released = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let alloc = CachingAllocator::new(
        Device::cpu(),
        Box::new(ReservedIdSource(Arc::clone(&released))),
        AllocatorConfig::default(),
    );
    let err = alloc.alloc(1000).unwrap_err();
    assert!(err.to_string().contains("reserved for imported memory"), "{err}");
    assert_eq!(released.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(alloc.stats().reserved_bytes, 0);
}
