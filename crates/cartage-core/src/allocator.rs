//! The caching allocator, written once for every backend (DESIGN "alloc"; LESSONS R20–R22).
//!
//! A backend supplies a [`SegmentSource`] — raw device allocations (`cuMemAlloc`,
//! `wgpu::Device::create_buffer`, aligned host memory). [`CachingAllocator`] carves blocks out of
//! those segments:
//! - requests round up to 512 bytes; up to 1 MiB they come from the *small pool* (2 MiB segments),
//!   larger ones from the *large pool* (20 MiB segments below 10 MiB, else rounded to 2 MiB);
//! - a free block is reused best-fit and split when the rest is worth keeping; a freed block
//!   merges with free neighbours of the same segment;
//! - freed memory stays *reserved* for reuse (reserved ≫ allocated is normal; allocated growing
//!   step after step is a leak) until [`CachingAllocator::empty_cache`] returns whole free
//!   segments to the device;
//! - running out of memory frees the cache and retries once, then returns
//!   [`crate::Error::OutOfMemory`] with an [`OomReport`] that says whether fragmentation is the cause.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};
use std::panic::Location;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::device::Device;
use crate::error::{Error, Result, Site};

/// A raw segment from a backend's [`SegmentSource`]: an id unique within that source and a
/// backend-defined address (a host pointer, a `CUdeviceptr`, or 0 where buffers are objects).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SegmentHandle {
    /// Unique id within the source.
    pub id: u64,
    /// Backend-defined base address.
    pub addr: u64,
}

/// A byte range inside a segment: what kernels and copies address.
///
/// Only the [`CachingAllocator`] makes one (for a block it hands out), and [`BufferSlice::slice`]
/// can only narrow it, so safe code cannot forge or stretch a slice. A slice is a plain value,
/// though: it can outlive its block. That is why every backend method that reaches memory
/// through a slice is an `unsafe fn` whose contract says the block is live; the sound path is
/// [`crate::DeviceBuffer`] and [`crate::Kernel::run`], which borrow the owners for the call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BufferSlice {
    /// The process-unique id of the [`CachingAllocator`] that handed the block out: segment ids
    /// are unique only within one source, so two allocators (two backends, two devices, a
    /// second allocator over a test source) can hand out equal segment ids. Comparing the
    /// allocator too makes a slice's identity unforgeable across them.
    allocator: u64,
    segment: SegmentHandle,
    offset: usize,
    len: usize,
}

impl BufferSlice {
    /// The segment the range lies in.
    #[inline]
    pub fn segment(&self) -> SegmentHandle {
        self.segment
    }

    /// Byte offset of the range in the segment.
    #[inline]
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Length of the range in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty range.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The backend address of the first byte (`segment.addr + offset`).
    #[inline]
    pub fn addr(&self) -> u64 {
        self.segment.addr + self.offset as u64
    }

    /// The process-unique id of the allocator that made the slice (each backend's caching
    /// allocator has its own): two slices with equal segment ids are the same memory only when
    /// their allocators are the same too.
    #[inline]
    pub fn allocator(&self) -> u64 {
        self.allocator
    }

    /// True when both slices lie in one segment of one allocator (the same memory object).
    #[inline]
    pub fn same_segment(&self, other: &BufferSlice) -> bool {
        self.allocator == other.allocator && self.segment.id == other.segment.id
    }

    /// True when `inner` lies inside this range (same allocator, same segment, bytes within).
    #[inline]
    pub fn contains(&self, inner: &BufferSlice) -> bool {
        self.same_segment(inner)
            && inner.offset >= self.offset
            && inner
                .offset
                .checked_add(inner.len)
                .is_some_and(|end| end <= self.offset + self.len)
    }

    /// The first `len` bytes of the range (`len` at most [`BufferSlice::len`]).
    pub fn prefix(&self, len: usize) -> Result<BufferSlice> {
        self.slice(0, len)
    }

    /// A sub-range, checked against this range.
    pub fn slice(&self, offset: usize, len: usize) -> Result<BufferSlice> {
        if offset.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(Error::invalid(
                "slice",
                format!(
                    "bytes {offset}..{} are outside a buffer of {} bytes",
                    offset.saturating_add(len),
                    self.len
                ),
            ));
        }
        Ok(BufferSlice {
            allocator: self.allocator,
            segment: self.segment,
            offset: self.offset + offset,
            len,
        })
    }
}

/// The segment id of memory the allocator did not allocate (imported through DLPack): one
/// segment per allocator spanning the whole address space, so an imported range's offset is its
/// address. Every imported range of one device is then in the same segment, and the aliasing and
/// overlap checks, which compare offsets within a segment, see two imports of the same memory
/// overlap. Sources never hand out this id (the allocator refuses a segment that has it).
pub const EXTERNAL_SEGMENT_ID: u64 = 0;

/// Why a [`SegmentSource`] could not allocate.
#[derive(Debug)]
pub enum SegmentError {
    /// The device has no room: the allocator frees its cache and retries, then reports OOM.
    OutOfMemory,
    /// Any other failure, passed through.
    Failed(Error),
}

/// Free and total memory of a device, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryInfo {
    /// Bytes the device could still hand out.
    pub free: u64,
    /// The device's capacity.
    pub total: u64,
}

/// Raw device memory for [`CachingAllocator`]; the only allocation code a backend writes.
pub trait SegmentSource: Send + Sync {
    /// Allocate a segment of exactly `bytes` bytes. Its id is never [`EXTERNAL_SEGMENT_ID`] (0),
    /// which names imported memory.
    fn allocate_segment(&self, bytes: usize) -> std::result::Result<SegmentHandle, SegmentError>;
    /// Return a segment. The allocator calls this only when no block of it is in use.
    ///
    /// # Safety
    /// `segment` was returned by this source's [`SegmentSource::allocate_segment`], has not been
    /// released yet, and no live block, slice in use or queued device work refers to it.
    unsafe fn release_segment(&self, segment: SegmentHandle);
    /// Free and total device memory, where the device can tell.
    fn memory_info(&self) -> Option<MemoryInfo>;
}

/// Tuning of the allocator (the defaults follow PyTorch's CUDA caching allocator).
#[derive(Clone, Copy, Debug)]
pub struct AllocatorConfig {
    /// Every block is a multiple of this (and segments are aligned to it by the backend).
    pub round: usize,
    /// Requests up to this many bytes use the small pool.
    pub small_limit: usize,
    /// Segment size of the small pool.
    pub small_segment: usize,
    /// Requests below this use a `medium_segment`-byte segment in the large pool.
    pub medium_limit: usize,
    /// Segment size for medium requests.
    pub medium_segment: usize,
    /// Large segments are rounded up to a multiple of this.
    pub large_round: usize,
    /// A cap on reserved bytes (`None`: the device's own capacity is the only limit).
    pub limit: Option<usize>,
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        AllocatorConfig {
            round: 512,
            small_limit: 1 << 20,
            small_segment: 2 << 20,
            medium_limit: 10 << 20,
            medium_segment: 20 << 20,
            large_round: 2 << 20,
            limit: None,
        }
    }
}

impl AllocatorConfig {
    /// Check that the allocator can work with these values: `round` and `large_round` are
    /// powers of two (blocks stay aligned), `large_round` is at least `round`, and each pool's
    /// segment holds the largest request the pool serves (`small_segment ≥ small_limit`,
    /// `medium_segment ≥ medium_limit`). The error names the field and the value to use.
    pub fn validate(&self) -> Result<()> {
        let bad = |field: &str, reason: String| Err(Error::invalid("AllocatorConfig", format!("`{field}`: {reason}")));
        if !self.round.is_power_of_two() {
            return bad(
                "round",
                format!(
                    "{} is not a power of two (blocks are aligned to it; the default is 512)",
                    self.round
                ),
            );
        }
        if !self.large_round.is_power_of_two() || self.large_round < self.round {
            return bad(
                "large_round",
                format!(
                    "{} must be a power of two of at least `round` ({}); the default is 2 MiB",
                    self.large_round, self.round
                ),
            );
        }
        if self.small_segment < self.small_limit {
            return bad(
                "small_segment",
                format!(
                    "{} is smaller than `small_limit` ({}): a small request would not fit its segment",
                    self.small_segment, self.small_limit
                ),
            );
        }
        if self.medium_segment < self.medium_limit {
            return bad(
                "medium_segment",
                format!(
                    "{} is smaller than `medium_limit` ({}): a medium request would not fit its segment",
                    self.medium_segment, self.medium_limit
                ),
            );
        }
        Ok(())
    }

    /// The nearest configuration that passes [`AllocatorConfig::validate`]: `round` and
    /// `large_round` rounded up to powers of two (0, or a value with no power of two above it,
    /// becomes the default), `large_round` raised to `round`, each segment size raised to its
    /// pool's limit. A valid configuration is returned unchanged.
    ///
    /// ```
    /// use cartage_core::allocator::testing::MockSource;
    /// use cartage_core::{AllocatorConfig, CachingAllocator, Device};
    /// let bad = AllocatorConfig { round: 0, large_round: 3, small_segment: 1, medium_segment: 0, ..Default::default() };
    /// assert!(bad.validate().unwrap_err().to_string().contains("`round`"));
    /// let fixed = bad.sanitized();
    /// assert!(fixed.validate().is_ok());
    /// assert_eq!((fixed.round, fixed.large_round), (512, 512));
    /// let source = || Box::new(MockSource::new(256 << 20));
    /// assert!(CachingAllocator::try_new(Device::cpu(), source(), bad).is_err());
    /// // `new` takes any value: it allocates with the sanitised configuration instead of panicking.
    /// let alloc = CachingAllocator::new(Device::cpu(), source(), bad);
    /// for bytes in [0, 1, 1 << 20, (5 << 20) + 3, 64 << 20, usize::MAX] {
    ///     if let Ok(block) = alloc.alloc(bytes) {
    ///         alloc.free(block);
    ///     }
    /// }
    /// assert!(alloc.alloc(usize::MAX).is_err());
    /// alloc.set_limit(Some(0));
    /// assert!(alloc.alloc(1 << 30).is_err());
    /// ```
    pub fn sanitized(self) -> AllocatorConfig {
        let defaults = AllocatorConfig::default();
        let power = |v: usize, default: usize| match v {
            0 => default,
            v => v.checked_next_power_of_two().unwrap_or(default),
        };
        let round = power(self.round, defaults.round);
        let large_round = power(self.large_round, defaults.large_round).max(round);
        AllocatorConfig {
            round,
            large_round,
            small_segment: self.small_segment.max(self.small_limit),
            medium_segment: self.medium_segment.max(self.medium_limit),
            ..self
        }
    }
}

/// A block handed out by [`CachingAllocator::alloc`]; give it back with
/// [`CachingAllocator::free`]. It is deliberately not `Clone`.
#[derive(Debug)]
pub struct Allocation {
    slice: BufferSlice,
    requested: usize,
    /// The [`CachingAllocator`] that made it: freeing it anywhere else is refused.
    owner: u64,
}

impl Allocation {
    /// The block's bytes (the block may be larger than requested; see [`Allocation::requested`]).
    pub fn slice(&self) -> BufferSlice {
        self.slice
    }

    /// The bytes asked for.
    pub fn requested(&self) -> usize {
        self.requested
    }
}

/// Counters every backend reports the same way (R20).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes in blocks held by live allocations.
    pub allocated_bytes: usize,
    /// Bytes the caller asked for in live allocations (≤ allocated: rounding).
    pub requested_bytes: usize,
    /// Bytes in segments taken from the device (allocated + cached free).
    pub reserved_bytes: usize,
    /// Highest `allocated_bytes` since creation or [`CachingAllocator::reset_peaks`].
    pub peak_allocated_bytes: usize,
    /// Highest `reserved_bytes` since creation or the last reset.
    pub peak_reserved_bytes: usize,
    /// Live blocks.
    pub active_blocks: usize,
    /// Cached free blocks.
    pub inactive_blocks: usize,
    /// Bytes in cached free blocks.
    pub inactive_bytes: usize,
    /// The largest cached free block.
    pub largest_free_block: usize,
    /// Segments held.
    pub segments: usize,
    /// Allocations served.
    pub alloc_count: u64,
    /// Blocks returned.
    pub free_count: u64,
    /// Allocations served from the cache.
    pub cache_hits: u64,
    /// Allocations that needed a new segment.
    pub cache_misses: u64,
    /// Segments taken from the device.
    pub segment_allocs: u64,
    /// Segments returned to the device.
    pub segment_frees: u64,
    /// Out-of-memory errors raised.
    pub oom_count: u64,
    /// Calls of `empty_cache` (explicit or on the way to an OOM).
    pub empty_cache_count: u64,
}

impl MemoryStats {
    /// 1 − largest free block / free bytes in the cache: 0 when the free memory is one block,
    /// near 1 when it is scattered in small holes (R22).
    pub fn fragmentation(&self) -> f64 {
        if self.inactive_bytes == 0 {
            0.0
        } else {
            1.0 - self.largest_free_block as f64 / self.inactive_bytes as f64
        }
    }
}

/// A live block, for out-of-memory reports and memory summaries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveBlock {
    /// Block bytes.
    pub bytes: usize,
    /// Where it was allocated (the tensor's creation site).
    pub site: Site,
}

/// Everything an out-of-memory error reports (R22, R28).
#[derive(Clone, Debug)]
pub struct OomReport {
    /// The device.
    pub device: Device,
    /// Bytes asked for.
    pub requested: usize,
    /// Where the failing allocation was asked for (the tensor's creation site), where known.
    pub requested_at: Option<Site>,
    /// Device capacity, where known.
    pub capacity: Option<u64>,
    /// Device free memory when the error was raised, where known.
    pub free: Option<u64>,
    /// A user-set cap on reserved memory, if any.
    pub limit: Option<usize>,
    /// Bytes held by live blocks.
    pub allocated: usize,
    /// Bytes held in segments.
    pub reserved: usize,
    /// The largest cached free block.
    pub largest_free_block: usize,
    /// The largest live blocks with their creation sites, largest first.
    pub largest_live: Vec<LiveBlock>,
}

impl OomReport {
    /// True when the cache held enough free bytes in total but no block large enough.
    pub fn fragmentation_is_cause(&self) -> bool {
        self.reserved.saturating_sub(self.allocated) >= self.requested && self.largest_free_block < self.requested
    }
}

/// `1.50 GiB`-style byte counts.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.2} {}", UNITS[unit])
    }
}

impl fmt::Display for OomReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = |n: usize| format_bytes(n as u64);
        write!(
            f,
            "out of memory on {}: tried to allocate {}",
            self.device,
            b(self.requested)
        )?;
        if let Some(site) = self.requested_at {
            write!(f, " at {site}")?;
        }
        match (self.capacity, self.free) {
            (Some(cap), Some(free)) => write!(
                f,
                "; the device has {} in total, {} free",
                format_bytes(cap),
                format_bytes(free)
            )?,
            (Some(cap), None) => write!(f, "; the device has {} in total", format_bytes(cap))?,
            _ => {}
        }
        if let Some(limit) = self.limit {
            write!(f, "; the allocator's limit is {}", b(limit))?;
        }
        write!(
            f,
            ". cartage holds {} reserved, of which {} allocated by live tensors and {} cached free (largest free block {}). ",
            b(self.reserved),
            b(self.allocated),
            b(self.reserved.saturating_sub(self.allocated)),
            b(self.largest_free_block)
        )?;
        // With nothing allocated, no tensor holds the memory and no hole fragments it: the
        // limit alone refused the segment the request needs.
        if let Some(limit) = self.limit.filter(|_| self.allocated == 0) {
            write!(
                f,
                "The allocator's limit of {} is the cause: nothing is allocated, yet the request (rounded up to a \
                 whole segment of its pool{}) does not fit under it. Raise or remove the limit \
                 (`allocator().set_limit(..)`), or make the request smaller. ",
                b(limit),
                if self.reserved > 0 {
                    format!(", next to {} of cached free segments", b(self.reserved))
                } else {
                    String::new()
                }
            )?;
        } else if self.fragmentation_is_cause() {
            write!(
                f,
                "Fragmentation is the cause: enough memory is free in total but scattered in blocks smaller than the request. \
                 Allocate long-lived large tensors first, or call empty_cache() between phases. "
            )?;
        } else if self.requested as u64 > self.capacity.unwrap_or(u64::MAX) {
            write!(
                f,
                "The request alone exceeds the device's capacity: check the shape and dtype that produced it (bytes = numel × dtype size). "
            )?;
        } else {
            write!(
                f,
                "Live tensors hold the memory: drop what you no longer need, lower the batch size, or use a 16-bit dtype. "
            )?;
        }
        if !self.largest_live.is_empty() {
            write!(f, "Largest live allocations:")?;
            for block in &self.largest_live {
                write!(f, " {} at {};", b(block.bytes), block.site)?;
            }
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Pool {
    Small = 0,
    Large = 1,
}

#[derive(Debug)]
struct Block {
    size: usize,
    live: Option<(usize, Site)>,
}

#[derive(Debug)]
struct Segment {
    handle: SegmentHandle,
    size: usize,
    pool: Pool,
    /// The private pool (a captured graph's) that owns the segment, or `None` for the shared
    /// cache.
    owner: Option<u64>,
    blocks: BTreeMap<usize, Block>,
}

/// Free blocks per size class, ordered by (size, segment id, offset) for best fit.
type FreeSets = [BTreeSet<(usize, u64, usize)>; 2];

/// A private pool: segments that only its owner (a captured graph) allocates from, so that no
/// other tensor is ever placed in memory a graph replay writes.
#[derive(Debug, Default)]
struct PrivatePool {
    id: u64,
    free: FreeSets,
}

/// The free sets of `owner` (the shared cache for `None`) for `pool`.
fn free_set<'a>(
    shared: &'a mut FreeSets,
    private: &'a mut [PrivatePool],
    owner: Option<u64>,
    pool: Pool,
) -> &'a mut BTreeSet<(usize, u64, usize)> {
    let sets = match owner {
        None => shared,
        Some(id) => match private.iter_mut().position(|p| p.id == id) {
            Some(i) => &mut private[i].free,
            // Unreachable: a segment's owner is cleared when its pool is released.
            None => shared,
        },
    };
    &mut sets[pool as usize]
}

/// Hashes segment ids (small unique integers) with one multiply: the allocator looks segments
/// up on every alloc and free, where SipHash would cost more than the rest of the lookup.
#[derive(Default)]
struct SegmentIdHasher(u64);

impl Hasher for SegmentIdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u64(&mut self, id: u64) {
        self.0 = id.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

#[derive(Default)]
struct State {
    segments: HashMap<u64, Segment, BuildHasherDefault<SegmentIdHasher>>,
    /// Free blocks of the shared cache per pool, ordered by (size, segment id, offset).
    free: FreeSets,
    /// Private pools, each owned by one captured graph.
    private: Vec<PrivatePool>,
    /// The private pool new allocations come from while a capture runs.
    capture: Option<u64>,
    stats: MemoryStats,
}

/// The caching allocator every backend uses; see the module docs.
///
/// ```
/// use cartage_core::allocator::testing::MockSource;
/// use cartage_core::{CachingAllocator, Device};
/// let alloc = CachingAllocator::new(Device::cpu(), Box::new(MockSource::new(64 << 20)), Default::default());
/// let a = alloc.alloc(1000).unwrap();
/// assert_eq!(alloc.stats().allocated_bytes, 1024);
/// alloc.free(a);
/// let b = alloc.alloc(900).unwrap(); // served from the cache
/// assert_eq!(alloc.stats().cache_hits, 1);
/// alloc.free(b);
/// alloc.empty_cache();
/// assert_eq!(alloc.stats().reserved_bytes, 0);
/// ```
pub struct CachingAllocator {
    device: Device,
    source: Box<dyn SegmentSource>,
    /// The configuration; its `limit` field is ignored in favour of `limit` below.
    config: AllocatorConfig,
    /// The cap on reserved bytes (`usize::MAX`: none), atomic so that `alloc` takes one lock.
    limit: AtomicUsize,
    state: Mutex<State>,
    /// Unique in the process: ties each [`Allocation`] to the allocator that made it.
    id: u64,
}

/// Source of [`CachingAllocator`] ids.
static NEXT_ALLOCATOR_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl fmt::Debug for CachingAllocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachingAllocator")
            .field("device", &self.device)
            .field("stats", &self.stats())
            .finish()
    }
}

fn round_up(n: usize, to: usize) -> Option<usize> {
    n.checked_add(to - 1).map(|v| v / to * to)
}

impl CachingAllocator {
    /// An allocator for `device` over `source`. A `config` that fails
    /// [`AllocatorConfig::validate`] is replaced by [`AllocatorConfig::sanitized`] (with a
    /// warning), so no value makes the allocator panic; [`CachingAllocator::try_new`] refuses it
    /// instead.
    pub fn new(device: Device, source: Box<dyn SegmentSource>, config: AllocatorConfig) -> Self {
        let config = match config.validate() {
            Ok(()) => config,
            Err(problem) => {
                let sanitized = config.sanitized();
                tracing::warn!(%device, %problem, ?sanitized, "allocator configuration adjusted");
                sanitized
            }
        };
        Self::with_valid_config(device, source, config)
    }

    /// An allocator for `device` over `source`, or [`Error::InvalidArgument`] naming the field
    /// of `config` that fails [`AllocatorConfig::validate`].
    pub fn try_new(device: Device, source: Box<dyn SegmentSource>, config: AllocatorConfig) -> Result<Self> {
        config.validate()?;
        Ok(Self::with_valid_config(device, source, config))
    }

    fn with_valid_config(device: Device, source: Box<dyn SegmentSource>, config: AllocatorConfig) -> Self {
        CachingAllocator {
            device,
            source,
            config,
            limit: AtomicUsize::new(config.limit.unwrap_or(usize::MAX)),
            state: Mutex::new(State::default()),
            id: NEXT_ALLOCATOR_ID.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// The process-unique id this allocator stamps on its slices ([`BufferSlice::allocator`]):
    /// a backend compares it to refuse a slice of another allocator whose segment id collides.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The device this allocator serves.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The segment source underneath.
    pub fn source(&self) -> &dyn SegmentSource {
        self.source.as_ref()
    }

    /// Cap reserved memory at `limit` bytes (`None`, or `Some(usize::MAX)`, removes the cap).
    /// Any value is accepted: a cap below the memory already reserved makes the next request
    /// that needs a new segment fail with an out-of-memory report naming the limit.
    pub fn set_limit(&self, limit: Option<usize>) {
        self.limit.store(limit.unwrap_or(usize::MAX), Ordering::Relaxed);
    }

    /// The cap on reserved memory set by [`CachingAllocator::set_limit`], if any.
    pub fn limit(&self) -> Option<usize> {
        Some(self.limit.load(Ordering::Relaxed)).filter(|&l| l != usize::MAX)
    }

    /// The configuration in effect, with the current limit.
    fn current_config(&self) -> AllocatorConfig {
        AllocatorConfig {
            limit: self.limit(),
            ..self.config
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Allocate at least `bytes` bytes, recording the caller as the creation site.
    #[track_caller]
    pub fn alloc(&self, bytes: usize) -> Result<Allocation> {
        self.alloc_at(bytes, Location::caller())
    }

    /// Allocate at least `bytes` bytes, recording `site` as the creation site.
    pub fn alloc_at(&self, bytes: usize, site: Site) -> Result<Allocation> {
        let config = self.current_config();
        let rounded = round_up(bytes.max(1), config.round).ok_or_else(|| self.oom_unlocked(bytes, site, &config))?;
        let pool = if rounded <= config.small_limit {
            Pool::Small
        } else {
            Pool::Large
        };
        let mut state = self.lock();
        state.stats.alloc_count += 1;
        if let Some(mut slice) = Self::take_free(&mut state, pool, rounded, bytes, site, &config) {
            slice.allocator = self.id;
            state.stats.cache_hits += 1;
            return Ok(Allocation {
                slice,
                requested: bytes,
                owner: self.id,
            });
        }
        let segment_size = match pool {
            Pool::Small => config.small_segment,
            Pool::Large if rounded < config.medium_limit => config.medium_segment,
            Pool::Large => match round_up(rounded, config.large_round) {
                Some(size) => size,
                // The state is locked here: build the report from it (never lock twice).
                None => {
                    state.stats.alloc_count -= 1;
                    state.stats.oom_count += 1;
                    return Err(Error::OutOfMemory(Box::new(self.report(
                        &state,
                        bytes,
                        Some(site),
                        &config,
                    ))));
                }
            },
        };
        let handle = match self.new_segment(&mut state, segment_size, &config) {
            Ok(h) => h,
            Err(SegmentError::OutOfMemory) => {
                self.release_free_segments(&mut state);
                match self.new_segment(&mut state, segment_size, &config) {
                    Ok(h) => h,
                    Err(SegmentError::OutOfMemory) => {
                        state.stats.oom_count += 1;
                        state.stats.alloc_count -= 1;
                        let report = self.report(&state, bytes, Some(site), &config);
                        tracing::warn!(device = %self.device, requested = bytes, "out of memory");
                        return Err(Error::OutOfMemory(Box::new(report)));
                    }
                    Err(SegmentError::Failed(e)) => {
                        state.stats.alloc_count -= 1;
                        return Err(e);
                    }
                }
            }
            Err(SegmentError::Failed(e)) => {
                state.stats.alloc_count -= 1;
                return Err(e);
            }
        };
        state.stats.cache_misses += 1;
        let mut blocks = BTreeMap::new();
        blocks.insert(
            0,
            Block {
                size: segment_size,
                live: None,
            },
        );
        let owner = state.capture;
        state.segments.insert(
            handle.id,
            Segment {
                handle,
                size: segment_size,
                pool,
                owner,
                blocks,
            },
        );
        let st = &mut *state;
        free_set(&mut st.free, &mut st.private, owner, pool).insert((segment_size, handle.id, 0));
        state.stats.inactive_blocks += 1;
        state.stats.inactive_bytes += segment_size;
        let mut slice = Self::take_free(&mut state, pool, rounded, bytes, site, &config)
            .expect("a fresh segment always fits the request it was sized for");
        slice.allocator = self.id;
        Ok(Allocation {
            slice,
            requested: bytes,
            owner: self.id,
        })
    }

    fn new_segment(
        &self,
        state: &mut State,
        size: usize,
        config: &AllocatorConfig,
    ) -> std::result::Result<SegmentHandle, SegmentError> {
        if let Some(limit) = config.limit
            && state.stats.reserved_bytes.saturating_add(size) > limit
        {
            return Err(SegmentError::OutOfMemory);
        }
        let handle = self.source.allocate_segment(size)?;
        if handle.id == EXTERNAL_SEGMENT_ID {
            // SAFETY: the segment was just returned by this source and nothing refers to it.
            unsafe { self.source.release_segment(handle) };
            return Err(SegmentError::Failed(Error::invalid(
                "allocate_segment",
                format!("the segment source returned id {EXTERNAL_SEGMENT_ID}, which is reserved for imported memory"),
            )));
        }
        state.stats.reserved_bytes += size;
        state.stats.segments += 1;
        state.stats.segment_allocs += 1;
        state.stats.peak_reserved_bytes = state.stats.peak_reserved_bytes.max(state.stats.reserved_bytes);
        Ok(handle)
    }

    fn take_free(
        state: &mut State,
        pool: Pool,
        rounded: usize,
        requested: usize,
        site: Site,
        config: &AllocatorConfig,
    ) -> Option<BufferSlice> {
        let owner = state.capture;
        let set = free_set(&mut state.free, &mut state.private, owner, pool);
        let &(size, seg_id, offset) = set.range((rounded, 0, 0)..).next()?;
        set.remove(&(size, seg_id, offset));
        let segment = state.segments.get_mut(&seg_id)?;
        let remainder = size - rounded;
        let split = match pool {
            Pool::Small => remainder >= config.round,
            Pool::Large => remainder > config.small_limit,
        };
        let block_size = if split { rounded } else { size };
        let block = segment.blocks.get_mut(&offset)?;
        block.size = block_size;
        block.live = Some((requested, site));
        let handle = segment.handle;
        if split {
            segment.blocks.insert(
                offset + rounded,
                Block {
                    size: remainder,
                    live: None,
                },
            );
            free_set(&mut state.free, &mut state.private, owner, pool).insert((remainder, seg_id, offset + rounded));
        } else {
            state.stats.inactive_blocks -= 1;
        }
        let s = &mut state.stats;
        s.inactive_bytes -= block_size;
        s.allocated_bytes += block_size;
        s.requested_bytes += requested;
        s.active_blocks += 1;
        s.peak_allocated_bytes = s.peak_allocated_bytes.max(s.allocated_bytes);
        Some(BufferSlice {
            // Set by the caller (`take_free` has no `self`), before the slice leaves the allocator.
            allocator: 0,
            segment: handle,
            offset,
            len: requested,
        })
    }

    /// Return a block to the cache (merging with free neighbours). The memory stays reserved.
    /// An allocation made by another allocator is refused (logged and leaked), never freed here.
    pub fn free(&self, allocation: Allocation) {
        if allocation.owner != self.id {
            tracing::error!(device = %self.device, "free of an allocation made by another allocator (ignored)");
            return;
        }
        let slice = allocation.slice;
        let mut state = self.lock();
        let state = &mut *state;
        let Some(segment) = state.segments.get_mut(&slice.segment.id) else {
            tracing::error!(device = %self.device, segment = slice.segment.id, "free of a block from an unknown segment (ignored)");
            return;
        };
        let (pool, owner) = (segment.pool, segment.owner);
        let Some(block) = segment.blocks.get_mut(&slice.offset).filter(|b| b.live.is_some()) else {
            tracing::error!(device = %self.device, offset = slice.offset, "free of a block that is not live (ignored)");
            return;
        };
        let (requested, _) = block.live.take().unwrap_or((0, Location::caller()));
        let mut offset = slice.offset;
        let mut size = block.size;
        state.stats.allocated_bytes -= size;
        state.stats.requested_bytes -= requested;
        state.stats.active_blocks -= 1;
        state.stats.free_count += 1;
        state.stats.inactive_bytes += size;
        // Merge with the following block.
        if let Some((&next_off, next)) = segment.blocks.range(offset + size..).next()
            && next_off == offset + size
            && next.live.is_none()
        {
            let next_size = next.size;
            free_set(&mut state.free, &mut state.private, owner, pool).remove(&(
                next_size,
                segment.handle.id,
                next_off,
            ));
            segment.blocks.remove(&next_off);
            size += next_size;
            state.stats.inactive_blocks -= 1;
        }
        // Merge with the preceding block.
        if let Some((&prev_off, prev)) = segment.blocks.range(..offset).next_back()
            && prev_off + prev.size == offset
            && prev.live.is_none()
        {
            let prev_size = prev.size;
            free_set(&mut state.free, &mut state.private, owner, pool).remove(&(
                prev_size,
                segment.handle.id,
                prev_off,
            ));
            segment.blocks.remove(&offset);
            offset = prev_off;
            size += prev_size;
            state.stats.inactive_blocks -= 1;
        }
        if let Some(block) = segment.blocks.get_mut(&offset) {
            block.size = size;
        }
        free_set(&mut state.free, &mut state.private, owner, pool).insert((size, segment.handle.id, offset));
        state.stats.inactive_blocks += 1;
    }

    fn release_free_segments(&self, state: &mut State) -> usize {
        state.stats.empty_cache_count += 1;
        let empty: Vec<u64> = state
            .segments
            .values()
            .filter(|s| s.owner.is_none() && s.blocks.len() == 1 && s.blocks.values().all(|b| b.live.is_none()))
            .map(|s| s.handle.id)
            .collect();
        let mut released = 0;
        for id in empty {
            if let Some(segment) = state.segments.remove(&id) {
                state.free[segment.pool as usize].remove(&(segment.size, id, 0));
                // SAFETY: the segment came from this source, was just removed from the table
                // (released once), and its only block is free: no allocation refers to it.
                unsafe { self.source.release_segment(segment.handle) };
                released += segment.size;
                state.stats.reserved_bytes -= segment.size;
                state.stats.inactive_bytes -= segment.size;
                state.stats.inactive_blocks -= 1;
                state.stats.segments -= 1;
                state.stats.segment_frees += 1;
            }
        }
        released
    }

    /// Return every wholly free segment to the device; returns the bytes released. Blocks in use
    /// and partly used segments stay: `empty_cache` only frees what is cached and free (R21).
    pub fn empty_cache(&self) -> usize {
        let mut state = self.lock();
        let released = self.release_free_segments(&mut state);
        tracing::debug!(device = %self.device, released, "empty_cache");
        released
    }

    /// A slice naming `len` bytes at `addr` that this allocator did not hand out (memory
    /// imported through DLPack); the caller ([`crate::DeviceBuffer::import_external`]) owns the
    /// memory and keeps it alive. The slice is never freed here and is not counted in the
    /// statistics.
    ///
    /// - A range inside a block of one of this allocator's segments (cartage memory that went
    ///   out through DLPack and comes back as another framework's view) is a slice of that
    ///   segment, so the overlap checks see it alias the tensors there. The block must be live:
    ///   a range in a free block or across a segment's end is refused (a dangling pointer).
    /// - Any other range is a slice of [`EXTERNAL_SEGMENT_ID`] whose offset is its address.
    pub(crate) fn external_slice(&self, addr: u64, len: usize) -> Result<BufferSlice> {
        let bad = |reason: String| Err(Error::invalid("import_external", reason));
        let Some(end) = usize::try_from(addr).ok().and_then(|a| a.checked_add(len)) else {
            return bad(format!(
                "{len} bytes at address {addr:#x} run past the end of the address space"
            ));
        };
        let start = addr as usize;
        let state = self.lock();
        for segment in state.segments.values() {
            let base = segment.handle.addr as usize;
            let seg_end = base + segment.size;
            // Sources whose addresses are not pointers (wgpu) use 0; nothing overlaps those.
            if segment.handle.addr == 0 || end <= base || start >= seg_end || (len == 0 && start == seg_end) {
                continue;
            }
            let offset = start - base.min(start);
            let inside_block = start >= base
                && segment
                    .blocks
                    .range(..=offset)
                    .next_back()
                    .is_some_and(|(&at, b)| b.live.is_some() && end - base <= at + b.size);
            if !inside_block {
                return bad(format!(
                    "{len} bytes at {addr:#x} overlap memory of {} that no live tensor holds wholly; the \
                     producer passed a dangling or stretched pointer",
                    self.device
                ));
            }
            return Ok(BufferSlice {
                allocator: self.id,
                segment: segment.handle,
                offset,
                len,
            });
        }
        Ok(BufferSlice {
            allocator: self.id,
            segment: SegmentHandle {
                id: EXTERNAL_SEGMENT_ID,
                addr: 0,
            },
            offset: start,
            len,
        })
    }

    /// Serve every allocation from now on from a new private pool, until
    /// [`CachingAllocator::end_private_pool`]; returns its id. A CUDA graph capture uses it: the
    /// blocks a graph's kernels read and write stay the graph's, even once their tensors are
    /// dropped, so no other tensor is placed where a replay writes. Fails while another private
    /// pool is active.
    ///
    /// ```
    /// use cartage_core::allocator::testing::MockSource;
    /// use cartage_core::{CachingAllocator, Device};
    /// let alloc = CachingAllocator::new(Device::cpu(), Box::new(MockSource::new(64 << 20)), Default::default());
    /// let pool = alloc.begin_private_pool().unwrap();
    /// let inside = alloc.alloc(1000).unwrap();
    /// alloc.end_private_pool();
    /// let addr = inside.slice().addr();
    /// alloc.free(inside); // back to the private pool, not to the shared cache
    /// let outside = alloc.alloc(1000).unwrap();
    /// assert_ne!(outside.slice().addr(), addr);
    /// alloc.free(outside);
    /// alloc.release_private_pool(pool); // the graph is gone: its memory is shared again
    /// assert_eq!(alloc.private_pool_bytes(pool), 0);
    /// ```
    pub fn begin_private_pool(&self) -> Result<u64> {
        static NEXT_POOL: AtomicUsize = AtomicUsize::new(1);
        let mut state = self.lock();
        if let Some(active) = state.capture {
            return Err(Error::invalid(
                "begin_private_pool",
                format!(
                    "private pool {active} of {} is still active: one capture at a time per device",
                    self.device
                ),
            ));
        }
        let id = NEXT_POOL.fetch_add(1, Ordering::Relaxed) as u64;
        state.private.push(PrivatePool {
            id,
            ..Default::default()
        });
        state.capture = Some(id);
        Ok(id)
    }

    /// Stop serving allocations from the active private pool; its blocks stay reserved for it.
    pub fn end_private_pool(&self) {
        self.lock().capture = None;
    }

    /// Hand the private pool `id`'s segments back to the shared cache (its graph is gone).
    /// Blocks still live there (a graph's output a caller still holds) are freed to the shared
    /// cache as usual.
    pub fn release_private_pool(&self, id: u64) {
        let mut state = self.lock();
        let state = &mut *state;
        if state.capture == Some(id) {
            state.capture = None;
        }
        let Some(index) = state.private.iter().position(|p| p.id == id) else {
            return;
        };
        let pool = state.private.swap_remove(index);
        for (set, shared) in pool.free.into_iter().zip(state.free.iter_mut()) {
            shared.extend(set);
        }
        for segment in state.segments.values_mut().filter(|s| s.owner == Some(id)) {
            segment.owner = None;
        }
    }

    /// Bytes reserved by the private pool `id` (0 once released).
    pub fn private_pool_bytes(&self, id: u64) -> usize {
        let state = self.lock();
        state
            .segments
            .values()
            .filter(|s| s.owner == Some(id))
            .map(|s| s.size)
            .sum()
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> MemoryStats {
        let state = self.lock();
        let mut s = state.stats;
        s.largest_free_block = Self::largest_free(&state);
        s
    }

    /// Reset the peak counters to the current values.
    pub fn reset_peaks(&self) {
        let mut state = self.lock();
        state.stats.peak_allocated_bytes = state.stats.allocated_bytes;
        state.stats.peak_reserved_bytes = state.stats.reserved_bytes;
    }

    /// The `n` largest live blocks with their creation sites, largest first.
    pub fn largest_live(&self, n: usize) -> Vec<LiveBlock> {
        Self::largest_live_locked(&self.lock(), n)
    }

    fn largest_live_locked(state: &State, n: usize) -> Vec<LiveBlock> {
        let mut live: Vec<LiveBlock> = state
            .segments
            .values()
            .flat_map(|s| s.blocks.values())
            .filter_map(|b| b.live.map(|(_, site)| LiveBlock { bytes: b.size, site }))
            .collect();
        live.sort_by_key(|b| std::cmp::Reverse(b.bytes));
        live.truncate(n);
        live
    }

    fn largest_free(state: &State) -> usize {
        state
            .free
            .iter()
            .filter_map(|f| f.iter().next_back().map(|e| e.0))
            .max()
            .unwrap_or(0)
    }

    fn report(
        &self,
        state: &State,
        requested: usize,
        requested_at: Option<Site>,
        config: &AllocatorConfig,
    ) -> OomReport {
        let info = self.source.memory_info();
        OomReport {
            device: self.device,
            requested,
            requested_at,
            capacity: info.map(|i| i.total),
            free: info.map(|i| i.free),
            limit: config.limit,
            allocated: state.stats.allocated_bytes,
            reserved: state.stats.reserved_bytes,
            largest_free_block: Self::largest_free(state),
            largest_live: Self::largest_live_locked(state, 5),
        }
    }

    fn oom_unlocked(&self, requested: usize, site: Site, config: &AllocatorConfig) -> Error {
        let mut state = self.lock();
        state.stats.oom_count += 1;
        Error::OutOfMemory(Box::new(self.report(&state, requested, Some(site), config)))
    }
}

impl Drop for CachingAllocator {
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        for (_, segment) in state.segments.drain() {
            // SAFETY: each segment came from this source and is released once, as the table is
            // drained; the allocator is being dropped, so no `Backend` (which owns it) can still
            // launch work on its blocks.
            unsafe { self.source.release_segment(segment.handle) };
        }
    }
}

/// A GPU-free [`SegmentSource`] for tests of the allocator and the frontend.
pub mod testing {
    use std::sync::Mutex;

    use super::{MemoryInfo, SegmentError, SegmentHandle, SegmentSource};

    /// Hands out fake addresses from a fixed capacity and records every call.
    #[derive(Debug)]
    pub struct MockSource {
        capacity: usize,
        state: Mutex<MockState>,
    }

    #[derive(Debug, Default)]
    struct MockState {
        used: usize,
        next_id: u64,
        live: Vec<(SegmentHandle, usize)>,
        allocs: usize,
        releases: usize,
    }

    impl MockSource {
        /// A source with `capacity` bytes of pretend device memory.
        pub fn new(capacity: usize) -> Self {
            MockSource {
                capacity,
                state: Mutex::new(MockState::default()),
            }
        }

        /// (segments allocated, segments released) so far.
        pub fn calls(&self) -> (usize, usize) {
            let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
            (s.allocs, s.releases)
        }

        /// Bytes currently taken from the pretend device.
        pub fn used(&self) -> usize {
            self.state.lock().unwrap_or_else(|p| p.into_inner()).used
        }
    }

    impl SegmentSource for MockSource {
        fn allocate_segment(&self, bytes: usize) -> Result<SegmentHandle, SegmentError> {
            let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
            if s.used + bytes > self.capacity {
                return Err(SegmentError::OutOfMemory);
            }
            s.used += bytes;
            s.next_id += 1;
            s.allocs += 1;
            let handle = SegmentHandle {
                id: s.next_id,
                addr: s.next_id << 40,
            };
            s.live.push((handle, bytes));
            Ok(handle)
        }

        unsafe fn release_segment(&self, segment: SegmentHandle) {
            let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(i) = s.live.iter().position(|(h, _)| *h == segment) {
                let (_, bytes) = s.live.swap_remove(i);
                s.used -= bytes;
                s.releases += 1;
            }
        }

        fn memory_info(&self) -> Option<MemoryInfo> {
            let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
            Some(MemoryInfo {
                free: (self.capacity - s.used) as u64,
                total: self.capacity as u64,
            })
        }
    }
}
