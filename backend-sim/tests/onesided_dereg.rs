//! The one-sided fast path through the verbs, across two processes: one WRITEs 1 MiB
//! messages into the other's region in a loop (placed by the writer itself), the other
//! deregisters the region; no word of the buffer changes after `ibv_dereg_mr` returned,
//! and the writer's WRs end as WRITEs to a deregistered rkey end (`REM_ACCESS_ERR`, the
//! reason "deregistered region" in `vendor_err`).
//!
//! It runs with the fast path `on` (`process_vm_writev`) and in map mode (the region's
//! pages in a memfd the writer maps and copies into with `memcpy`; the pages are a memfd
//! while registered and ordinary again once `ibv_dereg_mr` returned).
//!
//! Its own `main`: it runs itself again once per mode, and each of those again as the
//! writer. The two exchange their QPs' endpoints on the writer's stdin and stdout.

use std::alloc::Layout;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use backend_sim::{SimBackend, SimContext};
use verbs_api::{
    connect_rc, local_endpoint, AccessFlags, Backend, CompletionQueue, Context, Endpoint, MemoryRegion,
    ProtectionDomain, QpCap, QpInitAttr, QueuePair, RcParams, SendWr, Sge, WcStatus, WorkCompletion,
};

mod common;
use common::{hex, unhex};

const LEN: usize = 1 << 20;
const ROUNDS: usize = 20;
const WAIT: Duration = Duration::from_secs(20);
/// `vendor_err` of a WRITE to a deregistered region (docs/sim.md, "What `vendor_err` says").
const DEREGISTERED: u32 = 0x102;

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("onesided_dereg: test");
        return;
    }
    if std::env::var("ONESIDED_ROLE").as_deref() == Ok("writer") {
        return writer();
    }
    // The fast path is this test's subject, and off unless asked for; each mode's run,
    // a child of this process, and its writer inherit the setting.
    let Ok(mode) = std::env::var(MODE) else {
        for mode in ["on", "map"] {
            let status = Command::new(std::env::current_exe().unwrap())
                .env(MODE, mode)
                .env(backend_sim::onesided::owner::SETTING, mode)
                .status()
                .unwrap();
            assert!(status.success(), "the run in mode {mode} failed");
        }
        return;
    };
    for _ in 0..ROUNDS {
        no_placed_write_lands_after_dereg_mr_returns(mode == "map");
    }
    println!("test onesided_dereg::no_placed_write_lands_after_dereg_mr_returns ({mode}) ... ok");
}

/// Names the mode of a run of this test (`on` or `map`).
const MODE: &str = "ONESIDED_DEREG_MODE";

/// Whether the page at `addr` lies in a region memfd of the sim (`/proc/self/maps`).
fn in_memfd(addr: usize) -> bool {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines().any(|l| {
        let (lo, hi) = l.split_once(' ').unwrap().0.split_once('-').unwrap();
        let (lo, hi) = (
            usize::from_str_radix(lo, 16).unwrap(),
            usize::from_str_radix(hi, 16).unwrap(),
        );
        (lo..hi).contains(&addr) && l.contains("rdma-sim-mr")
    })
}

/// Whether this process maps any region memfd of the sim.
fn maps_a_region() -> bool {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .contains("rdma-sim-mr")
}

/// A device, PD, CQ and RC QP of this process.
struct Side {
    ctx: SimContext,
    pd: backend_sim::SimPd,
    cq: backend_sim::SimCq,
    qp: backend_sim::SimQp,
}

fn side() -> Side {
    let ctx = SimBackend::default().open("sim0").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64, None).unwrap();
    let qp = pd
        .create_qp(&QpInitAttr::rc(&cq, &cq, QpCap::new(16, 1)))
        .unwrap();
    Side { ctx, pd, cq, qp }
}

fn no_placed_write_lands_after_dereg_mr_returns(map: bool) {
    let me = side();
    // Page-aligned, as map mode needs (and as perftest allocates).
    let layout = Layout::from_size_align(LEN, 4096).unwrap();
    // SAFETY: the layout has a non-zero size.
    let base = unsafe { std::alloc::alloc_zeroed(layout) };
    assert!(!base.is_null());
    // SAFETY: `LEN` zeroed bytes, 8-byte aligned, are `LEN / 8` valid `AtomicU64`s, used
    // only through this slice until they are freed at the end.
    let target: &[AtomicU64] = unsafe { std::slice::from_raw_parts(base.cast(), LEN / 8) };
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    // SAFETY: `target` outlives the region (it is dropped below, before `target` is
    // freed), and every access to it here is atomic.
    let mr = unsafe { me.pd.reg_mr_raw(base, LEN, access) }.unwrap();
    assert_eq!(
        in_memfd(base as usize),
        map,
        "map mode did not move the region's pages"
    );
    let p = RcParams::default();
    let mine = local_endpoint(&me.ctx, &me.qp, &p, 1).unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .env("ONESIDED_ROLE", "writer")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut to = child.stdin.take().unwrap();
    let mut from = BufReader::new(child.stdout.take().unwrap()).lines();
    writeln!(to, "{} {} {}", hex(&mine.to_bytes()), mr.addr(), mr.rkey()).unwrap();
    let theirs = Endpoint::from_bytes(&unhex(&from.next().unwrap().unwrap())).unwrap();
    connect_rc(&me.qp, &p, 1, &theirs).unwrap();
    let nonzero = || target.iter().filter(|w| w.load(Ordering::Relaxed) != 0).count();
    let deadline = Instant::now() + WAIT;
    while nonzero() < LEN / 8 {
        assert!(
            Instant::now() < deadline,
            "the writer's WRITEs never filled the region"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(mr);
    assert!(
        !in_memfd(base as usize),
        "the pages stayed in the memfd after ibv_dereg_mr"
    );
    // Cleared from the end: a copy still running (which writes its range in order)
    // leaves bytes behind it.
    target.iter().rev().for_each(|w| w.store(0, Ordering::Relaxed));
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(nonzero(), 0, "a WRITE landed after ibv_dereg_mr returned");
    let report = from.next().unwrap().unwrap();
    let r: Vec<&str> = report.split(' ').collect();
    assert_eq!(r[0], format!("{:?}", WcStatus::RemAccessErr), "{report}");
    assert_eq!(r[1], DEREGISTERED.to_string(), "{report}");
    assert!(
        r[3].parse::<u64>().unwrap() > 0,
        "no WRITE was placed directly: {report}"
    );
    assert_eq!(
        r[4] == "mapped",
        map,
        "whether the writer mapped the region: {report}"
    );
    drop(to);
    assert!(child.wait().unwrap().success());
    drop(me);
    // SAFETY: allocated above with `layout`; the region is gone, no slice is used after.
    unsafe { std::alloc::dealloc(base, layout) };
}

/// The writer: connects to the parent's QP and WRITEs 1 MiB messages, four outstanding,
/// into its region until one fails; reports the failure's status and `vendor_err`, how
/// many succeeded and how many its device placed directly.
fn writer() {
    let me = side();
    let mut lines = std::io::stdin().lock().lines();
    let hello = lines.next().unwrap().unwrap();
    let f: Vec<&str> = hello.split(' ').collect();
    let theirs = Endpoint::from_bytes(&unhex(f[0])).unwrap();
    let (addr, rkey): (u64, u32) = (f[1].parse().unwrap(), f[2].parse().unwrap());
    let p = RcParams::default();
    let mine = local_endpoint(&me.ctx, &me.qp, &p, 2).unwrap();
    connect_rc(&me.qp, &p, 2, &theirs).unwrap();
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", hex(&mine.to_bytes())).unwrap();
    out.flush().unwrap();
    let src = me.pd.reg_mr(LEN, AccessFlags::LOCAL_WRITE).unwrap();
    let (mut ok, mut posted, mut round) = (0u64, 0u64, 0u8);
    let mut wc = [WorkCompletion::default(); 16];
    let failed = loop {
        while posted - ok < 4 {
            round = round.wrapping_add(1).max(1);
            src.write(0, &vec![round; LEN]).unwrap();
            let sge = [Sge::new(src.addr(), LEN as u32, src.lkey())];
            me.qp
                .post_send(&[SendWr::write(posted, &sge, (addr, rkey)).signaled()])
                .unwrap();
            posted += 1;
        }
        let n = me.cq.poll(&mut wc).unwrap();
        if let Some(w) = wc[..n].iter().find(|w| w.status != WcStatus::Success) {
            break *w;
        }
        ok += n as u64;
    };
    let placed = me.ctx.onesided_placed();
    let mapped = if maps_a_region() { "mapped" } else { "copied" };
    writeln!(
        out,
        "{:?} {} {ok} {placed} {mapped}",
        failed.status, failed.vendor_err
    )
    .unwrap();
    out.flush().unwrap();
    // Waits for the parent to have read the report.
    let _ = lines.next();
}
