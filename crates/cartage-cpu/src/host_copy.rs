//! Copying device memory out into a caller's host slice (`read`, hence `to_vec`): one `memcpy`,
//! split across the backend's threads when it is large.
//!
//! A fresh destination (a vector just allocated for the result) costs a page fault per 4 KiB
//! page on first touch, which bounds a single-threaded copy far below memory bandwidth. Large
//! copies therefore ask the kernel for transparent huge pages over the destination
//! ([`advise_huge_pages`]: 512 times fewer faults where the system allows them) and fault and copy
//! their parts on several threads.

use rayon::prelude::*;

/// Copies from this size on are split across threads and advised onto huge pages.
pub(crate) const PARALLEL_BYTES: usize = 8 << 20;

/// The smallest part one thread copies.
const PART_BYTES: usize = 2 << 20;

/// Ask for transparent huge pages over the 2 MiB-aligned interior of `dst` (Linux; advice only:
/// nothing changes where the system does not use them, and the contents are unaffected).
pub(crate) fn advise_huge_pages(dst: &mut [u8]) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let start = (dst.as_mut_ptr() as usize).next_multiple_of(HUGE);
        let end = (dst.as_mut_ptr() as usize + dst.len()) & !(HUGE - 1);
        if end > start {
            // SAFETY: `[start, end)` lies inside `dst`, memory this process owns and the caller
            // borrows mutably; MADV_HUGEPAGE only changes how future page faults are served
            // (it never changes or frees contents), and its failure is harmless advice refused.
            let status = unsafe {
                libc::madvise(
                    std::ptr::with_exposed_provenance_mut::<libc::c_void>(start),
                    end - start,
                    libc::MADV_HUGEPAGE,
                )
            };
            if status != 0 {
                tracing::trace!("madvise(MADV_HUGEPAGE) refused; copying onto ordinary pages");
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = dst;
}

/// Copy `src` into `dst` (equal lengths): on `pool`'s threads when large, else one `memcpy`.
pub(crate) fn copy_out(pool: Option<&rayon::ThreadPool>, src: &[u8], dst: &mut [u8]) {
    debug_assert_eq!(src.len(), dst.len());
    let threads = pool.map_or(1, rayon::ThreadPool::current_num_threads);
    if dst.len() < PARALLEL_BYTES || threads < 2 {
        dst.copy_from_slice(src);
        return;
    }
    advise_huge_pages(dst);
    let part = dst.len().div_ceil(threads).max(PART_BYTES);
    match pool {
        Some(pool) => pool.install(|| copy_parts(src, dst, part)),
        None => copy_parts(src, dst, part),
    }
}

/// `src` into `dst` in parts of `part` bytes, in parallel.
fn copy_parts(src: &[u8], dst: &mut [u8], part: usize) {
    dst.par_chunks_mut(part)
        .zip(src.par_chunks(part))
        .for_each(|(d, s)| d.copy_from_slice(s));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_and_small_copies_are_exact() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().unwrap();
        for len in [0, 1, 4095, PARALLEL_BYTES - 1, PARALLEL_BYTES + 12_345] {
            let src: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
            let mut dst = vec![0u8; len];
            copy_out(Some(&pool), &src, &mut dst);
            assert!(dst == src, "{len} bytes");
        }
    }

    #[test]
    fn advice_keeps_the_contents() {
        let mut bytes: Vec<u8> = (0..(5usize << 20)).map(|i| (i % 13) as u8).collect();
        advise_huge_pages(&mut bytes);
        assert!(bytes.iter().enumerate().all(|(i, &b)| b == (i % 13) as u8));
    }
}
