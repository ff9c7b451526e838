//! `reg_mr_raw` over memory the caller does not own: refused as the kernel refuses to pin
//! it (`ib_umem_get`), although the caller's `unsafe` contract already forbids it, so
//! that a caller's bug gets an error instead of a region peers can read or write outside
//! its memory. Read-only memory registered for remote reads serves an RDMA READ.

use std::time::Duration;

use backend_sim::SimBackend;
use verbs_api::*;

fn page() -> usize {
    // SAFETY: sysconf reads a constant of the system.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

/// Fresh pages of anonymous memory, unmapped on drop.
struct Map {
    base: *mut u8,
    len: usize,
}

impl Map {
    /// `pages` pages with protection `prot`.
    fn new(pages: usize, prot: libc::c_int) -> Map {
        let (len, flags) = (pages * page(), libc::MAP_PRIVATE | libc::MAP_ANONYMOUS);
        // SAFETY: a fresh anonymous mapping; no existing memory is touched.
        let base = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, -1, 0) };
        assert_ne!(base, libc::MAP_FAILED);
        Map {
            base: base.cast(),
            len,
        }
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: unmaps what `new` mapped; no region over it is alive any more.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

/// The error of a registration that must fail.
fn error(r: Result<backend_sim::SimMr>) -> Error {
    match r {
        Ok(mr) => panic!("registered {} bytes at {:#x}", mr.len(), mr.addr()),
        Err(e) => e,
    }
}

fn refused(r: Result<backend_sim::SimMr>) -> i32 {
    error(r).errno()
}

#[test]
fn memory_the_caller_does_not_own_is_refused() {
    let ctx = SimBackend::default().open("sim0").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let pg = page();
    let rw = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
    let mut small = vec![0u8; 8192];
    let p = small.as_mut_ptr();
    // SAFETY: each call below: every registration is refused, or dropped at once, before
    // the memory it names goes; none is accessed through references meanwhile.
    unsafe {
        let e = error(pd.reg_mr_raw(p, 1 << 40, rw));
        assert_eq!(e.errno(), libc::EFAULT, "{e}");
        assert!(matches!(e, Error::BadAddress { .. }), "{e:?}");
        assert!(e.to_string().contains("bad address"), "{e}");
        assert_eq!(
            refused(pd.reg_mr_raw(p, 1 << 62, rw)),
            libc::EINVAL,
            "more than 2^32 pages"
        );
        assert_eq!(
            refused(pd.reg_mr_raw(0x1000 as *mut u8, pg, AccessFlags::REMOTE_READ)),
            libc::EFAULT
        );
        let top = (usize::MAX - pg + 1) as *mut u8;
        assert_eq!(
            refused(pd.reg_mr_raw(top, 2 * pg, AccessFlags::REMOTE_READ)),
            libc::EINVAL,
            "wraps"
        );
        let gone = Map::new(256, libc::PROT_READ | libc::PROT_WRITE);
        let gone_at = gone.base;
        drop(gone);
        assert_eq!(
            refused(pd.reg_mr_raw(gone_at, 256 * pg, rw)),
            libc::EFAULT,
            "1 MiB unmapped"
        );

        let ro = Map::new(2, libc::PROT_READ);
        for writes in [
            AccessFlags::LOCAL_WRITE,
            rw,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC,
        ] {
            let e = error(pd.reg_mr_raw(ro.base, 2 * pg, writes));
            assert_eq!(e.errno(), libc::EFAULT, "{writes:?}: {e}");
            assert!(e.to_string().contains("read-only"), "{e}");
        }
        let none = Map::new(1, libc::PROT_NONE);
        assert_eq!(
            refused(pd.reg_mr_raw(none.base, pg, AccessFlags::REMOTE_READ)),
            libc::EFAULT
        );

        drop(pd.reg_mr_raw(p, small.len(), AccessFlags::ALL).unwrap());
        drop(pd.reg_mr_raw(ro.base, 2 * pg, AccessFlags::REMOTE_READ).unwrap());
        drop(pd.reg_mr_raw(p, 0, AccessFlags::ALL).unwrap());
    }
}

#[test]
fn read_only_memory_registered_for_remote_reads_serves_a_read() {
    let ctx = SimBackend::default().open("sim0").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(8, None).unwrap();
    let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq, QpCap::new(4, 4))).unwrap();
    let p = RcParams {
        access: AccessFlags::REMOTE_READ,
        ..RcParams::default()
    };
    let me = local_endpoint(&ctx, &qp, &p, 7).unwrap();
    connect_rc(&qp, &p, me.psn, &me).unwrap();
    let pg = page();
    let src = Map::new(1, libc::PROT_READ | libc::PROT_WRITE);
    // SAFETY: the page is this test's own mapping, not yet registered.
    unsafe {
        std::ptr::copy_nonoverlapping(b"read-only".as_ptr(), src.base.add(100), 9);
        assert_eq!(libc::mprotect(src.base.cast(), pg, libc::PROT_READ), 0);
    }
    // SAFETY: `src` outlives `ro` (dropped first, at the end of the test) and is never
    // written again.
    let ro = unsafe { pd.reg_mr_raw(src.base, pg, AccessFlags::REMOTE_READ) }.unwrap();
    let sink = pd.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    qp.post_send(&[SendWr::read(1, &[sink.sge(0, 9).unwrap()], ro.remote().at(100)).signaled()])
        .unwrap();
    let wc = poll_n(&cq, 1, Duration::from_secs(10)).unwrap();
    assert_eq!(wc[0].status, WcStatus::Success);
    let mut b = [0u8; 9];
    sink.read(0, &mut b).unwrap();
    assert_eq!(&b, b"read-only");
    drop(ro);
}
