//! PyTorch's CUDA caching allocator, replayed.
//!
//! `torch.cuda.memory_reserved()` and nvidia-smi do not show what the tensors need
//! (`max_memory_allocated`, which the rest of the engine predicts) but what PyTorch's caching
//! allocator has taken from CUDA to hold them: whole segments, each carved into blocks, kept
//! after the tensors in them die. [`Allocator`] applies that allocator's rules to a sequence
//! of allocations and frees and reports the segments it would hold.
//!
//! The rules are those of `DeviceCachingAllocator` in `c10/cuda/CUDACachingAllocator.cpp`,
//! read at pytorch/pytorch commit `001074d25084fdb87a799823e395a50f5ec044d3`, with the sizes
//! and defaults that torch 2.11.0's own headers state (`c10/core/AllocatorConfig.h`:
//! `kMinBlockSize`, `kSmallSize`, `kSmallBuffer`, `kMinLargeAlloc`, `kRoundLarge`,
//! `large_segment_size` of 20 MiB, `max_split_size` unlimited, `max_non_split_rounding` of
//! 20 MiB). Function names below are that file's.
//!
//! - `round_size`: every request is rounded up to a multiple of 512 bytes (512 at least).
//! - `get_pool`: requests of at most 1 MiB come from the small pool, the rest from the large.
//! - `get_free_block`: the smallest cached free block that fits (ties: the lowest address),
//!   except that a request below `max_split_size_mb` never takes a block at or above it, and
//!   one at or above it only takes a block less than 20 MiB larger.
//! - `get_allocation_size`: with no free block, a new segment (`cudaMalloc`) of 2 MiB for the
//!   small pool, 20 MiB for large requests below 10 MiB, and the request rounded up to 2 MiB
//!   above that.
//! - `should_split`: the block is split when what remains is at least 512 bytes (small pool)
//!   or more than 1 MiB (large pool, and only below `max_split_size_mb`); otherwise the request
//!   takes the whole block (and `memory_allocated` counts all of it).
//! - `free_block`: a freed block merges with its free neighbours in the segment.
//! - `alloc_block` failing (the device is full): `release_available_cached_blocks` (with
//!   `max_split_size_mb` set) then `release_cached_blocks` free every cached segment that holds
//!   no allocation, and the `cudaMalloc` is retried once; then "CUDA out of memory".
//! - `expandable_segments:True`: one segment per pool that grows by mapping pages (2 MiB for
//!   the small pool, 20 MiB for the large) at its end (`try_allocate_expandable_block`,
//!   `map_block`); every split is allowed; the free block at the segment's end counts, for
//!   best fit, as big as the unmapped space after it, so it is taken last.
//!
//! Nothing calls `empty_cache` during a run, so a segment once taken stays: the reserved
//! peak is what the run has reserved at its end, unless the device filled up on the way.

/// `kMinBlockSize`: every block is a multiple of 512 bytes.
pub const MIN_BLOCK: u64 = 512;
/// `kSmallSize`: the largest request served from the small pool (1 MiB).
pub const SMALL_SIZE: u64 = 1 << 20;
/// `kSmallBuffer`: the small pool's segments (2 MiB).
pub const SMALL_BUFFER: u64 = 2 << 20;
/// `kMinLargeAlloc`: large requests below this (10 MiB) get a 20 MiB segment.
pub const MIN_LARGE_ALLOC: u64 = 10 << 20;
/// `kLargeBuffer` / `large_segment_size`: that segment (20 MiB), and the large pool's page
/// under expandable segments.
pub const LARGE_BUFFER: u64 = 20 << 20;
/// `kRoundLarge`: larger segments are rounded up to 2 MiB.
pub const ROUND_LARGE: u64 = 2 << 20;

/// The allocator's settings (`PYTORCH_CUDA_ALLOC_CONF`) and the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// `expandable_segments:True`.
    pub expandable: bool,
    /// `max_split_size_mb`, in bytes (`u64::MAX`: unlimited, the default).
    pub max_split: u64,
    /// What `cudaMalloc` can give in all (the device's memory less what CUDA itself holds);
    /// beyond it an allocation fails and the allocator frees its cache and retries.
    pub device: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            expandable: false,
            max_split: u64::MAX,
            device: u64::MAX,
        }
    }
}

/// `max_non_split_rounding_mb`'s default (`kLargeBuffer`): a request at or above
/// `max_split_size_mb` takes a cached block only if it is less than this much larger.
const MAX_NON_SPLIT_ROUNDING: u64 = LARGE_BUFFER;

const NIL: u32 = u32::MAX;

/// One block: a piece of a segment, free or allocated.
#[derive(Clone, Copy, Debug)]
struct Block {
    addr: u64,
    size: u64,
    prev: u32,
    next: u32,
    allocated: bool,
    /// Backed by memory (always, except an expandable segment's unmapped space).
    mapped: bool,
    small: bool,
    /// In use (a merged-away block's slot waits in `Allocator::spare`).
    live: bool,
}

/// The requested memory does not fit on the device, even after the cache was freed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Oom {
    /// The request (rounded to 512 bytes).
    pub size: u64,
    /// The segment (or the pages) `cudaMalloc` was asked for.
    pub alloc_size: u64,
    pub reserved: u64,
    pub allocated: u64,
}

/// A pool of cached free blocks, ordered as `BlockComparatorSize`: by size, then address.
/// Blocks are kept in buckets of sizes (eight per power of two, ordered) with a bitmap of
/// the non-empty ones, so that finding the best fit and inserting or removing a block touch
/// one short list (a block is always larger than every block of a lower bucket).
#[derive(Clone, Debug)]
struct FreeSet {
    buckets: Vec<Vec<(u64, u64, u32)>>,
    used: [u64; 8],
}

/// A place in a [`FreeSet`]: (bucket, index).
type Pos = (usize, usize);

impl Default for FreeSet {
    fn default() -> Self {
        FreeSet {
            buckets: vec![Vec::new(); 512],
            used: [0; 8],
        }
    }
}

#[inline(always)]
fn bucket(size: u64) -> usize {
    if size < 8 {
        return size as usize;
    }
    let e = 63 - size.leading_zeros() as usize;
    e * 8 + ((size >> (e - 3)) & 7) as usize
}

impl FreeSet {
    /// The first non-empty bucket at or above `c`.
    #[inline(always)]
    fn next_used(&self, c: usize) -> Option<usize> {
        let mut w = c / 64;
        if w >= 8 {
            return None;
        }
        let mut bits = self.used[w] & (!0u64 << (c % 64));
        loop {
            if bits != 0 {
                return Some(w * 64 + bits.trailing_zeros() as usize);
            }
            w += 1;
            if w == 8 {
                return None;
            }
            bits = self.used[w];
        }
    }
    /// The smallest block of at least `size` bytes (the lowest address among equals).
    #[inline(always)]
    fn lower_bound(&self, size: u64) -> Option<Pos> {
        let c = bucket(size);
        let v = &self.buckets[c];
        let i = v.partition_point(|e| e.0 < size);
        if i < v.len() {
            return Some((c, i));
        }
        self.next_used(c + 1).map(|c| (c, 0))
    }
    #[inline(always)]
    fn get(&self, p: Pos) -> (u64, u64, u32) {
        self.buckets[p.0][p.1]
    }
    /// The block after `p` in the order.
    fn next(&self, p: Pos) -> Option<Pos> {
        if p.1 + 1 < self.buckets[p.0].len() {
            return Some((p.0, p.1 + 1));
        }
        self.next_used(p.0 + 1).map(|c| (c, 0))
    }
    #[inline(always)]
    fn remove_at(&mut self, p: Pos) {
        let v = &mut self.buckets[p.0];
        if p.1 + 1 == v.len() {
            v.pop();
        } else {
            v.remove(p.1);
        }
        if v.is_empty() {
            self.used[p.0 / 64] &= !(1 << (p.0 % 64));
        }
    }
    #[inline(always)]
    fn insert(&mut self, b: &Block, id: u32) {
        let c = bucket(b.size);
        let v = &mut self.buckets[c];
        let key = (b.size, b.addr);
        // Most often the block goes last (a new segment's, or the largest of its bucket).
        match v.last() {
            Some(e) if (e.0, e.1) > key => {
                let i = v.partition_point(|e| (e.0, e.1) < key);
                v.insert(i, (b.size, b.addr, id));
            }
            _ => v.push((b.size, b.addr, id)),
        }
        self.used[c / 64] |= 1 << (c % 64);
    }
    fn remove(&mut self, b: &Block) {
        let c = bucket(b.size);
        let v = &self.buckets[c];
        let key = (b.size, b.addr);
        let i = v.partition_point(|e| (e.0, e.1) < key);
        debug_assert!(i < v.len() && (v[i].0, v[i].1) == key);
        if i < v.len() && (v[i].0, v[i].1) == key {
            self.remove_at((c, i));
        }
    }
    /// The largest block.
    fn last(&self) -> Option<(u64, u64, u32)> {
        (0..8).rev().find_map(|w| {
            let bits = self.used[w];
            (bits != 0).then(|| {
                let c = w * 64 + 63 - bits.leading_zeros() as usize;
                *self.buckets[c].last().expect("a used bucket holds a block")
            })
        })
    }
    fn ids(&self) -> Vec<u32> {
        self.buckets.iter().flatten().map(|e| e.2).collect()
    }
}

/// What the allocator holds, now and at its highs (`torch.cuda.memory_stats()`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// `reserved_bytes.all.current`: every segment's bytes (mapped pages under expandable
    /// segments).
    pub reserved: u64,
    /// `allocated_bytes.all.current`: the blocks handed out (each request rounded, and a
    /// block that was not split counted whole).
    pub allocated: u64,
    pub peak_reserved: u64,
    pub peak_allocated: u64,
    /// `segment.all.current`: live `cudaMalloc` segments (expandable: one per pool in use).
    pub segments: u64,
    /// `num_alloc_retries`: times the device was full and the cache was freed to retry.
    pub retries: u64,
}

/// One segment as `torch.cuda.memory_snapshot()` lists it: its blocks in address order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    pub small: bool,
    /// (bytes, allocated) of each block.
    pub blocks: Vec<(u64, bool)>,
}

impl Segment {
    pub fn bytes(&self) -> u64 {
        self.blocks.iter().map(|b| b.0).sum()
    }
    pub fn allocated(&self) -> u64 {
        self.blocks.iter().filter(|b| b.1).map(|b| b.0).sum()
    }
}

/// See [`Allocator::state`].
pub(crate) type State = (Vec<(u64, u64, u8)>, u64, Vec<u64>);

/// The caching allocator of one device and one stream.
#[derive(Clone, Debug)]
pub struct Allocator {
    cfg: Config,
    blocks: Vec<Block>,
    /// Indices of `blocks` no longer in use.
    spare: Vec<u32>,
    /// Cached free blocks: [large pool, small pool].
    pools: [FreeSet; 2],
    /// The next address a new segment gets (segments never overlap).
    next_addr: u64,
    stats: Stats,
    /// Every block that became unmapped space of an expandable segment, with stale entries
    /// (mapped since, merged away, their slot reused) dropped when it is next read:
    /// `BlockPool::unmapped`, without scanning every block at each request.
    unmapped: Vec<u32>,
}

/// `round_size` without `roundup_power2_divisions` (not set by default).
pub fn round_size(bytes: u64) -> u64 {
    if bytes < MIN_BLOCK {
        MIN_BLOCK
    } else {
        bytes.div_ceil(MIN_BLOCK).saturating_mul(MIN_BLOCK)
    }
}

/// `get_allocation_size`: the segment a request of `size` (rounded) makes when no cached
/// block fits.
pub fn allocation_size(size: u64) -> u64 {
    if size <= SMALL_SIZE {
        SMALL_BUFFER
    } else if size < MIN_LARGE_ALLOC {
        LARGE_BUFFER
    } else {
        size.div_ceil(ROUND_LARGE).saturating_mul(ROUND_LARGE)
    }
}

impl Allocator {
    pub fn new(cfg: Config) -> Self {
        Allocator {
            cfg,
            blocks: Vec::new(),
            spare: Vec::new(),
            pools: [FreeSet::default(), FreeSet::default()],
            next_addr: 1 << 32,
            stats: Stats::default(),
            unmapped: Vec::new(),
        }
    }

    pub fn config(&self) -> Config {
        self.cfg
    }

    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// `memory_reserved()`.
    pub fn reserved(&self) -> u64 {
        self.stats.reserved
    }

    /// `max_memory_allocated()` since the last reset.
    pub fn peak_allocated(&self) -> u64 {
        self.stats.peak_allocated
    }

    /// The address of the block `id` names (segments are laid out from 2³² up, in the order
    /// they are taken, never overlapping).
    pub fn address(&self, id: u32) -> u64 {
        self.b(id).addr
    }

    /// Lay the next segment out at `addr` (which must not overlap one taken before): to
    /// replay a trace with the addresses `cudaMalloc` really gave, on which best fit breaks
    /// its ties.
    pub fn next_segment_at(&mut self, addr: u64) {
        self.next_addr = addr;
    }

    /// `torch.cuda.reset_peak_memory_stats()`.
    pub fn reset_peaks(&mut self) {
        self.stats.peak_reserved = self.stats.reserved;
        self.stats.peak_allocated = self.stats.allocated;
    }

    fn new_block(&mut self, mut b: Block) -> u32 {
        b.live = true;
        match self.spare.pop() {
            Some(i) => {
                self.blocks[i as usize] = b;
                i
            }
            None => {
                self.blocks.push(b);
                (self.blocks.len() - 1) as u32
            }
        }
    }

    /// Blocks in address order.
    fn by_address(&self, ids: Vec<u32>) -> Vec<u32> {
        crate::order::sorted_indices(ids.len(), &|i, j| {
            self.b(ids[i]).addr.cmp(&self.b(ids[j]).addr)
        })
        .into_iter()
        .map(|i| ids[i])
        .collect()
    }

    fn kill(&mut self, i: u32) {
        self.blocks[i as usize].live = false;
        self.spare.push(i);
    }

    fn b(&self, i: u32) -> &Block {
        &self.blocks[i as usize]
    }

    fn pool_of(small: bool) -> usize {
        usize::from(small)
    }

    /// Allocate `bytes`; the handle names the block until [`Allocator::free`].
    #[inline(always)]
    pub fn malloc(&mut self, bytes: u64) -> Result<u32, Oom> {
        let size = round_size(bytes);
        let small = size <= SMALL_SIZE;
        if let Some(id) = self.get_free_block(small, size) {
            return Ok(self.alloc_found_block(id, small, size));
        }
        self.malloc_new(size, small)
    }

    /// The rest of `malloc` when no cached block fits: new memory from CUDA, the cache
    /// released and the request retried when the device is full.
    fn malloc_new(&mut self, size: u64, small: bool) -> Result<u32, Oom> {
        let alloc_size = allocation_size(size);
        let mut found = self.alloc_block(small, size, alloc_size);
        if found.is_none() && self.release_available(small, size) {
            found = self.alloc_block(small, size, alloc_size);
        }
        if found.is_none() {
            // `release_cached_blocks`, then the retry `num_alloc_retries` counts.
            self.release_cached();
            self.stats.retries += 1;
            found = self.alloc_block(small, size, alloc_size);
        }
        let Some(id) = found else {
            return Err(Oom {
                size,
                alloc_size,
                reserved: self.stats.reserved,
                allocated: self.stats.allocated,
            });
        };
        Ok(self.alloc_found_block(id, small, size))
    }

    /// `alloc_found_block`: split off the front of block `id` when `should_split` says so.
    #[inline(always)]
    fn alloc_found_block(&mut self, id: u32, small: bool, size: u64) -> u32 {
        let blk = *self.b(id);
        let remaining = blk.size - size;
        let split = if small || self.cfg.expandable {
            remaining >= MIN_BLOCK
        } else {
            size < self.cfg.max_split && remaining > SMALL_SIZE
        };
        let out = if split {
            let front = self.new_block(Block {
                addr: blk.addr,
                size,
                prev: blk.prev,
                next: id,
                allocated: true,
                mapped: true,
                small,
                live: true,
            });
            if blk.prev != NIL {
                self.blocks[blk.prev as usize].next = front;
            }
            let rest = &mut self.blocks[id as usize];
            rest.prev = front;
            rest.addr += size;
            rest.size -= size;
            let rest = *rest;
            self.pools[Self::pool_of(small)].insert(&rest, id);
            front
        } else {
            self.blocks[id as usize].allocated = true;
            id
        };
        let s = &mut self.stats;
        s.allocated += self.blocks[out as usize].size;
        s.peak_allocated = s.peak_allocated.max(s.allocated);
        out
    }

    /// `get_free_block`: the block a request of `size` takes from the cache, if any (left
    /// in the pool).
    #[inline(always)]
    fn find_free(&self, small: bool, size: u64) -> Option<Pos> {
        let set = &self.pools[Self::pool_of(small)];
        let mut i = set.lower_bound(size)?;
        if !self.cfg.expandable && self.cfg.max_split == u64::MAX {
            // The default settings: the best fit, whatever its size.
            return Some(i);
        }
        if self.cfg.expandable {
            // The block at a segment's end counts as big as the space it can grow into.
            let grow = |id: u32| -> u64 {
                let b = &self.blocks[id as usize];
                let tail = if b.next != NIL && !self.blocks[b.next as usize].mapped {
                    self.blocks[b.next as usize].size
                } else {
                    0
                };
                b.size + tail
            };
            while let Some(j) = set.next(i) {
                if grow(set.get(j).2) < grow(set.get(i).2) {
                    i = j;
                } else {
                    break;
                }
            }
        }
        let bsize = set.get(i).0;
        let max_split = self.cfg.max_split;
        if size < max_split && bsize >= max_split {
            return None;
        }
        if size >= max_split && bsize >= size.saturating_add(MAX_NON_SPLIT_ROUNDING) {
            return None;
        }
        Some(i)
    }

    #[inline(always)]
    fn get_free_block(&mut self, small: bool, size: u64) -> Option<u32> {
        let i = self.find_free(small, size)?;
        let p = Self::pool_of(small);
        let id = self.pools[p].get(i).2;
        self.pools[p].remove_at(i);
        Some(id)
    }

    /// What `allocated` is while a request of `bytes` holds a cached block, if one can hold
    /// it (`None`: it needs new memory from CUDA).
    pub(crate) fn held_with(&self, bytes: u64) -> Option<u64> {
        let size = round_size(bytes);
        let small = size <= SMALL_SIZE;
        let i = self.find_free(small, size)?;
        let bsize = self.pools[Self::pool_of(small)].get(i).0;
        let split = if small || self.cfg.expandable {
            bsize - size >= MIN_BLOCK
        } else {
            size < self.cfg.max_split && bsize - size > SMALL_SIZE
        };
        Some(self.stats.allocated + if split { size } else { bsize })
    }

    /// A tensor allocated and freed before anything else happens (an op's workspace): when
    /// a cached block can hold it, splitting it off and merging it back leaves the cache as
    /// it was, so only the peak moves; otherwise it is allocated and freed.
    pub fn transient(&mut self, bytes: u64) -> Result<(), Oom> {
        if let Some(now) = self.held_with(bytes) {
            self.reach(now);
            return Ok(());
        }
        let h = self.malloc(bytes)?;
        self.free(h);
        Ok(())
    }

    /// A moment with `allocated` bytes allocated that leaves the cache as it was (a
    /// workspace in a cached block: [`Allocator::held_with`]): only the peak moves.
    pub(crate) fn reach(&mut self, allocated: u64) {
        let s = &mut self.stats;
        s.peak_allocated = s.peak_allocated.max(allocated);
    }

    /// `alloc_block`: a new segment (or, expandable, new pages), unless the device is full.
    fn alloc_block(&mut self, small: bool, size: u64, alloc_size: u64) -> Option<u32> {
        if self.cfg.expandable {
            return self.alloc_expandable(small, size);
        }
        if self.stats.reserved.saturating_add(alloc_size) > self.cfg.device {
            return None;
        }
        let id = self.new_block(Block {
            addr: self.next_addr,
            size: alloc_size,
            prev: NIL,
            next: NIL,
            allocated: false,
            mapped: true,
            small,
            live: true,
        });
        self.next_addr = self.next_addr.saturating_add(alloc_size);
        let s = &mut self.stats;
        s.reserved += alloc_size;
        s.peak_reserved = s.peak_reserved.max(s.reserved);
        s.segments += 1;
        Some(id)
    }

    /// The page an expandable segment of this pool maps at a time.
    fn page(small: bool) -> u64 {
        if small {
            SMALL_BUFFER
        } else {
            LARGE_BUFFER
        }
    }

    /// `try_allocate_expandable_block`: `find_expandable_block` (the lowest unmapped space,
    /// with the free block before it, that can hold `size`; else a new segment: address
    /// space for 1 1/8 of the device, nothing mapped), then pages mapped into it until the
    /// block holds `size`.
    fn alloc_expandable(&mut self, small: bool, size: u64) -> Option<u32> {
        let p = Self::pool_of(small);
        let free = |a: &Self, i: u32| i != NIL && !a.b(i).allocated;
        let room = |a: &Self, mut i: u32| {
            let mut bytes = 0u64;
            while bytes < size && free(a, i) {
                bytes = bytes.saturating_add(a.b(i).size);
                i = a.b(i).next;
            }
            bytes >= size
        };
        // The unmapped blocks as they are now (each once), then this pool's in address order.
        let mut now = std::mem::take(&mut self.unmapped);
        now.retain(|&i| {
            let b = self.b(i);
            b.live && !b.mapped
        });
        now.sort_unstable();
        now.dedup();
        let unmapped = self.by_address(
            now.iter()
                .copied()
                .filter(|&i| self.b(i).small == small)
                .collect(),
        );
        self.unmapped = now;
        let mut cand = NIL;
        for u in unmapped {
            let prev = self.b(u).prev;
            let c = if free(self, prev) { prev } else { u };
            if room(self, c) {
                cand = c;
                break;
            }
        }
        if cand == NIL {
            let page = Self::page(small);
            // (A device of unbounded size, the default `Config`, reserves 2^56 bytes: the
            // addresses of its segments stay far from the end of `u64`.)
            let device = self.cfg.device.min(1 << 56);
            let span = (device / 8)
                .saturating_add(device)
                .div_ceil(page)
                .saturating_mul(page)
                .max(size.div_ceil(page).saturating_mul(page));
            let base = self.next_addr.div_ceil(page).saturating_mul(page);
            self.next_addr = base.saturating_add(span);
            cand = self.new_block(Block {
                addr: base,
                size: span,
                prev: NIL,
                next: NIL,
                allocated: false,
                mapped: false,
                small,
                live: true,
            });
            self.unmapped.push(cand);
            self.stats.segments += 1;
        }
        if !self.b(cand).mapped {
            cand = self.map(cand, size)?;
        }
        while self.b(cand).size < size {
            let need = size - self.b(cand).size;
            let next = self.b(cand).next;
            if next == NIL || self.b(next).mapped || self.b(next).allocated {
                return None;
            }
            cand = self.map(next, need)?;
        }
        let blk = *self.b(cand);
        self.pools[p].remove(&blk);
        Some(cand)
    }

    /// `map_block`: map the pages covering the first `size` bytes of the unmapped block
    /// `id`; the mapped part merges with a free block before it and joins the pool.
    fn map(&mut self, id: u32, size: u64) -> Option<u32> {
        let blk = *self.b(id);
        let page = Self::page(blk.small);
        let mapped = size.div_ceil(page).saturating_mul(page).min(blk.size);
        if self.stats.reserved.saturating_add(mapped) > self.cfg.device || mapped == 0 {
            return None;
        }
        let p = Self::pool_of(blk.small);
        if mapped < blk.size {
            let rest = self.new_block(Block {
                addr: blk.addr + mapped,
                size: blk.size - mapped,
                prev: id,
                next: blk.next,
                allocated: false,
                mapped: false,
                small: blk.small,
                live: true,
            });
            self.unmapped.push(rest);
            if blk.next != NIL {
                self.blocks[blk.next as usize].prev = rest;
            }
            let b = &mut self.blocks[id as usize];
            b.next = rest;
            b.size = mapped;
        }
        self.blocks[id as usize].mapped = true;
        let prev = self.b(id).prev;
        self.try_merge(id, prev);
        let next = self.b(id).next;
        self.try_merge(id, next);
        let b = *self.b(id);
        self.pools[p].insert(&b, id);
        let s = &mut self.stats;
        s.reserved += mapped;
        s.peak_reserved = s.peak_reserved.max(s.reserved);
        Some(id)
    }

    /// `try_merge_blocks`: `dst` takes in its neighbour `src` when that is free and mapped
    /// alike (`src` leaves its pool).
    fn try_merge(&mut self, dst: u32, src: u32) -> bool {
        if src == NIL {
            return false;
        }
        let (d, s) = (*self.b(dst), *self.b(src));
        if s.allocated || s.mapped != d.mapped {
            return false;
        }
        if s.mapped {
            self.pools[Self::pool_of(s.small)].remove(&s);
        }
        let b = &mut self.blocks[dst as usize];
        if d.prev == src {
            b.addr = s.addr;
            b.prev = s.prev;
            if s.prev != NIL {
                self.blocks[s.prev as usize].next = dst;
            }
        } else {
            b.next = s.next;
            if s.next != NIL {
                self.blocks[s.next as usize].prev = dst;
            }
        }
        self.blocks[dst as usize].size += s.size;
        self.kill(src);
        true
    }

    /// Free the block `id` (`free` → `free_block`).
    #[inline(always)]
    pub fn free(&mut self, id: u32) {
        let blk = *self.b(id);
        debug_assert!(blk.allocated);
        if !blk.allocated {
            return;
        }
        self.blocks[id as usize].allocated = false;
        self.stats.allocated -= blk.size;
        // Only a free neighbour merges (and none does in most frees).
        let free = |a: &Self, i: u32| i != NIL && !a.b(i).allocated;
        if free(self, blk.prev) {
            self.try_merge(id, blk.prev);
        }
        if free(self, blk.next) {
            self.try_merge(id, blk.next);
        }
        let b = *self.b(id);
        self.pools[Self::pool_of(b.small)].insert(&b, id);
    }

    /// `release_available_cached_blocks`: with `max_split_size_mb` set, free the smallest
    /// oversize cached segment that covers the request, or the largest ones until they do.
    fn release_available(&mut self, small: bool, size: u64) -> bool {
        let ms = self.cfg.max_split;
        if ms == u64::MAX {
            return false;
        }
        let p = Self::pool_of(small);
        let key = size.max(ms);
        if let Some(i) = self.pools[p].lower_bound(key) {
            let id = self.pools[p].get(i).2;
            return self.release_block(id);
        }
        let mut released = 0;
        while released < key {
            let Some((bsize, _, id)) = self.pools[p].last() else {
                break;
            };
            if bsize < ms {
                break;
            }
            if !self.release_block(id) {
                break;
            }
            released += bsize;
        }
        released >= key
    }

    /// `release_block`: a cached block that is a whole segment goes back to CUDA.
    fn release_block(&mut self, id: u32) -> bool {
        let b = *self.b(id);
        if b.prev != NIL || b.next != NIL || b.allocated || !b.mapped {
            return false;
        }
        self.pools[Self::pool_of(b.small)].remove(&b);
        self.kill(id);
        let s = &mut self.stats;
        s.reserved -= b.size;
        s.segments -= 1;
        true
    }

    /// `release_cached_blocks` (`torch.cuda.empty_cache()`): every cached segment holding no
    /// allocation goes back to CUDA; under expandable segments, the whole pages inside each
    /// free block are unmapped.
    pub fn release_cached(&mut self) {
        for p in 0..2 {
            let ids: Vec<u32> = self.pools[p].ids();
            for id in ids {
                if self.cfg.expandable {
                    self.unmap(id);
                } else {
                    self.release_block(id);
                }
            }
        }
    }

    /// `unmap_block`: the whole pages strictly inside free block `id` are unmapped.
    fn unmap(&mut self, id: u32) {
        let b = *self.b(id);
        let page = Self::page(b.small);
        let lo = b.addr.div_ceil(page) * page;
        let hi = (b.addr + b.size) / page * page;
        if hi <= lo {
            return;
        }
        let p = Self::pool_of(b.small);
        self.pools[p].remove(&b);
        if lo > b.addr {
            let before = self.new_block(Block {
                addr: b.addr,
                size: lo - b.addr,
                prev: b.prev,
                next: id,
                ..b
            });
            if b.prev != NIL {
                self.blocks[b.prev as usize].next = before;
            }
            self.blocks[id as usize].prev = before;
            let x = *self.b(before);
            self.pools[p].insert(&x, before);
        }
        if hi < b.addr + b.size {
            let after = self.new_block(Block {
                addr: hi,
                size: b.addr + b.size - hi,
                prev: id,
                next: b.next,
                ..b
            });
            if b.next != NIL {
                self.blocks[b.next as usize].prev = after;
            }
            self.blocks[id as usize].next = after;
            let x = *self.b(after);
            self.pools[p].insert(&x, after);
        }
        let m = &mut self.blocks[id as usize];
        m.addr = lo;
        m.size = hi - lo;
        m.mapped = false;
        self.unmapped.push(id);
        let prev = self.b(id).prev;
        self.try_merge(id, prev);
        let next = self.b(id).next;
        self.try_merge(id, next);
        self.stats.reserved -= hi - lo;
        // `release_expandable_segment`: nothing of the segment is mapped any more.
        let u = *self.b(id);
        if u.prev == NIL && u.next == NIL {
            self.kill(id);
            self.stats.segments -= 1;
        }
    }

    /// What decides the cache's answers from here on: every block (address, size, and
    /// whether it is allocated, mapped, in the small pool, first of its segment) in address
    /// order, where the next segment goes, and the addresses of `handles`. From equal
    /// states the same requests and frees take the same blocks and segments.
    pub(crate) fn state(&self, handles: &[u32]) -> State {
        let live: Vec<u32> = (0..self.blocks.len() as u32)
            .filter(|&i| self.b(i).live)
            .collect();
        let blocks = self
            .by_address(live)
            .into_iter()
            .map(|i| {
                let b = self.b(i);
                let flags = u8::from(b.allocated)
                    | u8::from(b.mapped) << 1
                    | u8::from(b.small) << 2
                    | u8::from(b.prev == NIL) << 3;
                (b.addr, b.size, flags)
            })
            .collect();
        let at = handles.iter().map(|&h| self.b(h).addr).collect();
        (blocks, self.next_addr, at)
    }

    /// Cached free blocks in each pool: (large, small).
    pub fn free_blocks(&self) -> (usize, usize) {
        (self.pools[0].ids().len(), self.pools[1].ids().len())
    }

    /// The largest cached free block (either pool): a request above it needs new memory
    /// from CUDA even when more than that is cached in all.
    pub fn largest_free(&self) -> u64 {
        self.pools
            .iter()
            .filter_map(|p| p.last().map(|e| e.0))
            .max()
            .unwrap_or(0)
    }

    /// Every segment with its blocks, in address order (`torch.cuda.memory_snapshot()`);
    /// an expandable segment shows its mapped part.
    pub fn segments(&self) -> Vec<Segment> {
        let heads: Vec<u32> = (0..self.blocks.len() as u32)
            .filter(|&i| self.b(i).live && self.b(i).prev == NIL)
            .collect();
        let heads = self.by_address(heads);
        heads
            .into_iter()
            .filter_map(|h| {
                let mut blocks = Vec::new();
                let mut i = h;
                while i != NIL && self.b(i).mapped {
                    blocks.push((self.b(i).size, self.b(i).allocated));
                    i = self.b(i).next;
                }
                (!blocks.is_empty()).then(|| Segment {
                    small: self.b(h).small,
                    blocks,
                })
            })
            .collect()
    }
}

pub mod stream;

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn dev() -> Allocator {
        Allocator::new(Config {
            device: 80 << 30,
            ..Config::default()
        })
    }

    #[test]
    fn requests_are_rounded_to_512_bytes() {
        assert_eq!(round_size(1), 512);
        assert_eq!(round_size(512), 512);
        assert_eq!(round_size(513), 1024);
        let mut a = dev();
        a.malloc(4).unwrap();
        assert_eq!(a.stats().allocated, 512);
    }

    #[test]
    fn segment_sizes_follow_the_request() {
        // Small pool: 2 MiB; large requests below 10 MiB: 20 MiB; above: rounded to 2 MiB.
        assert_eq!(allocation_size(512), SMALL_BUFFER);
        assert_eq!(allocation_size(SMALL_SIZE), SMALL_BUFFER);
        assert_eq!(allocation_size(SMALL_SIZE + 512), LARGE_BUFFER);
        assert_eq!(allocation_size(10 * MIB - 512), LARGE_BUFFER);
        assert_eq!(allocation_size(10 * MIB), 10 * MIB);
        assert_eq!(allocation_size(11 * MIB + 1), 12 * MIB);
        let mut a = dev();
        a.malloc(100).unwrap();
        a.malloc(3 * MIB).unwrap();
        // 17 MiB of the 20 MiB segment are free: an 11 MiB request fits there, an 18 MiB
        // one gets its own segment.
        a.malloc(11 * MIB).unwrap();
        a.malloc(18 * MIB + 1).unwrap();
        let st = a.stats();
        assert_eq!(st.segments, 3);
        assert_eq!(st.reserved, SMALL_BUFFER + LARGE_BUFFER + 20 * MIB);
    }

    #[test]
    fn small_and_large_pools_do_not_share_segments() {
        let mut a = dev();
        let big = a.malloc(3 * MIB).unwrap();
        a.free(big);
        // 20 MiB are cached in the large pool, but a small request gets its own segment.
        a.malloc(1000).unwrap();
        assert_eq!(a.stats().segments, 2);
    }

    #[test]
    fn best_fit_takes_the_smallest_block_that_holds_the_request() {
        let mut a = dev();
        let x = a.malloc(40 * MIB).unwrap();
        let y = a.malloc(24 * MIB).unwrap();
        let z = a.malloc(30 * MIB).unwrap();
        a.free(x);
        a.free(y);
        a.free(z);
        // 24 MiB is the smallest cached block of at least 22 MiB: no new segment; the 2 MiB
        // left (more than 1 MiB) is split off.
        a.malloc(22 * MIB).unwrap();
        let st = a.stats();
        assert_eq!(st.segments, 3);
        assert_eq!(st.allocated, 22 * MIB);
        let segs = a.segments();
        let s24 = segs.iter().find(|s| s.bytes() == 24 * MIB).unwrap();
        assert_eq!(s24.blocks, vec![(22 * MIB, true), (2 * MIB, false)]);
    }

    #[test]
    fn a_large_block_is_not_split_for_a_remainder_of_one_mib_or_less() {
        let mut a = dev();
        let x = a.malloc(12 * MIB).unwrap();
        a.free(x);
        // 12 MiB − 11 MiB = 1 MiB remains: the whole block is taken and counted.
        a.malloc(11 * MIB).unwrap();
        assert_eq!(a.stats().allocated, 12 * MIB);
        assert_eq!(a.segments()[0].blocks, vec![(12 * MIB, true)]);
    }

    #[test]
    fn freed_neighbours_merge_back_into_one_block() {
        let mut a = dev();
        let p = a.malloc(2 * MIB).unwrap();
        let q = a.malloc(3 * MIB).unwrap();
        let r = a.malloc(4 * MIB).unwrap();
        // One 20 MiB segment: [2 | 3 | 4 | 11 free].
        assert_eq!(a.stats().segments, 1);
        a.free(q);
        assert_eq!(a.segments()[0].blocks.len(), 4);
        a.free(p);
        a.free(r);
        assert_eq!(a.segments()[0].blocks, vec![(LARGE_BUFFER, false)]);
        assert_eq!(a.largest_free(), LARGE_BUFFER);
    }

    #[test]
    fn max_split_size_keeps_oversize_blocks_whole() {
        let mut a = Allocator::new(Config {
            max_split: 64 * MIB,
            device: 80 << 30,
            ..Config::default()
        });
        let x = a.malloc(100 * MIB).unwrap();
        a.free(x);
        // A request below max_split never takes an oversize block: a new segment.
        a.malloc(30 * MIB).unwrap();
        assert_eq!(a.stats().segments, 2);
        // One at or above it takes a cached oversize block less than 20 MiB larger, whole.
        a.malloc(90 * MIB).unwrap();
        assert_eq!(a.stats().segments, 2);
        assert_eq!(a.stats().allocated, 130 * MIB);
    }

    #[test]
    fn a_full_device_frees_the_cache_and_retries() {
        let mut a = Allocator::new(Config {
            device: 100 * MIB,
            ..Config::default()
        });
        let x = a.malloc(60 * MIB).unwrap();
        a.free(x);
        // 60 MiB cached, 40 free on the device: 70 MiB needs the cache released first.
        a.malloc(70 * MIB).unwrap();
        let st = a.stats();
        assert_eq!(st.retries, 1);
        assert_eq!(st.reserved, 70 * MIB);
        // Nothing is left to free: out of memory.
        let e = a.malloc(40 * MIB).unwrap_err();
        assert_eq!(e.reserved, 70 * MIB);
    }

    #[test]
    fn a_transient_leaves_the_cache_as_it_was() {
        let mut a = dev();
        let x = a.malloc(40 * MIB).unwrap();
        let y = a.malloc(30 * MIB).unwrap();
        a.free(x);
        let before = a.segments();
        let mut b = a.clone();
        a.transient(25 * MIB).unwrap();
        let h = b.malloc(25 * MIB).unwrap();
        b.free(h);
        assert_eq!(a.segments(), before);
        assert_eq!(b.segments(), before);
        assert_eq!(a.stats(), b.stats());
        a.free(y);
    }

    /// The rules written the plain way: segments in address order, each a list of blocks
    /// (bytes, handle when allocated); best fit searched over every block.
    type Blocks = Vec<(u64, Option<u32>)>;

    struct Plain {
        max_split: u64,
        segs: Vec<(bool, Blocks)>,
        next: u32,
        stats: Stats,
    }

    impl Plain {
        fn malloc(&mut self, bytes: u64) -> u32 {
            let size = round_size(bytes);
            let small = size <= SMALL_SIZE;
            let best = self
                .segs
                .iter()
                .enumerate()
                .filter(|(_, s)| s.0 == small)
                .flat_map(|(i, s)| s.1.iter().enumerate().map(move |(j, b)| (b.0, i, j, b.1)))
                .filter(|b| b.3.is_none() && b.0 >= size)
                .min();
            let ms = self.max_split;
            let best = best.filter(|b| {
                !(size < ms && b.0 >= ms || size >= ms && b.0 >= size + MAX_NON_SPLIT_ROUNDING)
            });
            let (i, j) = match best {
                Some(b) => (b.1, b.2),
                None => {
                    let a = allocation_size(size);
                    self.segs.push((small, vec![(a, None)]));
                    self.stats.reserved += a;
                    self.stats.segments += 1;
                    (self.segs.len() - 1, 0)
                }
            };
            let h = self.next;
            self.next += 1;
            let blk = self.segs[i].1[j].0;
            let rest = blk - size;
            let split = if small {
                rest >= MIN_BLOCK
            } else {
                size < ms && rest > SMALL_SIZE
            };
            let taken = if split { size } else { blk };
            self.segs[i].1[j] = (taken, Some(h));
            if split {
                self.segs[i].1.insert(j + 1, (rest, None));
            }
            self.stats.allocated += taken;
            self.stats.peak_allocated = self.stats.peak_allocated.max(self.stats.allocated);
            self.stats.peak_reserved = self.stats.peak_reserved.max(self.stats.reserved);
            h
        }

        fn free(&mut self, h: u32) {
            for s in &mut self.segs {
                if let Some(j) = s.1.iter().position(|b| b.1 == Some(h)) {
                    self.stats.allocated -= s.1[j].0;
                    s.1[j].1 = None;
                    // Merge runs of free blocks.
                    let mut out: Blocks = Vec::new();
                    for b in s.1.drain(..) {
                        match out.last_mut() {
                            Some(l) if l.1.is_none() && b.1.is_none() => l.0 += b.0,
                            _ => out.push(b),
                        }
                    }
                    s.1 = out;
                    return;
                }
            }
        }

        fn segments(&self) -> Vec<Segment> {
            self.segs
                .iter()
                .map(|s| Segment {
                    small: s.0,
                    blocks: s.1.iter().map(|b| (b.0, b.1.is_some())).collect(),
                })
                .collect()
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]
        /// The allocator's indexed free set and its shortcuts choose as best fit over every
        /// block does, with the default settings and with `max_split_size_mb`: the same
        /// blocks, segments and figures after every request and free.
        #[test]
        fn best_fit_as_a_plain_search_makes_it(
            ops in proptest::collection::vec((0u8..14, 0usize..64, 1u64..(40 << 20)), 1..160),
            split in proptest::prop_oneof![proptest::strategy::Just(u64::MAX), proptest::strategy::Just(24u64 << 20)],
        ) {
            let mut a = Allocator::new(Config { max_split: split, ..Config::default() });
            let mut p = Plain { max_split: split, segs: Vec::new(), next: 0, stats: Stats::default() };
            let mut live: Vec<(u32, u32)> = Vec::new();
            // A few sizes recur (ties are broken by address), the rest are arbitrary.
            let sizes = [512, 4096, 1 << 20, 2 << 20, 3 << 20, 8 << 20, 12 << 20, 32 << 20];
            for (op, pick, bytes) in ops {
                if op < 6 && !live.is_empty() {
                    let (x, y) = live.swap_remove(pick % live.len());
                    a.free(x);
                    p.free(y);
                } else {
                    let b = if op < 11 { sizes[pick % sizes.len()] } else { bytes };
                    live.push((a.malloc(b).unwrap(), p.malloc(b)));
                }
                proptest::prop_assert_eq!(a.segments(), p.segments());
                proptest::prop_assert_eq!(a.stats(), p.stats);
            }
        }
    }

    /// The events of whole training runs as the estimate replays them (parameters, three
    /// steps, every allocation and free): the allocator and the plain search end every
    /// event with the same figures, and the same segments.
    #[test]
    fn real_runs_choose_as_a_plain_search_does() {
        for (v, split) in [
            (
                serde_json::json!({"model": "llama3.2-1b", "batch": 2, "seq": 1024, "precision": "bf16"}),
                u64::MAX,
            ),
            (
                serde_json::json!({"model": "qwen2.5-0.5b", "batch": 3, "seq": 1024, "precision": "amp-bf16"}),
                u64::MAX,
            ),
            (
                serde_json::json!({"model": "gpt2", "batch": 4, "seq": 1024, "precision": "fp32", "recompute": "full"}),
                256 << 20,
            ),
        ] {
            let sc = crate::Scenario::from_value(&v).unwrap();
            let (_, text) = stream::events(&sc).unwrap();
            let mut a = Allocator::new(Config {
                max_split: split,
                ..Config::default()
            });
            let mut p = Plain {
                max_split: split,
                segs: Vec::new(),
                next: 0,
                stats: Stats::default(),
            };
            let mut handles = std::collections::HashMap::new();
            for (n, line) in text.iter().enumerate() {
                let w: Vec<&str> = line.split(' ').collect();
                match w[0] {
                    "a" => {
                        let bytes: u64 = w[2].parse().unwrap();
                        handles.insert(w[1], (a.malloc(bytes).unwrap(), p.malloc(bytes)));
                    }
                    "f" => {
                        let (x, y) = handles.remove(w[1]).unwrap();
                        a.free(x);
                        p.free(y);
                    }
                    _ => continue,
                }
                assert_eq!(a.stats(), p.stats, "{v} event {n}");
                if n % 64 == 0 {
                    assert_eq!(a.segments(), p.segments(), "{v} event {n}");
                }
            }
            assert_eq!(a.segments(), p.segments(), "{v}");
            assert!(text.len() > 5000, "{v}");
        }
    }

    #[test]
    fn expandable_segments_grow_one_segment_by_pages() {
        let mut a = Allocator::new(Config {
            expandable: true,
            device: 80 << 30,
            ..Config::default()
        });
        let x = a.malloc(30 * MIB).unwrap();
        let y = a.malloc(5 * MIB).unwrap();
        // One large segment, 40 MiB mapped (two 20 MiB pages).
        let st = a.stats();
        assert_eq!(st.segments, 1);
        assert_eq!(st.reserved, 40 * MIB);
        a.free(x);
        // The 30 MiB freed at the start is reused for 25 MiB (every split is allowed).
        a.malloc(25 * MIB).unwrap();
        assert_eq!(a.stats().reserved, 40 * MIB);
        // A request larger than any free block maps pages at the end, merging with the
        // free tail.
        a.malloc(10 * MIB).unwrap();
        assert_eq!(a.stats().reserved, 60 * MIB);
        a.free(y);
        assert_eq!(a.stats().segments, 1);
    }

    /// The default `Config` (a device of unbounded size) under expandable segments: its
    /// segments' addresses and sizes stay inside `u64` (they once overflowed, in debug
    /// builds at the first page mapped).
    #[test]
    fn expandable_segments_on_an_unbounded_device() {
        let mut a = Allocator::new(Config {
            expandable: true,
            ..Config::default()
        });
        let x = a.malloc(30 * MIB).unwrap();
        a.malloc(100).unwrap();
        a.free(x);
        a.malloc(50 * MIB).unwrap();
        assert_eq!(a.stats().reserved, 60 * MIB + SMALL_BUFFER);
        assert_eq!(a.stats().segments, 2);
    }

    #[test]
    fn expandable_segments_take_the_tail_block_last() {
        let mut a = Allocator::new(Config {
            expandable: true,
            device: 80 << 30,
            ..Config::default()
        });
        let x = a.malloc(8 * MIB).unwrap();
        let _y = a.malloc(4 * MIB).unwrap();
        a.free(x);
        // Free: 8 MiB at the start, 8 MiB at the end next to unmapped space. A 6 MiB
        // request takes the first: best fit counts the tail as big as it can grow.
        let z = a.malloc(6 * MIB).unwrap();
        let segs = a.segments();
        assert_eq!(segs[0].blocks[0], (6 * MIB, true));
        assert_eq!(a.stats().reserved, 20 * MIB);
        a.free(z);
    }
}
