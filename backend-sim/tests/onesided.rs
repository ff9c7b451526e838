//! The one-sided fast path's table across two processes (`backend_sim::onesided`): a
//! process that WRITEs into another's region in a loop never lands a byte after the
//! owner's revocation returned, and a requester killed while it holds a region does not
//! keep the owner's deregistration waiting once its connection is known gone.
//!
//! Its own `main`: it runs itself again as the other process. The other process opens
//! this one's segments through `/proc/<pid>/fd`, as a same-user process may (the real
//! path sends them over the unix socket).

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use backend_sim::onesided::cma::{self, Gate};
use backend_sim::onesided::table::{Op, OwnerTable, PeerTable, Request, Revoked};
use backend_sim::onesided::usage::Usage;
use rustix::process::Pid;
use verbs_api::AccessFlags;

const RW: AccessFlags = AccessFlags::REMOTE_WRITE.union(AccessFlags::REMOTE_READ);
const KEY: u32 = 77;
const PD: u32 = 3;
const QPN: u32 = 9;
const LEN: usize = 1 << 20;
const LONG: Duration = Duration::from_secs(20);

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("onesided: test");
        return;
    }
    match std::env::var("ONESIDED_ROLE").as_deref() {
        Ok("owner") => return owner(),
        Ok("holder") => return holder(),
        _ => {}
    }
    for (name, t) in [
        (
            "no_write_lands_after_the_owner_revokes",
            no_write_lands_after_the_owner_revokes as fn(),
        ),
        (
            "a_killed_requester_holding_a_region_does_not_block_its_revocation",
            a_killed_requester_holding_a_region_does_not_block_its_revocation,
        ),
    ] {
        t();
        println!("test onesided::{name} ... ok");
    }
}

fn spawn(role: &str, args: &[String]) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .env("ONESIDED_ROLE", role)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Opens descriptor `fd` of process `pid` (read-only, or for reading and writing).
fn open_theirs(pid: u32, fd: i32, writable: bool) -> OwnedFd {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(writable)
        .open(format!("/proc/{pid}/fd/{fd}"))
        .unwrap();
    f.into()
}

fn words(n: usize) -> Vec<AtomicU64> {
    (0..n / 8).map(|_| AtomicU64::new(0)).collect()
}

fn nonzero(target: &[AtomicU64]) -> usize {
    target.iter().filter(|w| w.load(Ordering::Relaxed) != 0).count()
}

/// The owner process: publishes and revokes its region when told, and says after each
/// revocation how many words a write changed after it returned, and how many words
/// writes had changed before.
fn owner() {
    let target = words(LEN);
    let base = target.as_ptr() as u64;
    // The probe is the target's first word, zero until a write lands.
    let table = OwnerTable::create(base, 0).unwrap();
    let (_peer, usage_fd) = table.add_peer().unwrap();
    let qp = table.publish_qp(QPN, PD, RW).unwrap();
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{} {} {} {base}",
        table.fd().as_raw_fd(),
        usage_fd.as_raw_fd(),
        qp.index()
    )
    .unwrap();
    out.flush().unwrap();
    let mut slot = None;
    for line in std::io::stdin().lock().lines() {
        match line.unwrap().as_str() {
            "publish" => {
                slot = table.publish_mr(KEY, PD, RW, (base, LEN as u64), None);
                writeln!(out, "published {}", slot.is_some()).unwrap();
            }
            "revoke" => {
                let r = table.revoke_mr(slot.take().unwrap(), LONG);
                let written = nonzero(&target);
                // Cleared from the end: a copy still running after the revocation
                // returned (which writes its range in order) leaves bytes behind.
                target.iter().rev().for_each(|w| w.store(0, Ordering::Relaxed));
                std::thread::sleep(Duration::from_millis(5));
                writeln!(out, "{r:?} {} {written}", nonzero(&target)).unwrap();
            }
            _ => break,
        }
        out.flush().unwrap();
    }
}

fn no_write_lands_after_the_owner_revokes() {
    let mut child = spawn("owner", &[]);
    let pid = child.id();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut stdin = child.stdin.take().unwrap();
    let hello = lines.next().unwrap().unwrap();
    let f: Vec<u64> = hello.split(' ').map(|w| w.parse().unwrap()).collect();
    let table = PeerTable::map(open_theirs(pid, f[0] as i32, false).as_fd()).unwrap();
    let usage = Usage::map(open_theirs(pid, f[1] as i32, true).as_fd()).unwrap();
    let (qp_slot, base) = (f[2] as u32, f[3]);
    let them = Pid::from_raw(pid as i32).unwrap();
    assert_eq!(
        Gate::probe(them, table.probe_addr(), table.probe_value()),
        Gate::Open
    );
    let stop = AtomicBool::new(false);
    let landed = AtomicU64::new(0);
    std::thread::scope(|s| {
        // Stops the writer however this thread leaves the scope (a failed assertion too).
        let _stop = StopOnDrop(&stop);
        s.spawn(|| {
            let mut src = vec![0u8; LEN];
            let mut round = 0u8;
            while !stop.load(Ordering::Relaxed) {
                round = round.wrapping_add(1).max(1);
                src.fill(round);
                if let Ok(g) = table.check(
                    &usage,
                    &Request {
                        qp_slot,
                        qpn: QPN,
                        rkey: KEY,
                        addr: base,
                        len: LEN as u64,
                        op: Op::Write,
                    },
                ) {
                    if cma::write(them, &g, &src).unwrap() {
                        landed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        });
        for _ in 0..40 {
            writeln!(stdin, "publish").unwrap();
            assert_eq!(lines.next().unwrap().unwrap(), "published true");
            let before = landed.load(Ordering::Relaxed);
            while landed.load(Ordering::Relaxed) < before + 2 {
                std::thread::yield_now();
            }
            writeln!(stdin, "revoke").unwrap();
            let verdict = lines.next().unwrap().unwrap();
            let v: Vec<&str> = verdict.split(' ').collect();
            assert_eq!(v[0], "Drained", "{verdict}");
            assert_eq!(v[1], "0", "a write landed after the revocation returned");
            assert!(
                v[2].parse::<usize>().unwrap() > 0,
                "no write landed while published"
            );
        }
    });
    drop(stdin);
    assert!(child.wait().unwrap().success());
}

/// The requester process killed while it holds a grant: takes one on the region this
/// process's parent published, says so, and waits to be killed.
fn holder() {
    let a: Vec<i64> = std::env::args().skip(1).map(|w| w.parse().unwrap()).collect();
    let ppid = rustix::process::getppid().unwrap().as_raw_nonzero().get() as u32;
    let table = PeerTable::map(open_theirs(ppid, a[0] as i32, false).as_fd()).unwrap();
    let usage = Usage::map(open_theirs(ppid, a[1] as i32, true).as_fd()).unwrap();
    let g = table
        .check(
            &usage,
            &Request {
                qp_slot: a[2] as u32,
                qpn: QPN,
                rkey: KEY,
                addr: a[3] as u64,
                len: 64,
                op: Op::Write,
            },
        )
        .unwrap();
    println!("held");
    std::io::stdout().flush().unwrap();
    std::thread::sleep(Duration::from_secs(600));
    drop(g);
}

fn a_killed_requester_holding_a_region_does_not_block_its_revocation() {
    let target = words(4096);
    let base = target.as_ptr() as u64;
    // The probe is the target's first word, zero until a write lands.
    let table = OwnerTable::create(base, 0).unwrap();
    let (peer, usage_fd) = table.add_peer().unwrap();
    let qp = table.publish_qp(QPN, PD, RW).unwrap();
    let mr = table.publish_mr(KEY, PD, RW, (base, 4096), None).unwrap();
    let args = [
        table.fd().as_raw_fd().to_string(),
        usage_fd.as_raw_fd().to_string(),
        qp.index().to_string(),
        base.to_string(),
    ];
    let mut child = spawn("holder", &args);
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "held");
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let t = s.spawn(|| {
            let r = table.revoke_mr(mr, LONG);
            done.store(true, Ordering::SeqCst);
            r
        });
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            !done.load(Ordering::SeqCst),
            "the revocation returned while the peer held the region"
        );
        let killed = Instant::now();
        child.kill().unwrap();
        child.wait().unwrap();
        // What the peer's connection ending does on the real path.
        table.remove_peer(&peer);
        assert_eq!(t.join().unwrap(), Revoked::Drained);
        assert!(killed.elapsed() < LONG);
    });
}

/// Sets its flag when dropped.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}
