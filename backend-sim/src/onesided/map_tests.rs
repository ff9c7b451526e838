//! Map mode: the page swap ([`super::swap`]), the requester's mappings of a peer's
//! regions ([`super::mapped`]) and the copies and atomics through them ([`Link`]), two
//! devices' owners in one process.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use backend_sim_proto::memory::{MrShared, Seg};
use backend_sim_proto::qp::{DirectAtomic, DirectWrite};
use verbs_api::AccessFlags;

use super::link::Link;
use super::owner::{Owner, PeerHandle, Setting};
use super::swap::{self, Swapped};
use super::table::MrSlot;
use super::usage::Usage;

const LEN: usize = 64 << 10;
const QPN: u32 = 0x51;
const PD: u32 = 3;

/// The line of `/proc/self/maps` that holds `addr`.
fn maps_line(addr: usize) -> String {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .find(|l| {
            let (lo, hi) = l.split_once(' ').unwrap().0.split_once('-').unwrap();
            let (lo, hi) = (
                usize::from_str_radix(lo, 16).unwrap(),
                usize::from_str_radix(hi, 16).unwrap(),
            );
            (lo..hi).contains(&addr)
        })
        .unwrap_or_else(|| panic!("{addr:#x} is not mapped"))
        .to_string()
}

/// A fresh private anonymous mapping of `len` bytes (page-aligned), holding `pattern`.
fn anon(len: usize, pattern: impl Fn(usize) -> u8) -> *mut u8 {
    // SAFETY: a fresh private mapping at an address the kernel chooses.
    let p: *mut u8 = unsafe {
        rustix::mm::mmap_anonymous(
            std::ptr::null_mut(),
            len,
            rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
            rustix::mm::MapFlags::PRIVATE,
        )
    }
    .unwrap()
    .cast();
    for i in 0..len {
        // SAFETY: inside the mapping just made.
        unsafe { p.add(i).write(pattern(i)) };
    }
    p
}

fn holds(p: *const u8, len: usize, pattern: impl Fn(usize) -> u8) -> bool {
    // SAFETY: the callers pass mappings of at least `len` bytes they own.
    (0..len).all(|i| unsafe { p.add(i).read() } == pattern(i))
}

fn pattern(i: usize) -> u8 {
    (i * 7 + i / 251) as u8
}

#[test]
fn the_swap_keeps_addresses_and_bytes_and_moves_the_pages_back() {
    let p = anon(LEN, pattern);
    assert!(!maps_line(p as usize).contains("memfd"));
    // SAFETY: the mapping lives for the whole test.
    let s = unsafe { Swapped::new(p as usize, LEN) }.unwrap();
    let line = maps_line(p as usize);
    assert!(
        line.contains("memfd:rdma-sim-mr") && line.contains(" rw-s "),
        "{line}"
    );
    assert!(holds(p, LEN, pattern), "the bytes changed in the move");
    let st = rustix::fs::fstat(s.fd().unwrap()).unwrap();
    assert_eq!((st.st_ino, st.st_size as usize), (s.ino(), LEN));
    drop(s);
    let line = maps_line(p as usize);
    assert!(!line.contains("memfd") && line.contains(" rw-p "), "{line}");
    assert!(holds(p, LEN, pattern), "the bytes changed on the way back");
}

#[test]
fn ineligible_ranges_are_left_alone() {
    let page = swap::page_size();
    let p = anon(4 * page, |_| 1) as usize;
    // SAFETY: the mapping lives for the whole test.
    let unaligned = unsafe { Swapped::new(p + 8, page) };
    assert!(unaligned.is_err(), "an unaligned start");
    // SAFETY: as above.
    let short = unsafe { Swapped::new(p, page + 8) };
    assert!(short.is_err(), "an unaligned length");
    // The last page made inaccessible: a range over it is partly ineligible (a range
    // past the mapping's end would meet whatever another thread maps there).
    // SAFETY: the page is the test's own, never touched again.
    unsafe { rustix::mm::mprotect((p + 3 * page) as *mut _, page, rustix::mm::MprotectFlags::empty()) }
        .unwrap();
    // SAFETY: as above.
    let past = unsafe { Swapped::new(p + 2 * page, 2 * page) };
    assert!(past.is_err(), "a range only partly private writable memory");
    // A file's pages and shared pages are not the program's private memory.
    let file = tempfile_of(4 * page);
    let shared = [rustix::mm::MapFlags::PRIVATE, rustix::mm::MapFlags::SHARED].map(|flags| {
        // SAFETY: a fresh mapping of the file at an address the kernel chooses.
        let m = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                4 * page,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                flags,
                &file,
                0,
            )
        }
        .unwrap();
        m as usize
    });
    for m in shared {
        // SAFETY: the mapping is never unmapped in the test.
        assert!(unsafe { Swapped::new(m, page) }.is_err(), "{}", maps_line(m));
        assert!(!maps_line(m).contains("memfd"));
    }
    let stack = "7ffd0000-7ffd4000 rw-p 00000000 00:00 0                          [stack]\n";
    assert!(swap::eligible(stack, 0x7ffd_0000, 0x1000).is_err());
    let two = "1000-3000 rw-p 00000000 00:00 0 \n3000-5000 rw-p 00000000 00:00 0   [heap]\n";
    assert!(
        swap::eligible(two, 0x2000, 0x2000).is_ok(),
        "two adjacent anonymous mappings"
    );
    let hole = "1000-3000 rw-p 00000000 00:00 0 \n4000-5000 rw-p 00000000 00:00 0 \n";
    assert!(swap::eligible(hole, 0x2000, 0x2000).is_err(), "a hole");
    let ro = "1000-3000 r--p 00000000 00:00 0 \n";
    assert!(swap::eligible(ro, 0x1000, 0x1000).is_err(), "read-only");
    // The refused ranges are ordinary still.
    assert!(!maps_line(p).contains("memfd"));
}

fn tempfile_of(len: usize) -> OwnedFd {
    let dir = std::env::temp_dir().join(format!("rdma-sim-map-{}", std::process::id()));
    let fd = rustix::fs::open(
        &dir,
        rustix::fs::OFlags::RDWR | rustix::fs::OFlags::CREATE | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::from_raw_mode(0o600),
    )
    .unwrap();
    let _ = std::fs::remove_file(&dir);
    rustix::fs::ftruncate(&fd, len as u64).unwrap();
    fd
}

#[test]
fn a_forked_child_writes_its_own_copy_of_a_swapped_region() {
    let p = anon(LEN, pattern);
    // SAFETY: the mapping lives for the whole test.
    let s = unsafe { Swapped::new(p as usize, LEN) }.unwrap();
    // SAFETY: the child only writes memory and leaves with `_exit`.
    match unsafe { libc::fork() } {
        0 => {
            // SAFETY: the region is mapped in the child (a copy of the parent's space).
            unsafe { std::ptr::write_bytes(p, 0xee, LEN) };
            // SAFETY: ends the child at once, running nothing of the parent's.
            unsafe { libc::_exit(0) }
        }
        -1 => panic!("fork: {}", std::io::Error::last_os_error()),
        child => {
            let mut status = 0;
            // SAFETY: waits for the child just forked.
            assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
            assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
        }
    }
    assert!(holds(p, LEN, pattern), "the child's writes reached the parent");
    assert!(maps_line(p as usize).contains("memfd"));
    drop(s);
}

/// Device A's owner (map mode) with one connection from device B, whose [`Link`] goes
/// into A's table.
struct Two {
    a: Arc<Owner>,
    link: Link,
    _handle: PeerHandle,
}

fn two() -> Two {
    two_with(Setting::with_min_len(1, false))
}

/// [`two`], with `requester` as B's setting (A maps its regions).
fn two_with(requester: Setting) -> Two {
    let on = |s| Owner::with_setting(crate::capture::Slot::default(), s).unwrap();
    let (a, b) = (on(Setting::with_min_len(1, true)), on(requester));
    let (_, ufd) = Usage::create().unwrap();
    let handle = Link::register(&a, ufd.as_fd()).unwrap();
    let link = Link::new(
        &b,
        Some(a.table().fd()),
        ufd.as_fd(),
        Some(rustix::process::getpid()),
        None,
    );
    assert!(link.goes_out());
    Two {
        a,
        link,
        _handle: handle,
    }
}

/// A region of A, mapped if map mode takes it, and published.
struct Region {
    mr: Arc<MrShared>,
    slot: Option<MrSlot>,
    _mapped: Option<Swapped>,
}

fn region(t: &Two, key: u32, access: AccessFlags) -> Region {
    let mr = Arc::new(MrShared::new_owned(PD, key, LEN, access | AccessFlags::LOCAL_WRITE).unwrap());
    let mapped = t.a.map_region(&mr);
    let slot = t.a.publish_mr(&mr, mapped.as_ref());
    Region {
        mr,
        slot,
        _mapped: mapped,
    }
}

fn local(len: usize, fill: u8) -> Seg {
    let mr = Arc::new(MrShared::new_owned(1, 1, len, AccessFlags::LOCAL_WRITE).unwrap());
    let s = Seg { mr, offset: 0, len };
    assert!(s.copy_in(0, &vec![fill; len]));
    s
}

fn bytes(mr: &MrShared, at: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    assert!(mr.copy_out(at, &mut v));
    v
}

const ALL: AccessFlags = AccessFlags::REMOTE_WRITE
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

#[test]
fn writes_reads_and_atomics_go_through_the_mapping_and_keep_every_check() {
    let t = two();
    t.a.publish_qp(QPN, PD, ALL).unwrap();
    let r = region(&t, 0x77, ALL);
    assert!(r._mapped.is_some(), "an owned page-aligned region was not mapped");
    let base = r.mr.addr();
    let add = |add| DirectAtomic::FetchAdd { add };
    // WRITE: the bytes land at the offset asked, nowhere else.
    assert!(t
        .link
        .write(QPN, 0x77, base + 100, &[local(300, 0xab), local(20, 0xcd)]));
    assert_eq!(bytes(&r.mr, 100, 300), vec![0xab; 300]);
    assert_eq!(bytes(&r.mr, 400, 20), vec![0xcd; 20]);
    assert_eq!(bytes(&r.mr, 420, 8), vec![0; 8]);
    assert_eq!(bytes(&r.mr, 92, 8), vec![0; 8]);
    // READ: the region's bytes arrive.
    let into = local(320, 0);
    assert!(t.link.read(QPN, 0x77, base + 100, std::slice::from_ref(&into)));
    let mut got = vec![0; 320];
    assert!(into.copy_out(0, &mut got));
    assert_eq!(got[..300], [0xab; 300]);
    assert_eq!(got[300..], [0xcd; 20]);
    // Atomics: the original value back, the new one in the region.
    assert_eq!(t.link.atomic(QPN, 0x77, base + 1024, add(5)), Some(0));
    assert_eq!(t.link.atomic(QPN, 0x77, base + 1024, add(2)), Some(5));
    let cas = |compare, swap| DirectAtomic::CompareSwap { compare, swap };
    assert_eq!(t.link.atomic(QPN, 0x77, base + 1024, cas(1, 9)), Some(7));
    assert_eq!(t.link.atomic(QPN, 0x77, base + 1024, cas(7, 9)), Some(7));
    assert_eq!(bytes(&r.mr, 1024, 8), 9u64.to_ne_bytes());
    // Refusals: a bad rkey, a misaligned or out-of-bounds word, a range past the end,
    // another QP.
    assert!(!t.link.write(0x52, 0x77, base, &[local(64, 1)]));
    assert!(!t.link.write(QPN, 0x78, base, &[local(64, 1)]));
    assert_eq!(t.link.atomic(QPN, 0x78, base, add(1)), None);
    assert_eq!(t.link.atomic(QPN, 0x77, base + 4, add(1)), None);
    assert_eq!(t.link.atomic(QPN, 0x77, base + LEN as u64, add(1)), None);
    assert!(!t.link.write(QPN, 0x77, base + LEN as u64 - 10, &[local(64, 1)]));
    assert!(!t
        .link
        .read(QPN, 0x77, base - 8, std::slice::from_ref(&local(64, 0))));
    assert_eq!(bytes(&r.mr, LEN - 10, 10), vec![0; 10]);
    // A region without the right: no WRITE, READ or atomic by that right.
    let w = region(&t, 0x99, AccessFlags::REMOTE_WRITE);
    assert!(w._mapped.is_some());
    let wb = w.mr.addr();
    assert!(t.link.write(QPN, 0x99, wb, &[local(64, 2)]));
    assert!(!t.link.read(QPN, 0x99, wb, std::slice::from_ref(&local(64, 0))));
    assert_eq!(t.link.atomic(QPN, 0x99, wb, add(1)), None);
    assert_eq!(bytes(&w.mr, 0, 8), vec![2; 8]);
    // A deregistered region: refused from the revocation on.
    t.a.revoke_mr(r.slot.unwrap());
    assert!(!t.link.write(QPN, 0x77, base, &[local(64, 3)]));
    assert!(!t.link.read(QPN, 0x77, base, std::slice::from_ref(&local(64, 0))));
    assert_eq!(t.link.atomic(QPN, 0x77, base + 1024, add(1)), None);
    assert_eq!(bytes(&r.mr, 0, 64), vec![0; 64]);
    assert_eq!(bytes(&r.mr, 1024, 8), 9u64.to_ne_bytes());
    // The key again, on another region (the slot's next generation): the old mapping
    // is dropped, the bytes go to the new region.
    let again = region(&t, 0x77, ALL);
    assert!(t.link.write(QPN, 0x77, again.mr.addr(), &[local(64, 6)]));
    assert_eq!(bytes(&again.mr, 0, 64), vec![6; 64]);
    assert_eq!(bytes(&r.mr, 0, 64), vec![0; 64]);
    // A region deregistered is unmapped here once another is mapped: the one with the
    // key again and the one without the right are what stays.
    assert_eq!(t.link.mapped_regions(), 2);
    let w_slot = w.slot.unwrap();
    t.a.revoke_mr(w_slot);
    let third = region(&t, 0x123, ALL);
    assert!(t.link.write(QPN, 0x123, third.mr.addr(), &[local(64, 7)]));
    assert_eq!(t.link.mapped_regions(), 2);
}

/// A READ shorter than the requester's shortest READ goes the normal way before any
/// check (map mode's default keeps READs at 16 KiB while WRITEs start lower); one as
/// long is placed.
#[test]
fn a_read_shorter_than_the_read_threshold_is_not_placed() {
    let t = two_with(Setting {
        min_len: 1,
        read_min_len: 64,
        map: true,
    });
    t.a.publish_qp(QPN, PD, ALL).unwrap();
    let r = region(&t, 0x77, ALL);
    let base = r.mr.addr();
    assert!(r._mapped.is_some(), "an owned page-aligned region was not mapped");
    assert!(t.link.write(QPN, 0x77, base, &[local(300, 0xab)]));
    assert!(!t.link.read(QPN, 0x77, base, std::slice::from_ref(&local(63, 0))));
    assert!(t.link.read(QPN, 0x77, base, std::slice::from_ref(&local(64, 0))));
}

#[test]
fn an_atomic_on_an_unmapped_region_is_refused_and_copies_take_the_other_way() {
    let t = two();
    t.a.publish_qp(QPN, PD, ALL).unwrap();
    // Not page-aligned in length: published, not mapped.
    let mr = Arc::new(MrShared::new_owned(PD, 0x55, 1000, ALL | AccessFlags::LOCAL_WRITE).unwrap());
    assert!(t.a.map_region(&mr).is_none());
    let _slot = t.a.publish_mr(&mr, None).unwrap();
    let add = DirectAtomic::FetchAdd { add: 1 };
    assert_eq!(t.link.atomic(QPN, 0x55, mr.addr(), add), None);
    assert!(
        t.link.write(QPN, 0x55, mr.addr() + 8, &[local(100, 4)]),
        "no process_vm_writev"
    );
    assert_eq!(bytes(&mr, 8, 100), vec![4; 100]);
}

#[test]
fn an_atomic_racing_the_owners_own_atomics_loses_no_increment() {
    const N: u64 = 100_000;
    let t = two();
    t.a.publish_qp(QPN, PD, ALL).unwrap();
    let r = region(&t, 0x31, ALL);
    assert!(r._mapped.is_some());
    let word = Seg {
        mr: r.mr.clone(),
        offset: 64,
        len: 8,
    };
    let done = std::sync::atomic::AtomicBool::new(false);
    let owners = std::thread::scope(|s| {
        // The owner's responder runs its atomics on its own region, as `Seg::atomic`,
        // for as long as the requester runs its own.
        let owner = s.spawn(|| {
            let mut n = 0u64;
            while !done.load(Ordering::Relaxed) || n < N {
                word.atomic(|w| w.fetch_add(1, Ordering::SeqCst)).unwrap();
                n += 1;
            }
            n
        });
        for _ in 0..N {
            let add = DirectAtomic::FetchAdd { add: 1 };
            assert!(t.link.atomic(QPN, 0x31, r.mr.addr() + 64, add).is_some());
        }
        done.store(true, Ordering::Relaxed);
        owner.join().unwrap()
    });
    assert_eq!(word.atomic(|w| w.load(Ordering::SeqCst)), Some(N + owners));
}

#[test]
fn a_memfd_that_does_not_check_out_is_never_mapped() {
    use super::mapped::Regions;
    use super::table::{self, Op, PeerTable, Request};
    let target: Vec<AtomicU64> = (0..LEN / 8).map(|_| AtomicU64::new(0)).collect();
    let addr = target.as_ptr() as u64;
    let real = memfd_of(LEN as u64, true);
    let ino = rustix::fs::fstat(&real).unwrap().st_ino;
    let short = memfd_of(LEN as u64 / 2, true);
    let unsealed = memfd_of(LEN as u64, false);
    let file = tempfile_of(LEN);
    let fd = |f: &OwnedFd| f.as_raw_fd() as u32;
    let ino_of = |f: &OwnedFd| rustix::fs::fstat(f).unwrap().st_ino;
    let cases = [
        ("the right one", (fd(&real), ino), true),
        ("another inode", (fd(&real), ino + 1), false),
        ("another descriptor", (fd(&unsealed), ino), false),
        ("shorter than the region", (fd(&short), ino_of(&short)), false),
        ("not sealed", (fd(&unsealed), ino_of(&unsealed)), false),
        ("a file on disk", (fd(&file), ino_of(&file)), false),
        ("no descriptor", (u32::MAX, ino), false),
    ];
    let owner = table::OwnerTable::create(0, 0).unwrap();
    let qp = owner.publish_qp(QPN, PD, ALL).unwrap();
    let (_, ufd) = owner.add_peer().unwrap();
    let usage = Usage::map(ufd.as_fd()).unwrap();
    let peer = PeerTable::map(owner.fd()).unwrap();
    for (what, mapped, ok) in cases {
        let slot = owner
            .publish_mr(0x44, PD, ALL, (addr, LEN as u64), Some(mapped))
            .unwrap();
        let req = Request {
            qp_slot: qp.index(),
            qpn: QPN,
            rkey: 0x44,
            addr,
            len: 64,
            op: Op::Write,
        };
        let g = peer.check(&usage, &req).unwrap();
        let regions = Regions::new(rustix::process::getpid());
        assert_eq!(
            regions.view(&g, |s| peer.published_map(s)).is_some(),
            ok,
            "{what}"
        );
        assert_eq!(regions.cached(), ok as usize, "{what}");
        drop(g);
        owner.revoke_mr(slot, std::time::Duration::from_secs(5));
    }
}

fn memfd_of(len: u64, sealed: bool) -> OwnedFd {
    use rustix::fs::{MemfdFlags, SealFlags};
    let fd = rustix::fs::memfd_create("t", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
    rustix::fs::ftruncate(&fd, len).unwrap();
    if sealed {
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW).unwrap();
    }
    fd
}

#[test]
fn map_is_on_with_pages_moved_and_the_rest_reads_as_before() {
    use super::owner::{parse, MAP_MIN_LEN, MIN_LEN};
    let on = |min_len, map| Some(Setting::with_min_len(min_len, map));
    let map = parse(Some("map")).unwrap();
    assert_eq!(
        (map.min_len, map.read_min_len, map.map),
        (MAP_MIN_LEN, MIN_LEN, true)
    );
    assert_eq!(parse(Some("on")), on(MIN_LEN, false));
    assert_eq!(parse(Some("4096")), on(4096, false));
    assert_eq!(parse(Some("map:4096")), on(4096, true));
    assert_eq!(parse(Some("map:0")), on(1, true));
    assert_eq!(parse(Some("off")), None);
    // A number with `map` is the mapped path's shortest; copies with `process_vm_*` keep
    // theirs.
    assert_eq!(parse(Some("map:64")).unwrap().cma_min_len(), MIN_LEN);
    assert_eq!(parse(Some("64")).unwrap().cma_min_len(), 64);
}

/// The verbs allow a program to unmap a region's memory before it deregisters it:
/// moving the pages back then touches nothing, neither a hole nor what the program
/// mapped there since.
#[test]
fn memory_unmapped_before_deregistration_is_left_alone() {
    let p = anon(LEN, pattern);
    // SAFETY: the range stays the test's own; unmapped below, as a program may.
    let s = unsafe { Swapped::new(p as usize, LEN) }.unwrap();
    // SAFETY: the range is the test's own mapping.
    unsafe { rustix::mm::munmap(p.cast(), LEN) }.unwrap();
    drop(s);
    let q = anon(2 * LEN, |_| 0);
    // SAFETY: as above.
    let s = unsafe { Swapped::new(q as usize, LEN) }.unwrap();
    // The program maps something else at the region's address (shared memory).
    // SAFETY: replaces the test's own mapping with a fresh one.
    let again: *mut u8 = unsafe {
        rustix::mm::mmap_anonymous(
            q.cast(),
            LEN,
            rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
            rustix::mm::MapFlags::SHARED | rustix::mm::MapFlags::FIXED,
        )
    }
    .unwrap()
    .cast();
    assert_eq!(again, q);
    // SAFETY: inside the mapping just made.
    unsafe { std::ptr::write_bytes(q, 0x5a, LEN) };
    drop(s);
    assert!(holds(q, LEN, |_| 0x5a));
    let line = maps_line(q as usize);
    assert!(line.contains(" rw-s ") && !line.contains("memfd"), "{line}");
}

/// The inode of the file `line` of `/proc/self/maps` maps.
fn inode(line: &str) -> u64 {
    line.split_whitespace().nth(4).unwrap().parse().unwrap()
}

/// How many mappings of this process map the file with inode `ino` (a memfd's).
fn mappings_of(ino: u64) -> usize {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .filter(|l| l.contains("memfd:rdma-sim-mr") && inode(l) == ino)
        .count()
}

/// `ibv_rereg_mr` of a region map mode moved (a profile that has rereg, mlx5's), to a
/// new range: the old range's pages go back to private memory with their bytes, the new
/// range's move into a new memfd published under the same keys, the peer's next WRITE
/// through those keys lands there (placed through its mapping of the new memfd), and the
/// peer no longer maps the old memfd.
#[test]
fn rereg_in_map_mode_moves_the_region_and_the_peer_follows() {
    use verbs_api::{poll_n, MemoryRegion, ProtectionDomain, QueuePair, RcParams, SendWr, Sge, WcStatus};
    super::owner::TEST_SETTING.set(Some(Setting::with_min_len(1, true)));
    let config = crate::SimConfig {
        profile: crate::Profile::Mlx5,
        ..crate::SimConfig::default()
    };
    // (The setting is this thread's: it ends with the test whatever happens.)
    let super::verbs_tests::Pair {
        ctx,
        pd,
        cq,
        a,
        b: _b,
    } = super::verbs_tests::pair_in(config, &RcParams::default());
    super::owner::TEST_SETTING.set(None);
    let placed = || ctx.dev.onesided.as_ref().unwrap().placed();

    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let (old, new) = (anon(LEN, |_| 0), anon(LEN, |_| 0));
    // SAFETY: both mappings live for the whole test.
    let mut dst = unsafe { pd.reg_mr_raw(old, LEN, access) }.unwrap();
    let src = pd.reg_mr(LEN, AccessFlags::LOCAL_WRITE).unwrap();
    let old_ino = inode(&maps_line(old as usize));
    assert!(maps_line(old as usize).contains("memfd:rdma-sim-mr"));
    let write = |fill: u8, to: (u64, u32)| {
        src.write(0, &vec![fill; LEN]).unwrap();
        let before = placed();
        let sge = [Sge::new(src.addr(), LEN as u32, src.lkey())];
        a.post_send(&[SendWr::write(1, &sge, to).signaled()]).unwrap();
        let w = poll_n(&cq, 1, std::time::Duration::from_secs(10)).unwrap();
        assert_eq!(w[0].status, WcStatus::Success, "{w:?}");
        assert_eq!(placed(), before + 1, "the WRITE went the normal way");
    };
    write(0x11, (dst.addr(), dst.rkey()));
    assert!(holds(old, LEN, |_| 0x11));
    assert_eq!(mappings_of(old_ino), 2, "the owner's and the peer's mapping");

    let keys = (dst.lkey(), dst.rkey());
    // SAFETY: as above.
    unsafe { pd.rereg_mr_raw(&mut dst, new, LEN, None) }.unwrap();
    assert_eq!((dst.lkey(), dst.rkey(), dst.addr()), (keys.0, keys.1, new as u64));
    let line = maps_line(old as usize);
    assert!(!line.contains("memfd") && line.contains(" rw-p "), "{line}");
    assert!(
        holds(old, LEN, |_| 0x11),
        "the old range's bytes changed on the way back"
    );
    let new_ino = inode(&maps_line(new as usize));
    assert!(maps_line(new as usize).contains("memfd:rdma-sim-mr"));
    assert_ne!(new_ino, old_ino);

    write(0x22, (dst.addr(), dst.rkey()));
    assert!(holds(new, LEN, |_| 0x22));
    assert!(
        holds(old, LEN, |_| 0x11),
        "a WRITE after the rereg reached the old range"
    );
    assert_eq!(mappings_of(new_ino), 2, "the owner's and the peer's mapping");
    assert_eq!(mappings_of(old_ino), 0, "the peer still maps the old memfd");
    drop(dst);
}
