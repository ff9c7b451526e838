//! Strangers who open UD links to a device as often as they like, from another process
//! (each answering the device's check at its own address, as an honest device does):
//! the links a device holds stay bounded, and a legitimate device's datagrams get
//! through all the while.
//!
//! - One identity, 300 links: each replaces the last, the device holds one.
//! - More identities than the device holds links (its bound is a quarter of the
//!   process's open-file limit, 256 here): it never holds more, and once the stranger's
//!   links have been idle a while, a device that needs a link takes the place of one.
//!
//! `harness = false` (see Cargo.toml): `main` is the test, so it can set its own
//! open-file limit (which the bound follows) without touching other tests, and run
//! itself again as the stranger.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use backend_sim::{SimBackend, SimContext};
use backend_sim_proto::wire::Frame;
use common::{frame, open_fds, read_answer, read_setup, set_nofile, ud_qp, RAW_IP};
use verbs_api::*;

/// The open-file limit the test runs under: the device holds a quarter of it in links.
const NOFILE: u64 = 1024;
const BOUND: usize = NOFILE as usize / 4;
const QKEY: u32 = 0x1234;
/// How long a link must have been idle before a newcomer may take its place (`MIN_IDLE`
/// of backend-sim/src/datagram/table.rs).
const LINK_MIN_IDLE: Duration = Duration::from_secs(1);
/// Datagrams the legitimate device sends.
const LEGIT: u64 = 200;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--list") {
        println!("ud_links: test");
        return;
    }
    if let Ok(spec) = std::env::var("UD_STRANGER") {
        stranger(&spec);
        return;
    }
    set_nofile(NOFILE);
    one_identity_holds_one_link();
    println!("test ud_links::one_identity_holds_one_link ... ok");
    idle_strangers_give_way_to_a_device_that_needs_a_link();
    println!("test ud_links::idle_strangers_give_way_to_a_device_that_needs_a_link ... ok");
}

// ---------------------------------------------------------------- the stranger

/// The stranger (`UD_STRANGER` = "IDENTITIES,LINKS,VICTIM"): `IDENTITIES` listeners on
/// 127.0.0.2, each answering yes to every check the victim asks of it; `LINKS` links to
/// the victim, spread over the identities in turn. Says "ready ACKED REFUSED" once all
/// were tried, then on each "count" line says how many of its links are still open;
/// ends when its standard input does.
fn stranger(spec: &str) {
    let mut f = spec.split(',');
    let identities: usize = f.next().unwrap().parse().unwrap();
    let links: usize = f.next().unwrap().parse().unwrap();
    let victim: SocketAddr = f.next().unwrap().parse().unwrap();
    set_nofile(u64::MAX);
    let listeners: Vec<TcpListener> = (0..identities)
        .map(|_| {
            let l = TcpListener::bind((RAW_IP, 0)).unwrap();
            l.set_nonblocking(true).unwrap();
            l
        })
        .collect();
    let lids: Vec<u16> = listeners.iter().map(|l| l.local_addr().unwrap().port()).collect();
    std::thread::spawn(move || confirm_every_check(listeners));
    let mut open = Vec::new();
    let mut refused = 0;
    for i in 0..links {
        let mut s = TcpStream::connect(victim).unwrap();
        s.write_all(&frame(Frame::LinkHello {
            src_gid: Gid::from(RAW_IP).0,
            src_lid: lids[i % identities],
            token: [i as u8; 16],
        }))
        .unwrap();
        match read_answer(&mut s) {
            Some(Frame::HelloAck) => open.push(s),
            _ => refused += 1,
        }
    }
    for s in &open {
        s.set_nonblocking(true).unwrap();
    }
    let mut out = std::io::stdout();
    writeln!(out, "ready {} {refused}", open.len()).unwrap();
    for line in std::io::stdin().lines() {
        if line.unwrap() != "count" {
            continue;
        }
        let mut b = [0u8; 64];
        open.retain_mut(|s| match s.read(&mut b) {
            Ok(0) => false,
            Err(e) => e.kind() == std::io::ErrorKind::WouldBlock,
            Ok(_) => true,
        });
        writeln!(out, "open {}", open.len()).unwrap();
    }
}

/// Answers yes to every link check that reaches one of `listeners`.
fn confirm_every_check(listeners: Vec<TcpListener>) {
    loop {
        let mut idle = true;
        for l in &listeners {
            if let Ok((mut c, _)) = l.accept() {
                idle = false;
                c.set_nonblocking(false).unwrap();
                c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                if let Frame::LinkVerify { .. } = read_setup(&mut c) {
                    let _ = c.write_all(&frame(Frame::HelloAck));
                }
            }
        }
        if idle {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// The stranger process, run from this test's own executable.
struct Stranger {
    child: Child,
    tell: ChildStdin,
    hear: BufReader<ChildStdout>,
}

impl Stranger {
    /// Starts it; returns once it tried every link: with how many the victim accepted
    /// and refused.
    fn start(identities: usize, links: usize, victim: SocketAddr) -> (Stranger, usize, usize) {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .env("UD_STRANGER", format!("{identities},{links},{victim}"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let tell = child.stdin.take().unwrap();
        let mut hear = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        hear.read_line(&mut line).unwrap();
        let n: Vec<usize> = line
            .split_whitespace()
            .skip(1)
            .map(|w| w.parse().unwrap())
            .collect();
        assert_eq!(n.len(), 2, "the stranger said {line:?}");
        (Stranger { child, tell, hear }, n[0], n[1])
    }

    /// How many of its links are still open.
    fn open(&mut self) -> usize {
        writeln!(self.tell, "count").unwrap();
        let mut line = String::new();
        self.hear.read_line(&mut line).unwrap();
        line.trim().strip_prefix("open ").unwrap().parse().unwrap()
    }

    /// Waits (at most 10 s) until at most `n` of its links are open; how many are.
    fn open_at_most(&mut self, n: usize) -> usize {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let open = self.open();
            if open <= n || Instant::now() > deadline {
                return open;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Stranger {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------- the devices

/// A UD QP on a device, its CQ and a region for its datagrams.
struct Side {
    ctx: SimContext,
    pd: backend_sim::SimPd,
    cq: backend_sim::SimCq,
    qp: backend_sim::SimQp,
    mr: backend_sim::SimMr,
}

fn side(ctx: SimContext) -> Side {
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(512, None).unwrap();
    let qp = ud_qp(&pd, &cq, QKEY);
    let mr = pd.reg_mr(1 << 20, AccessFlags::LOCAL_WRITE).unwrap();
    Side { ctx, pd, cq, qp, mr }
}

/// `from` sends [`LEGIT`] datagrams to `to`'s QP, 64 at a time: how many arrive.
fn legit_datagrams(from: &Side, to: &Side) -> u64 {
    let p = RcParams::default();
    let ah = from
        .pd
        .create_ah(&ah_attr_for(&local_endpoint(&to.ctx, &to.qp, &p, 0).unwrap(), &p))
        .unwrap();
    from.mr.write(0, b"legit").unwrap();
    let payload = [from.mr.sge(0, 5).unwrap()];
    let (mut arrived, mut sent) = (0u64, 0u64);
    let mut wc = [WorkCompletion::default(); 64];
    while sent < LEGIT {
        let batch = (LEGIT - sent).min(64);
        for i in 0..batch {
            let rx = to.mr.sge((i as usize) * 4096, 4096).unwrap();
            to.qp.post_recv(&[RecvWr::new(sent + i, &[rx])]).unwrap();
        }
        for i in 0..batch {
            let wr = SendWr::send(sent + i, &payload).signaled();
            from.qp.post_send(&[wr.ud(&ah, to.qp.qp_num(), QKEY)]).unwrap();
        }
        poll_n(&from.cq, batch as usize, Duration::from_secs(10)).unwrap();
        // Each arrives, or its receive stays posted: then the next batch's receives
        // would be taken by this batch's stragglers, so wait for every one.
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut got = 0;
        while got < batch && Instant::now() < deadline {
            let n = to.cq.poll(&mut wc).unwrap();
            assert!(wc[..n].iter().all(|w| w.is_ok()), "{:?}", &wc[..n]);
            got += n as u64;
            if n == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        arrived += got;
        if got < batch {
            return arrived;
        }
        sent += batch;
    }
    arrived
}

// ---------------------------------------------------------------- the tests

fn one_identity_holds_one_link() {
    let sim = SimBackend::default();
    let (r, l) = (side(sim.open("sim0").unwrap()), side(sim.open("sim1").unwrap()));
    let before = open_fds();
    let (mut s, acked, refused) = Stranger::start(1, 300, r.ctx.listen_addr());
    assert_eq!(
        (acked, refused),
        (300, 0),
        "each link under the one identity is accepted"
    );
    let open = s.open_at_most(1);
    assert_eq!(open, 1, "the device closes each link the next one replaces");
    let held = open_fds().saturating_sub(before);
    assert!(held <= 8, "the device holds {held} descriptors more than before");
    assert_eq!(
        legit_datagrams(&l, &r),
        LEGIT,
        "the legitimate device's datagrams arrive"
    );
    assert_eq!(s.open(), 1);
}

fn idle_strangers_give_way_to_a_device_that_needs_a_link() {
    let sim = SimBackend::default();
    let (r, l) = (side(sim.open("sim0").unwrap()), side(sim.open("sim1").unwrap()));
    let before = open_fds();
    let identities = BOUND + 44;
    let (mut s, acked, refused) = Stranger::start(identities, identities, r.ctx.listen_addr());
    assert_eq!(acked + refused, identities);
    let open = s.open_at_most(BOUND);
    assert!(
        open <= BOUND,
        "the device holds {open} of the stranger's links, more than {BOUND}"
    );
    let held = open_fds().saturating_sub(before);
    assert!(
        held <= BOUND + 8,
        "the device holds {held} descriptors more than before"
    );
    // Once the stranger's links have carried nothing for a while, the legitimate device
    // gets a link in the place of one.
    std::thread::sleep(LINK_MIN_IDLE + Duration::from_millis(100));
    assert_eq!(
        legit_datagrams(&l, &r),
        LEGIT,
        "the legitimate device's datagrams arrive"
    );
    let open = s.open();
    assert!(
        open < BOUND,
        "the legitimate link took the place of a stranger's ({open} open)"
    );
    let held = open_fds().saturating_sub(before);
    assert!(
        held <= BOUND + 8,
        "the device holds {held} descriptors more than before"
    );
}
