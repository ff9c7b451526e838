//! Whether caller memory may be registered (`man ibv_reg_mr` on memory the program
//! passes): what the kernel checks when it pins a region's pages (`ib_umem_get` in
//! drivers/infiniband/core/umem.c), so that a program with a bad length or pointer gets
//! the error libibverbs gives rather than a region a peer can read or write anywhere.
//!
//! - A range that wraps past the top of the address space, or spans more than 2^32 pages,
//!   is EINVAL (the kernel refuses both before it pins anything).
//! - Every page of the range must be mapped and readable, and writable when the access
//!   asks for writes (`LOCAL_WRITE`, `REMOTE_WRITE`, `REMOTE_ATOMIC`: the kernel pins
//!   with `FOLL_WRITE` then): otherwise EFAULT, as `pin_user_pages` fails.
//!
//! The sim pins nothing (it reaches registered memory through the process's own address
//! space), so it asks the kernel how the range is mapped: one `PROCMAP_QUERY` ioctl on
//! `/proc/self/maps` per mapping the range crosses (Linux 6.11 and later), or the text of
//! `/proc/self/maps` on older kernels. The file is opened for each registration (an
//! open file would describe the parent's address space in a forked child). Without
//! `/proc`, only the presence of the pages is checked (`msync(2)` fails with ENOMEM on a
//! hole), not their protection.
//!
//! This is a check at registration, not a pin: memory unmapped or made read-only while
//! registered is the program's error, as freeing it would be (docs/cabi.md's limits).

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::AsRawFd;

use verbs_api::{AccessFlags, Error, Result};

const CALL: &str = "ibv_reg_mr";

/// Checks that `len` bytes at `addr` may be registered with `access` (see the module
/// docs); an empty range reaches nothing and passes.
pub fn check(addr: usize, len: usize, access: AccessFlags) -> Result<()> {
    // The kernel's `ib_access_writable()`: a window bound to the region may grant writes.
    let write = access.intersects(
        AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_ATOMIC
            | AccessFlags::MW_BIND,
    );
    check_range(addr, len, write)
}

/// [`check`] with the write requirement given: `write` asks for writable pages.
pub fn check_range(addr: usize, len: usize, write: bool) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    let page = page_size();
    let Some(end) = addr
        .checked_add(len)
        .filter(|e| e.checked_next_multiple_of(page).is_some())
    else {
        return Err(Error::invalid(
            CALL,
            format!("{len} bytes at {addr:#x} wrap past the top of the address space"),
        ));
    };
    let first = addr - addr % page;
    let pages = (end.next_multiple_of(page) - first) / page;
    if pages > u32::MAX as usize {
        return Err(Error::invalid(
            CALL,
            format!("{len} bytes at {addr:#x} span {pages} pages, more than a region may (2^32)"),
        ));
    }
    let span = Span { first, end, write };
    let maps = match File::open("/proc/self/maps") {
        Ok(f) => f,
        Err(e) => {
            tracing::debug!(
                "ibv_reg_mr: /proc/self/maps cannot be read ({e}): checking the pages' presence only"
            );
            return span.present();
        }
    };
    match query(&maps, first) {
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTTY | libc::EINVAL)) => {
            let mut text = Vec::new();
            (&maps)
                .read_to_end(&mut text)
                .map_err(|e| Error::from_io("read /proc/self/maps", e))?;
            span.verdict(parse_maps(&text).map(Ok))
        }
        first_vma => {
            let mut next = Some(first_vma);
            let vmas = std::iter::from_fn(|| {
                let v = next.take()?;
                if let Ok(Some(m)) = &v {
                    next = Some(query(&maps, m.end));
                }
                v.transpose()
            });
            span.verdict(vmas)
        }
    }
}

/// The system's page size.
fn page_size() -> usize {
    // SAFETY: sysconf reads a constant of the system.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p)
        .ok()
        .filter(|p| p.is_power_of_two())
        .unwrap_or(4096)
}

/// One mapping of the address space: `start..end` and its protection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Vma {
    start: usize,
    end: usize,
    read: bool,
    write: bool,
}

/// The pages a registration covers (`first` page-aligned, `end` exclusive).
#[derive(Clone, Copy, Debug)]
struct Span {
    first: usize,
    end: usize,
    write: bool,
}

impl Span {
    /// Walks `vmas` (in address order, from any point): every page of the span must be
    /// in one, readable, and writable if asked.
    fn verdict(&self, vmas: impl Iterator<Item = io::Result<Vma>>) -> Result<()> {
        let fault = |reason: String| Error::BadAddress { call: CALL, reason };
        let mut at = self.first;
        for v in vmas {
            let v = v.map_err(|e| Error::from_io("PROCMAP_QUERY", e))?;
            if v.end <= at {
                continue;
            }
            if v.start > at {
                return Err(fault(format!(
                    "{:#x}..{:#x} is not mapped",
                    at,
                    v.start.min(self.end)
                )));
            }
            if !v.read {
                return Err(fault(format!(
                    "{:#x}..{:#x} is mapped without read access",
                    v.start, v.end
                )));
            }
            if self.write && !v.write {
                return Err(fault(format!(
                    "{:#x}..{:#x} is mapped read-only, and the access asks for writes",
                    v.start, v.end
                )));
            }
            at = v.end;
            if at >= self.end {
                return Ok(());
            }
        }
        Err(fault(format!("{:#x}..{:#x} is not mapped", at, self.end)))
    }

    /// Without `/proc`: whether every page is mapped at all (not its protection).
    fn present(&self) -> Result<()> {
        // SAFETY: MS_ASYNC on anonymous or file memory writes nothing back and changes no
        // mapping; the kernel only walks the range's mappings (ENOMEM on a hole).
        let rc = unsafe {
            libc::msync(
                self.first as *mut libc::c_void,
                self.end - self.first,
                libc::MS_ASYNC,
            )
        };
        if rc == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::ENOMEM) => Err(Error::BadAddress {
                call: CALL,
                reason: format!("{:#x}..{:#x} is not all mapped", self.first, self.end),
            }),
            _ => Err(Error::from_io("msync", e)),
        }
    }
}

/// `struct procmap_query` (include/uapi/linux/fs.h, Linux 6.11).
#[repr(C)]
#[derive(Default)]
struct ProcmapQuery {
    size: u64,
    query_flags: u64,
    query_addr: u64,
    vma_start: u64,
    vma_end: u64,
    vma_flags: u64,
    vma_page_size: u64,
    vma_offset: u64,
    inode: u64,
    dev_major: u32,
    dev_minor: u32,
    vma_name_size: u32,
    build_id_size: u32,
    vma_name_addr: u64,
    build_id_addr: u64,
}

/// `PROCMAP_QUERY`: `_IOWR('f', 17, struct procmap_query)`.
const PROCMAP_QUERY: u64 = (3 << 30) | ((size_of::<ProcmapQuery>() as u64) << 16) | ((b'f' as u64) << 8) | 17;
const VMA_READABLE: u64 = 0x01;
const VMA_WRITABLE: u64 = 0x02;
/// The mapping covering the address, or the next one above it.
const COVERING_OR_NEXT_VMA: u64 = 0x10;

/// The mapping at or above `addr` (`None`: there is none), asked of the kernel; ENOTTY
/// or EINVAL on a kernel without the ioctl.
fn query(maps: &File, addr: usize) -> io::Result<Option<Vma>> {
    let mut q = ProcmapQuery {
        size: size_of::<ProcmapQuery>() as u64,
        query_flags: COVERING_OR_NEXT_VMA,
        query_addr: addr as u64,
        ..ProcmapQuery::default()
    };
    // SAFETY: PROCMAP_QUERY reads and writes the `struct procmap_query` it is given, whose
    // size it is told; no name or build-id buffer is asked for (both zero).
    let rc = unsafe { libc::ioctl(maps.as_raw_fd(), PROCMAP_QUERY as _, &mut q as *mut ProcmapQuery) };
    if rc == 0 {
        return Ok(Some(Vma {
            start: q.vma_start as usize,
            end: q.vma_end as usize,
            read: q.vma_flags & VMA_READABLE != 0,
            write: q.vma_flags & VMA_WRITABLE != 0,
        }));
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::ENOENT) => Ok(None),
        _ => Err(e),
    }
}

/// The mappings of `/proc/self/maps`' text ("start-end perms offset dev inode path" per
/// line); a line that does not parse is skipped.
fn parse_maps(text: &[u8]) -> impl Iterator<Item = Vma> + '_ {
    let hex = |b: &[u8]| usize::from_str_radix(std::str::from_utf8(b).ok()?, 16).ok();
    text.split(|&b| b == b'\n').filter_map(move |line| {
        let mut fields = line.split(|&b| b == b' ');
        let range = fields.next()?;
        let perms = fields.next()?;
        let dash = range.iter().position(|&b| b == b'-')?;
        Some(Vma {
            start: hex(&range[..dash])?,
            end: hex(&range[dash + 1..])?,
            read: perms.first() == Some(&b'r'),
            write: perms.get(1) == Some(&b'w'),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An anonymous private mapping of `pages` pages with `prot`, unmapped on drop.
    struct Map {
        base: *mut u8,
        len: usize,
    }

    impl Map {
        fn new(pages: usize, prot: libc::c_int) -> Map {
            let len = pages * page_size();
            const ANON: libc::c_int = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
            // SAFETY: a fresh anonymous mapping; no existing memory is touched.
            let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, ANON, -1, 0) };
            assert_ne!(p, libc::MAP_FAILED);
            Map { base: p.cast(), len }
        }

        fn addr(&self, page: usize) -> usize {
            self.base as usize + page * page_size()
        }

        /// Changes the protection of page `page`.
        fn protect(&self, page: usize, prot: libc::c_int) {
            // SAFETY: the page is part of this mapping, which nothing else uses.
            let r = unsafe { libc::mprotect(self.addr(page) as *mut _, page_size(), prot) };
            assert_eq!(r, 0);
        }

        /// Unmaps page `page` (a hole in the mapping).
        fn hole(&self, page: usize) {
            // SAFETY: as `protect`.
            assert_eq!(unsafe { libc::munmap(self.addr(page) as *mut _, page_size()) }, 0);
        }
    }

    impl Drop for Map {
        fn drop(&mut self) {
            // SAFETY: unmaps what `new` mapped (holes in it are fine to unmap again).
            unsafe { libc::munmap(self.base.cast(), self.len) };
        }
    }

    const RW: libc::c_int = libc::PROT_READ | libc::PROT_WRITE;

    fn errno(r: Result<()>) -> i32 {
        r.expect_err("refused").errno()
    }

    /// Every kind of range, checked through the kernel's answer (`check_range`, whichever
    /// way this kernel gives it) and through the text of /proc/self/maps alike.
    #[test]
    fn ranges_are_refused_as_the_kernel_refuses_to_pin_them() {
        let pg = page_size();
        let m = Map::new(8, RW);
        m.protect(2, libc::PROT_READ);
        m.protect(3, libc::PROT_NONE);
        m.hole(5);
        let text = || {
            let mut t = Vec::new();
            File::open("/proc/self/maps")
                .unwrap()
                .read_to_end(&mut t)
                .unwrap();
            t
        };
        let cases: [(usize, usize, bool, Option<i32>); 10] = [
            (m.addr(0), 2 * pg, true, None),
            (m.addr(0) + 100, pg, true, None),
            (m.addr(0), 3 * pg, false, None),
            (m.addr(0), 3 * pg, true, Some(libc::EFAULT)),
            (m.addr(2), pg, false, None),
            (m.addr(2), pg, true, Some(libc::EFAULT)),
            (m.addr(3), 1, false, Some(libc::EFAULT)),
            (m.addr(4), 2 * pg, false, Some(libc::EFAULT)),
            (m.addr(6), 2 * pg, true, None),
            (m.addr(4) + pg - 1, 2, false, Some(libc::EFAULT)),
        ];
        for (addr, len, write, want) in cases {
            let got = check_range(addr, len, write).err().map(|e| e.errno());
            assert_eq!(
                got,
                want,
                "{len} bytes at page {} (write {write})",
                (addr - m.addr(0)) / pg
            );
            let t = text();
            let first = addr - addr % pg;
            let span = Span {
                first,
                end: addr + len,
                write,
            };
            let by_text = span.verdict(parse_maps(&t).map(Ok)).err().map(|e| e.errno());
            assert_eq!(
                by_text,
                want,
                "by text: {len} bytes at page {}",
                (addr - m.addr(0)) / pg
            );
        }
    }

    #[test]
    fn wrapping_and_oversized_ranges_are_einval_and_empty_ones_pass() {
        let pg = page_size();
        assert_eq!(
            errno(check_range(usize::MAX - pg + 1, 2 * pg, false)),
            libc::EINVAL
        );
        assert_eq!(
            errno(check_range(usize::MAX - 10, 5, false)),
            libc::EINVAL,
            "the end's page wraps"
        );
        let b = vec![0u8; 8192];
        assert_eq!(
            errno(check_range(b.as_ptr() as usize, 1 << 62, true)),
            libc::EINVAL
        );
        assert_eq!(
            errno(check_range(b.as_ptr() as usize, 1 << 40, true)),
            libc::EFAULT
        );
        assert_eq!(errno(check_range(0x1000, 4096, false)), libc::EFAULT);
        check_range(b.as_ptr() as usize, b.len(), true).unwrap();
        check_range(0, 0, true).unwrap();
    }

    #[test]
    fn without_proc_a_hole_is_still_found() {
        let pg = page_size();
        let m = Map::new(3, RW);
        m.hole(1);
        let span = |from: usize, pages: usize| Span {
            first: m.addr(from),
            end: m.addr(from) + pages * pg,
            write: true,
        };
        span(0, 1).present().unwrap();
        assert_eq!(errno(span(0, 3).present()), libc::EFAULT);
    }

    #[test]
    fn the_text_parser_reads_every_field_it_needs() {
        let t = b"55d0c0a00000-55d0c0a21000 rw-p 00000000 00:00 0                          [heap]\n\
                  7f00000000-7f00001000 r--s 00001000 08:01 1234 /lib/x.so\n\
                  garbage\n\
                  ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0  [vsyscall]\n";
        let v: Vec<Vma> = parse_maps(t).collect();
        assert_eq!(
            v,
            [
                Vma {
                    start: 0x55d0c0a00000,
                    end: 0x55d0c0a21000,
                    read: true,
                    write: true
                },
                Vma {
                    start: 0x7f00000000,
                    end: 0x7f00001000,
                    read: true,
                    write: false
                },
                Vma {
                    start: 0xffffffffff600000,
                    end: 0xffffffffff601000,
                    read: false,
                    write: false
                },
            ]
        );
    }
}
