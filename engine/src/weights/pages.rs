//! The page cache behind a memory-mapped checkpoint (docs/design/gb10.md, unified memory). On a
//! GPU that shares the host's memory (GB10), a tensor's file pages still cached after its upload
//! are a second copy of it in the same memory: the loader drops them once the device holds the
//! tensor. Dropping is `madvise(MADV_DONTNEED)` on the mapping (unmaps the pages from this
//! process; a later access faults them in again from the file, so nothing is lost) then
//! `posix_fadvise(POSIX_FADV_DONTNEED)` on the file (evicts the clean pages from the page cache).
//! The kernel evicts whole folios only: a large folio (up to 2 MiB) a range covers in part stays
//! until a later range, or the drop of the whole file at the end of a load, covers it.
use std::fs::File;
use std::os::fd::AsRawFd;

/// The system's page size (4 KiB on x86-64; 4 or 64 KiB on aarch64 kernels).
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

/// Page-aligned [start, end) covering the bytes [start, end) of a mapping of `len` bytes.
fn aligned(start: usize, end: usize, len: usize) -> (usize, usize) {
    let p = page_size();
    (
        start / p * p,
        end.div_ceil(p).saturating_mul(p).min(len.div_ceil(p) * p),
    )
}

/// Drop the pages of bytes [start, end) of `map` (a read-only mapping of all of `file` from
/// offset 0): from this process's mapping and from the page cache. Pages shared with the
/// neighbouring bytes go too (they fault back in when read). Dirty pages stay cached.
pub fn drop_pages(file: &File, map: &[u8], start: usize, end: usize) -> std::io::Result<()> {
    if start >= end || map.is_empty() {
        return Ok(());
    }
    let (s, e) = aligned(start, end.min(map.len()), map.len());
    // SAFETY: [s, e) lies within the mapping (its length rounded up to a page, as mapped);
    // MADV_DONTNEED on a read-only shared file mapping only drops the PTEs.
    let r = unsafe {
        libc::madvise(
            map.as_ptr().add(s) as *mut libc::c_void,
            e - s,
            libc::MADV_DONTNEED,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: plain syscall on an open descriptor.
    let r = unsafe {
        libc::posix_fadvise(
            file.as_raw_fd(),
            s as libc::off_t,
            (e - s) as libc::off_t,
            libc::POSIX_FADV_DONTNEED,
        )
    };
    if r != 0 {
        return Err(std::io::Error::from_raw_os_error(r));
    }
    Ok(())
}

/// Bytes of `map` whose pages are in the page cache right now (`mincore`).
pub fn resident_bytes(map: &[u8]) -> std::io::Result<u64> {
    if map.is_empty() {
        return Ok(0);
    }
    let p = page_size();
    let pages = map.len().div_ceil(p);
    let mut vec = vec![0u8; pages];
    // SAFETY: the mapping starts page-aligned and spans `pages` pages; vec has one byte each.
    let r = unsafe {
        libc::mincore(
            map.as_ptr() as *mut libc::c_void,
            map.len(),
            vec.as_mut_ptr() as *mut _,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(vec.iter().filter(|&&b| b & 1 != 0).count() as u64 * p as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// Written, synced and read through a mapping, a file is cached; dropping a middle range
    /// evicts it (mincore) and keeps the rest; dropping all evicts all; the bytes read back the
    /// same. The page cache keeps large folios (up to 2 MiB, naturally aligned) that a range
    /// only partly covers, hence the 2 MiB-aligned range and the slack.
    #[test]
    fn drop_pages_evicts_a_files_pages() {
        const MIB: usize = 1 << 20;
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/tmp");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("pages-{}.bin", std::process::id()));
        let len = 16 * MIB;
        let data: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
        {
            let mut f = File::create(&path).unwrap();
            f.write_all(&data).unwrap();
            f.sync_all().unwrap();
        }
        let f = File::open(&path).unwrap();
        // SAFETY: test file, not modified while mapped.
        let map = unsafe { memmap2::Mmap::map(&f) }.unwrap();
        assert_eq!(&map[..], &data[..]);
        let before = resident_bytes(&map).unwrap();
        assert_eq!(before, len as u64, "a file just written and read is cached");
        // The middle half, given unaligned by a byte at each end (rounded out to pages).
        drop_pages(&f, &map, 4 * MIB + 1, 12 * MIB - 1).unwrap();
        let evicted = before - resident_bytes(&map).unwrap();
        let slack = 2 * 2 * MIB as u64;
        assert!(
            evicted <= (8 * MIB + 2 * page_size()) as u64 && evicted + slack >= (8 * MIB) as u64,
            "evicted {evicted} of the 8 MiB range"
        );
        drop_pages(&f, &map, 0, len).unwrap();
        assert_eq!(resident_bytes(&map).unwrap(), 0, "the whole file dropped");
        assert_eq!(&map[..], &data[..], "dropped pages read back from the file");
        drop(map);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn aligned_ranges() {
        let p = page_size();
        assert_eq!(aligned(1, p + 1, 10 * p), (0, 2 * p));
        assert_eq!(aligned(p, 2 * p, 10 * p), (p, 2 * p));
        // Never past the mapping's last page.
        assert_eq!(aligned(0, 10 * p, 10 * p - 3), (0, 10 * p));
    }
}
