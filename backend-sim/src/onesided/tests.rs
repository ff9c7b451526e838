//! The table's check, its revocation protocol and the segments' validation.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use verbs_api::AccessFlags;

use super::cma::{self, Gate};
use super::table::{self, Op, OwnerTable, PeerTable, Refused, Request, Revoked};
use super::usage::{Peer, Usage};

const RW: AccessFlags = AccessFlags::REMOTE_WRITE.union(AccessFlags::REMOTE_READ);
const LONG: Duration = Duration::from_secs(10);

/// An owner table, one peer's view of it, and that peer's use counts.
struct Pair {
    owner: OwnerTable,
    peer: PeerTable,
    usage: Usage,
    conn: Arc<Peer>,
}

fn pair() -> Pair {
    static PROBE: u64 = 0x5eed;
    let owner = OwnerTable::create(std::ptr::from_ref(&PROBE) as u64, PROBE).unwrap();
    let peer = PeerTable::map(owner.fd()).unwrap();
    let (conn, fd) = owner.add_peer().unwrap();
    let usage = Usage::map(fd.as_fd()).unwrap();
    Pair {
        owner,
        peer,
        usage,
        conn,
    }
}

#[test]
fn a_request_inside_a_published_region_is_granted_and_every_other_refused() {
    let p = pair();
    let mr = p.owner.publish_mr(0x1234, 7, RW, (0x10000, 4096), None).unwrap();
    let qp = p.owner.publish_qp(99, 7, RW).unwrap();
    let q = qp.index();
    let check = |qp_slot, qpn, rkey, addr, len, op| {
        p.peer
            .check(
                &p.usage,
                &Request {
                    qp_slot,
                    qpn,
                    rkey,
                    addr,
                    len,
                    op,
                },
            )
            .map(|g| (g.addr, g.len))
    };
    assert_eq!(
        check(q, 99, 0x1234, 0x10000, 4096, Op::Write),
        Ok((0x10000, 4096))
    );
    assert_eq!(check(q, 99, 0x1234, 0x10ff0, 16, Op::Read), Ok((0x10ff0, 16)));
    assert_eq!(
        check(q, 99, 0x1234, 0x10ff1, 16, Op::Read),
        Err(Refused::OutOfBounds)
    );
    assert_eq!(
        check(q, 99, 0x1234, 0xfff0, 32, Op::Read),
        Err(Refused::OutOfBounds)
    );
    assert_eq!(
        check(q, 99, 0x1234, u64::MAX - 3, 5, Op::Read),
        Err(Refused::OutOfBounds)
    );
    assert_eq!(
        check(q, 99, 0x1235, 0x10000, 16, Op::Write),
        Err(Refused::NoRegion)
    );
    assert_eq!(
        check(q, 98, 0x1234, 0x10000, 16, Op::Write),
        Err(Refused::QpNotReady)
    );
    assert_eq!(
        check(table::QP_SLOTS as u32, 99, 0x1234, 0x10000, 16, Op::Write),
        Err(Refused::QpNotReady)
    );
    assert_eq!(
        check(q, 99, 0x1234, 0x10000, 0, Op::Write),
        Err(Refused::NotTaken)
    );
    assert_eq!(
        check(q, 99, 0x1234, 0x10008, 8, Op::Write),
        Err(Refused::NotTaken)
    );
    assert_eq!(check(q, 99, 0x1234, 0x10009, 8, Op::Write).map(|g| g.1), Ok(8));
    // A QP of another PD, a QP without the right, a region without it.
    let other_pd = p.owner.publish_qp(100, 8, RW).unwrap();
    assert_eq!(
        check(other_pd.index(), 100, 0x1234, 0x10000, 16, Op::Write),
        Err(Refused::WrongPd)
    );
    let read_only_qp = p.owner.publish_qp(101, 7, AccessFlags::REMOTE_READ).unwrap();
    assert_eq!(
        check(read_only_qp.index(), 101, 0x1234, 0x10000, 16, Op::Write),
        Err(Refused::NoRight)
    );
    assert_eq!(
        check(read_only_qp.index(), 101, 0x1234, 0x10000, 16, Op::Read).map(|g| g.1),
        Ok(16)
    );
    p.owner
        .publish_mr(0x5678, 7, AccessFlags::REMOTE_WRITE, (0x20000, 64), None)
        .unwrap();
    assert_eq!(check(q, 99, 0x5678, 0x20000, 16, Op::Read), Err(Refused::NoRight));
    // Every refusal and every dropped grant lowered the count it raised.
    assert!(!p.usage.any_in_use());
    assert_eq!(p.owner.revoke_mr(mr, LONG), Revoked::Drained);
    assert_eq!(
        check(q, 99, 0x1234, 0x10000, 16, Op::Write),
        Err(Refused::NoRegion)
    );
    assert_eq!(p.owner.revoke_qp(qp, LONG), Revoked::Drained);
}

/// A WRITE of 100 bytes at 4096 with rkey 1 by QP 5 through `qp_slot`: inside the
/// region most tests publish (rkey 1, PD 1, 4096 bytes at 4096).
fn write_100(qp_slot: u32) -> Request {
    Request {
        qp_slot,
        qpn: 5,
        rkey: 1,
        addr: 4096,
        len: 100,
        op: Op::Write,
    }
}

#[test]
fn a_grant_holds_its_slot_until_dropped() {
    let p = pair();
    p.owner.publish_mr(1, 1, RW, (4096, 4096), None).unwrap();
    let qp = p.owner.publish_qp(5, 1, RW).unwrap();
    let g = p.peer.check(&p.usage, &write_100(qp.index())).unwrap();
    assert!(p.usage.any_in_use());
    drop(g);
    assert!(!p.usage.any_in_use());
}

/// Revokes the QP (or the region) in another thread while a grant is held, and checks
/// that the revocation waits for the grant's drop.
fn revocation_waits_for_a_held_grant(the_qp: bool) {
    let p = pair();
    let qp = p.owner.publish_qp(5, 1, RW).unwrap();
    let q = qp.index();
    let mr = p.owner.publish_mr(1, 1, RW, (4096, 4096), None).unwrap();
    let g = p.peer.check(&p.usage, &write_100(q)).unwrap();
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let t = s.spawn(|| {
            let r = match the_qp {
                true => p.owner.revoke_qp(qp, LONG),
                false => p.owner.revoke_mr(mr, LONG),
            };
            done.store(true, Ordering::SeqCst);
            r
        });
        // Whatever the scheduling, the revocation must not end while the grant is held.
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            !done.load(Ordering::SeqCst),
            "the revocation returned while a copy held the region"
        );
        drop(g);
        assert_eq!(t.join().unwrap(), Revoked::Drained);
    });
    let again = p.peer.check(&p.usage, &write_100(q)).map(|_| ());
    let why = match the_qp {
        true => Refused::QpNotReady,
        false => Refused::NoRegion,
    };
    assert_eq!(again, Err(why));
}

#[test]
fn deregistration_waits_for_a_copy_in_progress() {
    revocation_waits_for_a_held_grant(false);
}

#[test]
fn a_qp_error_waits_for_a_copy_in_progress() {
    revocation_waits_for_a_held_grant(true);
}

#[test]
fn a_peer_that_holds_a_count_is_reported_stuck_and_a_gone_one_is_ignored() {
    let p = pair();
    let mr = p.owner.publish_mr(1, 1, RW, (4096, 4096), None).unwrap();
    let qp = p.owner.publish_qp(5, 1, RW).unwrap();
    let g = p.peer.check(&p.usage, &write_100(qp.index())).unwrap();
    match p.owner.revoke_qp(qp, Duration::from_millis(20)) {
        Revoked::Stuck(peers) => assert!(peers.len() == 1 && Arc::ptr_eq(&peers[0], &p.conn)),
        Revoked::Drained => panic!("a held count drained"),
    }
    // The peer is killed: its count stays raised, and is ignored.
    p.conn.mark_gone();
    assert_eq!(p.owner.revoke_mr(mr, LONG), Revoked::Drained);
    std::mem::forget(g);
}

#[test]
fn a_region_whose_places_are_taken_is_not_published_and_a_freed_place_is_reused() {
    let p = pair();
    let qp = p.owner.publish_qp(5, 1, RW).unwrap();
    // Keys with the same first place: found by trying (the hash is the table's own).
    let mut same = Vec::new();
    let mut k = 1u32;
    while same.len() <= table::PROBES {
        if table::home(k) == table::home(1) {
            same.push(k);
        }
        k += 1;
    }
    let slots: Vec<_> = same[..table::PROBES]
        .iter()
        .map(|&k| p.owner.publish_mr(k, 1, RW, (4096, 4096), None).unwrap())
        .collect();
    let last = same[table::PROBES];
    assert!(p.owner.publish_mr(last, 1, RW, (4096, 4096), None).is_none());
    let mut slots = slots.into_iter();
    let first = slots.next().unwrap();
    assert_eq!(p.owner.revoke_mr(first, LONG), Revoked::Drained);
    p.owner.publish_mr(last, 1, RW, (8192, 4096), None).unwrap();
    // The reused place answers for the new key only.
    assert!(p
        .peer
        .check(
            &p.usage,
            &Request {
                qp_slot: qp.index(),
                qpn: 5,
                rkey: same[0],
                addr: 4096,
                len: 16,
                op: Op::Read
            }
        )
        .is_err());
    assert_eq!(
        p.peer
            .check(
                &p.usage,
                &Request {
                    qp_slot: qp.index(),
                    qpn: 5,
                    rkey: last,
                    addr: 8192,
                    len: 16,
                    op: Op::Read
                }
            )
            .map(|g| g.addr),
        Ok(8192)
    );
}

#[test]
fn garbage_in_the_table_never_grants_outside_the_slot_it_names() {
    let p = pair();
    let mut rng = rand::rngs::StdRng::seed_from_u64(43);
    let mut granted = 0;
    for _ in 0..50 {
        p.owner.scribble(&mut rng);
        for _ in 0..2000 {
            let qp_slot = match rng.random_range(0..8) {
                0 => rng.random(),
                _ => rng.random_range(0..2),
            };
            let (qpn, rkey) = (rng.random_range(0..2), rng.random_range(0..2));
            let (addr, len) = match rng.random_range(0..4) {
                0 => (rng.random(), rng.random()),
                _ => (rng.random_range(0..1 << 16), rng.random_range(1..4096)),
            };
            if let Ok(g) = p.peer.check(
                &p.usage,
                &Request {
                    qp_slot,
                    qpn,
                    rkey,
                    addr,
                    len,
                    op: Op::Write,
                },
            ) {
                let (mr_addr, mr_len) = p.peer.bounds_of(&g);
                assert!(g.addr >= mr_addr && g.addr + g.len as u64 <= mr_addr + mr_len);
                assert_eq!((g.addr, g.len as u64), (addr, len));
                granted += 1;
            }
        }
    }
    // The garbage matched often enough for the bounds to be what stopped the rest.
    assert!(granted > 100, "{granted} grants");
}

fn memfd(len: u64, seals: rustix::fs::SealFlags) -> OwnedFd {
    use rustix::fs::MemfdFlags;
    let fd = rustix::fs::memfd_create("t", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
    rustix::fs::ftruncate(&fd, len).unwrap();
    rustix::fs::fcntl_add_seals(&fd, seals).unwrap();
    fd
}

#[test]
fn a_segment_not_made_as_this_build_makes_it_is_refused() {
    use rustix::fs::SealFlags as S;
    let sealed = S::SHRINK | S::GROW | S::SEAL;
    // Unsealed, sealed but writable by the peer, of another size: no table.
    assert!(PeerTable::map(memfd(table::LEN as u64, S::empty()).as_fd()).is_err());
    assert!(PeerTable::map(memfd(table::LEN as u64, sealed).as_fd()).is_err());
    assert!(PeerTable::map(memfd(table::LEN as u64 + 4096, sealed | S::FUTURE_WRITE).as_fd()).is_err());
    // Sealed right, but zeros where the magic word goes.
    assert!(PeerTable::map(memfd(table::LEN as u64, sealed | S::FUTURE_WRITE).as_fd()).is_err());
    // Use counts sealed against writing, or of another size.
    assert!(Usage::map(memfd(super::usage::LEN as u64, sealed | S::FUTURE_WRITE).as_fd()).is_err());
    assert!(Usage::map(memfd(super::usage::LEN as u64 - 4, sealed).as_fd()).is_err());
    // A peer cannot map the owner's table writable.
    let p = pair();
    // SAFETY: a fresh mapping (null hint) replaces nothing; it is unmapped at once if made.
    let w = unsafe {
        rustix::mm::mmap(
            std::ptr::null_mut(),
            table::LEN,
            rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
            rustix::mm::MapFlags::SHARED,
            p.owner.fd(),
            0,
        )
    };
    assert!(w.is_err(), "the table could be mapped writable");
}

#[test]
fn no_copy_lands_after_a_revocation_returns() {
    let p = pair();
    let me = rustix::process::getpid();
    assert_eq!(
        Gate::probe(me, p.peer.probe_addr(), p.peer.probe_value()),
        Gate::Open
    );
    let len = 1 << 20;
    let target: Vec<AtomicU64> = (0..len / 8).map(|_| AtomicU64::new(0)).collect();
    let base = target.as_ptr() as u64;
    let qp = p.owner.publish_qp(5, 1, RW).unwrap();
    let stop = AtomicBool::new(false);
    let landed = AtomicU64::new(0);
    std::thread::scope(|s| {
        // Stops the writer however this thread leaves the scope (a failed assertion too).
        let _stop = StopOnDrop(&stop);
        s.spawn(|| {
            let mut src = vec![0u8; len];
            let mut round = 0u8;
            while !stop.load(Ordering::Relaxed) {
                round = round.wrapping_add(1).max(1);
                src.fill(round);
                if let Ok(g) = p.peer.check(
                    &p.usage,
                    &Request {
                        qp_slot: qp.index(),
                        qpn: 5,
                        rkey: 77,
                        addr: base,
                        len: len as u64,
                        op: Op::Write,
                    },
                ) {
                    if cma::write(me, &g, &src).unwrap() {
                        landed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        });
        for _ in 0..30 {
            let mr = p.owner.publish_mr(77, 1, RW, (base, len as u64), None).unwrap();
            let before = landed.load(Ordering::Relaxed);
            while landed.load(Ordering::Relaxed) < before + 2 {
                std::thread::yield_now();
            }
            assert_eq!(p.owner.revoke_mr(mr, LONG), Revoked::Drained);
            assert!(target.iter().any(|w| w.load(Ordering::Relaxed) != 0));
            // Cleared from the end: a copy still running after the revocation returned
            // (which writes its range in order) leaves bytes behind.
            target.iter().rev().for_each(|w| w.store(0, Ordering::Relaxed));
            std::thread::sleep(Duration::from_millis(2));
            let stray = target.iter().filter(|w| w.load(Ordering::Relaxed) != 0).count();
            assert_eq!(stray, 0, "a write landed after the region was revoked");
        }
    });
}

/// Sets its flag when dropped.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

#[test]
fn the_gate_opens_only_on_a_readable_probe_and_copies_keep_to_the_grant() {
    let p = pair();
    let me = rustix::process::getpid();
    assert_eq!(
        Gate::probe(me, p.peer.probe_addr(), p.peer.probe_value()),
        Gate::Open
    );
    assert_eq!(
        Gate::probe(me, p.peer.probe_addr(), p.peer.probe_value() ^ 1),
        Gate::Closed,
        "a word that does not hold the table's value opened the gate"
    );
    // A peer that names a bad address (garbage, or memory it unmapped) keeps the rings.
    assert_eq!(Gate::probe(me, 0, 0), Gate::Closed);
    let target = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];
    let base = target.as_ptr() as u64;
    p.owner.publish_mr(9, 1, RW, (base, 24), None).unwrap();
    let qp = p.owner.publish_qp(5, 1, RW).unwrap();
    let g = p
        .peer
        .check(
            &p.usage,
            &Request {
                qp_slot: qp.index(),
                qpn: 5,
                rkey: 9,
                addr: base + 4,
                len: 16,
                op: Op::Write,
            },
        )
        .unwrap();
    // A source longer (or shorter) than the grant is refused before any byte moves.
    assert!(cma::write(me, &g, &[0xff; 17]).is_err());
    assert!(cma::write(me, &g, &[0xff; 15]).is_err());
    assert!(target.iter().all(|w| w.load(Ordering::Relaxed) == 0));
    assert!(cma::write(me, &g, &[0xff; 16]).unwrap());
    let mut back = [0u8; 16];
    assert!(cma::read(me, &g, &mut back).unwrap());
    assert_eq!(back, [0xff; 16]);
    // Bytes 0..4 and 20..24 of the region are outside the grant: untouched.
    let words: Vec<u64> = target.iter().map(|w| w.load(Ordering::Relaxed)).collect();
    assert_eq!(words[0].to_ne_bytes()[..4], [0; 4]);
    assert_eq!(words[2].to_ne_bytes()[4..], [0; 4]);
}
