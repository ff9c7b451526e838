//! The rings' tests: bytes cross in order whatever the interleaving of reads and writes,
//! a peer's bad index is caught without a read or write outside the rings, a segment is
//! mapped only when sealed as the module docs say, the `SCM_RIGHTS` exchange refuses
//! anything but one descriptor, and two threads sleeping on the doorbell lose no wake-up.

use super::*;
use crate::shm_segment::{create_with, required_seals, segment_len, SEGMENT_TAG};
use std::collections::VecDeque;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use proptest::prelude::*;

/// A small ring, so that tests wrap it often.
const SMALL: usize = 64;

/// Both sides of one segment of `cap`-byte rings, and a third mapping of it for a test
/// that plays a hostile peer.
fn pair(cap: usize) -> (Rings, Rings, Mapping) {
    let seg = create_with(cap).unwrap();
    let c = Rings::map_with(seg.as_fd(), Side::Connector, cap).unwrap();
    let a = Rings::map_with(seg.as_fd(), Side::Acceptor, cap).unwrap();
    let raw = Mapping::new(seg.as_fd(), segment_len(cap)).unwrap();
    (c, a, raw)
}

fn write(r: &mut Rings, runs: &[&[u8]]) -> io::Result<usize> {
    let iov: Vec<RawSlice> = runs
        .iter()
        .map(|b| RawSlice {
            base: b.as_ptr(),
            len: b.len(),
        })
        .collect();
    // SAFETY: every run is a live slice of the caller's.
    unsafe { r.write(&iov, 0) }.map(|(n, _)| n)
}

/// Reads up to `len` bytes through a buffer with guard bytes either side, checking that
/// the read wrote none of them.
fn read(r: &mut Rings, len: usize) -> io::Result<Vec<u8>> {
    const GUARD: usize = 16;
    let mut buf = vec![0xA5u8; len + 2 * GUARD];
    // SAFETY: `buf[GUARD..GUARD + len]` is ours and not otherwise borrowed for the call.
    let got = unsafe { r.read(buf.as_mut_ptr().add(GUARD), len) };
    assert!(
        buf[..GUARD].iter().chain(&buf[GUARD + len..]).all(|&b| b == 0xA5),
        "a read wrote outside its buffer"
    );
    let (n, _) = got?;
    assert!(n <= len, "read {n} bytes into {len}");
    Ok(buf[GUARD..GUARD + n].to_vec())
}

#[test]
fn bytes_cross_both_ways_and_wrap() {
    let (mut c, mut a, _) = pair(SMALL);
    let mut sent = 0u8;
    let mut got = 0u8;
    // 40 bytes at a time through a 64-byte ring: every other write wraps.
    for _ in 0..50 {
        let msg: Vec<u8> = (0..40).map(|i| sent.wrapping_add(i)).collect();
        assert_eq!(write(&mut c, &[&msg[..10], &msg[10..]]).unwrap(), 40);
        sent = sent.wrapping_add(40);
        let back = read(&mut a, 100).unwrap();
        assert_eq!(back.len(), 40);
        for b in back {
            assert_eq!(b, got);
            got = got.wrapping_add(1);
        }
        assert_eq!(write(&mut a, &[b"pong"]).unwrap(), 4);
        assert_eq!(read(&mut c, 4).unwrap(), b"pong");
    }
    // Full: a write takes what fits, then nothing.
    assert_eq!(write(&mut c, &[&[7; 100]]).unwrap(), SMALL);
    assert_eq!(write(&mut c, &[&[7; 1]]).unwrap(), 0);
    assert_eq!(read(&mut a, 1000).unwrap(), vec![7; SMALL]);
    assert!(read(&mut a, 10).unwrap().is_empty());
}

#[derive(Clone, Debug)]
enum Op {
    /// The connector (`false`) or acceptor (`true`) writes these runs.
    Write(bool, Vec<Vec<u8>>),
    /// One side reads at most this many bytes.
    Read(bool, usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (
            any::<bool>(),
            prop::collection::vec(prop::collection::vec(any::<u8>(), 0..3 * SMALL / 2), 0..4)
        )
            .prop_map(|(s, runs)| Op::Write(s, runs)),
        (any::<bool>(), 0..2 * SMALL).prop_map(|(s, n)| Op::Read(s, n)),
    ]
}

/// A peer's store into one of the words this side reads.
#[derive(Clone, Debug)]
enum Hostile {
    /// The tail of the ring the acceptor reads.
    Tail(u64),
    /// The head of the ring the acceptor writes.
    Head(u64),
}

fn hostile() -> impl Strategy<Value = Hostile> {
    let value = prop_oneof![
        any::<u64>(),
        0..4 * SMALL as u64,
        (u64::MAX - 4 * SMALL as u64)..=u64::MAX,
    ];
    prop_oneof![
        value.clone().prop_map(Hostile::Tail),
        value.prop_map(Hostile::Head)
    ]
}

proptest! {
    /// Whatever the interleaving, each direction delivers exactly the bytes written, in
    /// order, writes take min(their bytes, the room) and reads min(their length, what is
    /// there).
    #[test]
    fn any_interleaving_preserves_bytes(ops in prop::collection::vec(op(), 0..200)) {
        let (mut c, mut a, _) = pair(SMALL);
        // In flight towards the acceptor (index 0: written by the connector) and back.
        let mut model = [VecDeque::new(), VecDeque::new()];
        for op in ops {
            match op {
                Op::Write(from_acceptor, runs) => {
                    let d = from_acceptor as usize;
                    let side = if from_acceptor { &mut a } else { &mut c };
                    let refs: Vec<&[u8]> = runs.iter().map(|r| r.as_slice()).collect();
                    let n = write(side, &refs).unwrap();
                    let all: Vec<u8> = runs.concat();
                    prop_assert_eq!(n, all.len().min(SMALL - model[d].len()));
                    model[d].extend(&all[..n]);
                }
                Op::Read(acceptor, len) => {
                    let d = !acceptor as usize;
                    let side = if acceptor { &mut a } else { &mut c };
                    let got = read(side, len).unwrap();
                    let want: Vec<u8> = model[d].drain(..len.min(model[d].len())).collect();
                    prop_assert_eq!(got, want);
                }
            }
        }
    }

    /// A peer that stores anything into the indices this side reads never makes it read or
    /// write outside the rings or panic: an index out of bounds is reported
    /// (`InvalidData`) at the next call that reads it, and the rings stay broken.
    #[test]
    fn a_corrupted_index_is_caught_and_nothing_is_touched_outside(
        steps in prop::collection::vec((op(), prop::option::of(hostile())), 0..100)
    ) {
        let (mut peer, mut me, raw) = pair(SMALL);
        let mut broken = false;
        for (op, evil) in steps {
            let mut expect_break = false;
            if let Some(evil) = evil {
                // Where this side's own indices stand, to know whether the value is out
                // of bounds.
                let (word, value, own, tail_like) = match evil {
                    Hostile::Tail(v) => (TAIL, v, me.rx_head, true),
                    Hostile::Head(v) => (CONTROL + HEAD, v, me.tx_tail, false),
                };
                raw.word(word).store(value, Ordering::Release);
                let span = if tail_like { value.wrapping_sub(own) } else { own.wrapping_sub(value) };
                expect_break = span > SMALL as u64;
                // The honest peer's own copies follow the store, as a hostile peer's would.
                if tail_like { peer.tx_tail = value } else { peer.rx_head = value }
            }
            // The call that reads the bad word reports it; the other kind may not yet.
            let (r_mine, w_mine) = match &op {
                Op::Read(..) => (read(&mut me, 17).map(|_| ()), Ok(())),
                Op::Write(..) => (Ok(()), write(&mut me, &[&[1; 40]]).map(|_| ())),
            };
            let result = r_mine.and(w_mine);
            if broken {
                prop_assert_eq!(result.unwrap_err().kind(), io::ErrorKind::InvalidData);
                continue;
            }
            match result {
                Err(e) => {
                    prop_assert_eq!(e.kind(), io::ErrorKind::InvalidData);
                    broken = true;
                }
                Ok(()) => {
                    // Reads and writes that did not look at the bad word left it for
                    // the next call that does.
                    if expect_break {
                        let again = read(&mut me, 1).and(write(&mut me, &[&[1]]).map(|_| Vec::<u8>::new()));
                        prop_assert!(again.is_err());
                        broken = true;
                    }
                }
            }
            // The peer's side goes on as it likes; its results do not matter here.
            let _ = match op {
                Op::Write(_, runs) => write(&mut peer, &[&runs.concat()]).map(|_| ()),
                Op::Read(_, n) => read(&mut peer, n).map(|_| ()),
            };
        }
    }
}

/// A tail behind this side's head, or more than a ring ahead of it, and a head ahead of
/// this side's tail, each break the rings; a tail within bounds is bytes to read.
#[test]
fn each_kind_of_bad_index_is_caught() {
    // The acceptor reads ring 0 (its control words first) and writes ring 1.
    for (word, value) in [(TAIL, u64::MAX), (TAIL, SMALL as u64 + 1), (CONTROL + HEAD, 1)] {
        let (_, mut me, raw) = pair(SMALL);
        raw.word(word).store(value, Ordering::Release);
        let e = if word == TAIL {
            read(&mut me, 8).unwrap_err()
        } else {
            write(&mut me, &[b"x"]).unwrap_err()
        };
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{word} = {value}");
        assert!(
            e.to_string().contains(if word == TAIL { "tail" } else { "head" }),
            "{e}"
        );
        // Broken for good, both ways.
        assert!(read(&mut me, 8).is_err() && write(&mut me, &[b"x"]).is_err());
    }
    let (_, mut me, raw) = pair(SMALL);
    raw.word(TAIL).store(SMALL as u64, Ordering::Release);
    assert_eq!(read(&mut me, 1000).unwrap().len(), SMALL);
}

/// Only a memfd of exactly the right size, sealed against shrinking, growing and new
/// seals and not against writing, is mapped.
#[test]
fn only_a_sealed_segment_of_the_right_size_is_mapped() {
    use rustix::fs::{MemfdFlags, SealFlags as S};
    let check = |fd: &OwnedFd| {
        Rings::map_with(fd.as_fd(), Side::Acceptor, SMALL)
            .err()
            .map(|e| e.to_string())
    };
    assert_eq!(check(&create_with(SMALL).unwrap()), None);
    let memfd = |len: usize, seals: S| {
        let fd = rustix::fs::memfd_create("t", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
        rustix::fs::ftruncate(&fd, len as u64).unwrap();
        if !seals.is_empty() {
            rustix::fs::fcntl_add_seals(&fd, seals).unwrap();
        }
        fd
    };
    let len = segment_len(SMALL);
    let all = required_seals();
    for (fd, why) in [
        (memfd(len - 1, all), "bytes, not"),
        (memfd(len + 4096, all), "bytes, not"),
        (memfd(len, S::empty()), "sealed"),
        (memfd(len, S::SHRINK | S::SEAL), "sealed"),
        (memfd(len, S::SHRINK | S::GROW), "sealed"),
        (memfd(len, all | S::WRITE), "against writing"),
        (memfd(len, all | S::FUTURE_WRITE), "against writing"),
    ] {
        let e = check(&fd).expect(why);
        assert!(e.contains(why), "{e}: expected {why}");
    }
    // Without sealing allowed, a memfd is born sealed with F_SEAL_SEAL only.
    let unsealable = rustix::fs::memfd_create("t", MemfdFlags::CLOEXEC).unwrap();
    rustix::fs::ftruncate(&unsealable, len as u64).unwrap();
    assert!(check(&unsealable).unwrap().contains("sealed"));
    // A file elsewhere takes no seals; a socket is no file.
    let path = std::env::temp_dir().join(format!("shm-ring-test-{}", std::process::id()));
    let file = std::fs::File::create(&path).unwrap();
    file.set_len(len as u64).unwrap();
    let _ = std::fs::remove_file(&path);
    let e = check(&OwnedFd::from(file)).unwrap();
    assert!(e.contains("no seals") || e.contains("sealed"), "{e}");
    let (sock, _peer) = UnixStream::pair().unwrap();
    assert!(check(&OwnedFd::from(sock))
        .unwrap()
        .contains("not a regular file"));
}

/// The segment crosses the unix socket with its byte; both ends map it and talk.
#[test]
fn the_segment_crosses_the_socket() {
    let (s, t) = UnixStream::pair().unwrap();
    assert_eq!(
        recv_segment(t.as_fd()).unwrap_err().kind(),
        io::ErrorKind::WouldBlock
    );
    let seg = create().unwrap();
    send_segment(s.as_fd(), seg.as_fd()).unwrap();
    let got = recv_segment(t.as_fd()).unwrap().unwrap();
    let mut c = Rings::map(seg.as_fd(), Side::Connector).unwrap();
    let mut a = Rings::map(got.as_fd(), Side::Acceptor).unwrap();
    drop((seg, got));
    // The mappings keep the memory after the descriptors are gone.
    assert_eq!(write(&mut c, &[b"hello"]).unwrap(), 5);
    assert_eq!(read(&mut a, 5).unwrap(), b"hello");
    drop(s);
    assert_eq!(
        recv_segment(t.as_fd()).unwrap_err().kind(),
        io::ErrorKind::UnexpectedEof
    );
}

/// Two descriptors, none, or the wrong byte: refused, and what came closed.
#[test]
fn anything_but_one_descriptor_is_refused() {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage};
    use std::mem::MaybeUninit;
    let send = |s: &UnixStream, byte: u8, fds: &[BorrowedFd<'_>]| {
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(8))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !fds.is_empty() {
            assert!(control.push(SendAncillaryMessage::ScmRights(fds)));
        }
        rustix::net::sendmsg(s, &[io::IoSlice::new(&[byte])], &mut control, SendFlags::empty()).unwrap();
    };
    let seg = create().unwrap();
    let other = create().unwrap();
    let (s, t) = UnixStream::pair().unwrap();
    for (byte, fds, why) in [
        (SEGMENT_TAG, vec![seg.as_fd(), other.as_fd()], "2 descriptors"),
        (SEGMENT_TAG, vec![seg.as_fd(); 8], "more control data"),
        (SEGMENT_TAG, vec![], "0 descriptors"),
        (b'x', vec![seg.as_fd()], "not the segment's byte"),
    ] {
        send(&s, byte, &fds);
        let e = recv_segment(t.as_fd()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        assert!(e.to_string().contains(why), "{e}: expected {why}");
    }
}

/// Waits until `bell` has bytes (or its peer closed); false if nothing came in `limit`.
fn wait_bell(bell: BorrowedFd<'_>, limit: Duration) -> bool {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let mut fds = [PollFd::new(&bell, PollFlags::IN)];
    let t = Timespec {
        tv_sec: limit.as_secs() as i64,
        tv_nsec: limit.subsec_nanos() as i64,
    };
    poll(&mut fds, Some(&t)).unwrap() > 0
}

/// What a side of the test below does with the result of one call: the bytes moved; on
/// `WouldBlock`, it arms `peek` and, unless it finds news after all, sleeps on `bell`
/// until the peer rings (counted in `sleeps`). A lost wake-up leaves it asleep for a
/// bound no healthy run comes near, which fails the test.
fn moved_or_sleep(
    r: io::Result<usize>,
    peek: &Peek,
    bell: BorrowedFd<'_>,
    who: &str,
    sleeps: &mut u32,
) -> usize {
    match r {
        Ok(n) => n,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
            // Up to 100 us between finding nothing and saying so, of every length in
            // turn: the peer publishes in that window often (its wake-up takes about
            // as long), which is what the look after arming is for.
            let until = std::time::Instant::now() + Duration::from_micros(u64::from(*sleeps * 7 % 101));
            while std::time::Instant::now() < until {
                std::hint::spin_loop();
            }
            let armed = peek.arm();
            fence(Ordering::SeqCst);
            if !peek.has_news() {
                *sleeps += 1;
                let stuck = Duration::from_secs(20);
                assert!(wait_bell(bell, stuck), "the {who} slept through its peer's ring");
                assert!(drain_bell(bell).unwrap());
            }
            drop(armed);
            0
        }
        Err(e) => panic!("{e}"),
    }
}

/// A producer and a consumer thread, each sleeping on the doorbell whenever it has
/// nothing to do, move 8 MiB through 4 KiB rings in chunks of every size: every byte
/// arrives in order, and no wake-up is lost.
#[test]
fn sleepers_on_the_doorbell_lose_no_wake_up() {
    const CAP: usize = 4096;
    const TOTAL: usize = 8 << 20;
    let seg = create_with(CAP).unwrap();
    let mut c = Rings::map_with(seg.as_fd(), Side::Connector, CAP).unwrap();
    let mut a = Rings::map_with(seg.as_fd(), Side::Acceptor, CAP).unwrap();
    let (cs, as_) = UnixStream::pair().unwrap();
    let byte = |i: usize| (i % 251) as u8;
    let producer = std::thread::spawn(move || {
        let peek = c.peek();
        let data: Vec<u8> = (0..TOTAL).map(byte).collect();
        let mut off = 0;
        let mut chunk = 1;
        let mut sleeps = 0;
        while off < TOTAL {
            let end = (off + chunk).min(TOTAL);
            let run = RawSlice {
                base: data[off..].as_ptr(),
                len: end - off,
            };
            // SAFETY: `run` lies in `data`, which lives across the call.
            let r = unsafe { c.io(cs.as_fd()).transmit(&[run]) };
            off += moved_or_sleep(r, &peek, cs.as_fd(), "producer", &mut sleeps);
            chunk = chunk % 9000 + 97;
        }
        // The socket goes back with the count, open until the consumer is done: its end
        // of the stream would wake a consumer that slept through a lost ring.
        (sleeps, cs)
    });
    let mut got = 0;
    let mut buf = vec![0u8; 5000];
    let mut len = 1;
    let mut sleeps = 0;
    let peek = a.peek();
    while got < TOTAL {
        // SAFETY: `buf` is ours, at least `len` bytes long, and not borrowed meanwhile.
        let r = unsafe { a.io(as_.as_fd()).recv(buf.as_mut_ptr(), len) };
        let n = moved_or_sleep(r, &peek, as_.as_fd(), "consumer", &mut sleeps);
        for (i, b) in buf[..n].iter().enumerate() {
            assert_eq!(*b, byte(got + i), "byte {}", got + i);
        }
        got += n;
        len = len % 4869 + 131; // at most 4999: within `buf`
    }
    let (producer_sleeps, _cs) = producer.join().unwrap();
    // Both sides did sleep (the test exercised the doorbell), which no figure bounds.
    assert!(sleeps + producer_sleeps > 0);
}

/// Reads exactly `buf.len()` bytes, sleeping on the doorbell whenever none are there.
fn read_all(r: &mut Rings, bell: BorrowedFd<'_>, buf: &mut [u8], sleeps: &mut u32) {
    let peek = r.peek();
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: `buf[got..]` is the caller's and not otherwise borrowed for the call.
        let n = unsafe { r.io(bell).recv(buf[got..].as_mut_ptr(), buf.len() - got) };
        got += moved_or_sleep(n, &peek, bell, "reader", sleeps);
    }
}

/// Writes `msg` whole into a ring with room for it, ringing the peer if it sleeps.
fn send(r: &mut Rings, bell: BorrowedFd<'_>, msg: &[u8]) {
    let run = RawSlice {
        base: msg.as_ptr(),
        len: msg.len(),
    };
    // SAFETY: `run` is `msg`, live across the call.
    assert_eq!(unsafe { r.io(bell).transmit(&[run]) }.unwrap(), msg.len());
}

/// A ping-pong of small messages in which each side sleeps on the doorbell for every
/// answer: the window between finding the ring empty and saying so is crossed on every
/// round, and a wake-up lost in it leaves both sides asleep.
#[test]
fn ping_pong_sleepers_lose_no_wake_up() {
    const ROUNDS: u32 = 20_000;
    let (mut c, mut a, cs, as_) = linked();
    let echo = std::thread::spawn(move || {
        let mut sleeps = 0;
        let mut msg = [0u8; 8];
        for _ in 0..ROUNDS {
            read_all(&mut a, as_.as_fd(), &mut msg, &mut sleeps);
            send(&mut a, as_.as_fd(), &msg);
        }
        (sleeps, as_)
    });
    let mut sleeps = 0;
    let mut msg = [0u8; 8];
    for i in 0..ROUNDS {
        send(&mut c, cs.as_fd(), &u64::from(i).to_le_bytes());
        read_all(&mut c, cs.as_fd(), &mut msg, &mut sleeps);
        assert_eq!(u64::from_le_bytes(msg), u64::from(i));
    }
    let (echo_sleeps, _as) = echo.join().unwrap();
    assert!(sleeps + echo_sleeps > 0);
}

/// The end of the stream on the doorbell socket is the peer gone.
#[test]
fn the_bell_reports_a_closed_peer() {
    let (s, t) = UnixStream::pair().unwrap();
    ring(s.as_fd());
    ring(s.as_fd());
    assert!(drain_bell(t.as_fd()).unwrap());
    drop(s);
    assert!(!drain_bell(t.as_fd()).unwrap());
}

/// Both sides of a fresh segment of small rings, and the two ends of their doorbell.
fn linked() -> (Rings, Rings, UnixStream, UnixStream) {
    let (c, a, _) = pair(SMALL);
    let (cs, as_) = UnixStream::pair().unwrap();
    (c, a, cs, as_)
}

/// A fresh segment's first bytes, each way, ring the reader's doorbell although the
/// reader never read its ring nor said it sleeps: a side whose threads had not yet
/// looked at the ring when they blocked on the socket is woken by the first frame.
#[test]
fn the_first_bytes_each_way_ring_the_bell() {
    let (mut c, mut a, cs, as_) = linked();
    send(&mut c, cs.as_fd(), b"hello");
    assert!(
        wait_bell(as_.as_fd(), Duration::ZERO),
        "the acceptor was not rung for the first bytes"
    );
    send(&mut a, as_.as_fd(), b"hi");
    assert!(
        wait_bell(cs.as_fd(), Duration::ZERO),
        "the connector was not rung for the first bytes"
    );
    // Rung once: later bytes ring only a reader that says again it sleeps.
    assert!(drain_bell(as_.as_fd()).unwrap());
    send(&mut c, cs.as_fd(), b"again");
    assert!(!wait_bell(as_.as_fd(), Duration::ZERO));
}

/// A reader that finds the ring empty, as a spinning poller does between messages, asks
/// for no bell: the writer's next bytes make no system call. Only a reader that arms the
/// ring before it sleeps ([`Peek::arm`]) is rung, once.
#[test]
fn a_spinning_reader_is_not_rung() {
    let (mut c, mut a, cs, as_) = linked();
    let mut buf = [0u8; 16];
    // The fresh segment's first bytes ring once (see above); take that bell.
    send(&mut c, cs.as_fd(), b"first");
    assert!(drain_bell(as_.as_fd()).unwrap());
    for round in 0..100u8 {
        // SAFETY: `buf` is ours and not otherwise borrowed for the call.
        let got = unsafe { a.io(as_.as_fd()).recv(buf.as_mut_ptr(), buf.len()) };
        assert!(got.is_ok(), "round {round}: the bytes were there");
        // SAFETY: as above.
        let empty = unsafe { a.io(as_.as_fd()).recv(buf.as_mut_ptr(), buf.len()) };
        assert_eq!(empty.unwrap_err().kind(), io::ErrorKind::WouldBlock);
        send(&mut c, cs.as_fd(), &[round; 4]);
        assert!(
            !wait_bell(as_.as_fd(), Duration::ZERO),
            "round {round}: a reader that only found the ring empty was rung"
        );
    }
    let peek = a.peek();
    let _armed = peek.arm();
    fence(Ordering::SeqCst);
    assert!(peek.has_news(), "the last bytes are unread");
    // SAFETY: as above.
    unsafe { a.io(as_.as_fd()).recv(buf.as_mut_ptr(), buf.len()) }.unwrap();
    send(&mut c, cs.as_fd(), b"wake");
    assert!(
        wait_bell(as_.as_fd(), Duration::ZERO),
        "an armed reader was not rung"
    );
}

/// A peer that publishes its last frames and closes between a reader's look at the
/// empty ring and its take of the doorbell: the reader gets those frames before the end
/// of the stream, as from a socket (the end seen first lost a responder's last NAK).
#[test]
fn the_last_frames_before_a_close_come_before_the_end() {
    let (mut c, mut a, cs, as_) = linked();
    let peek = a.peek();
    // A wait reported the doorbell readable (an earlier bell).
    ring(cs.as_fd());
    peek.note_rung();
    let mut peer = Some((cs, &mut c));
    let mut buf = [0u8; 16];
    let mut read = || {
        // SAFETY: `buf` is ours and not otherwise borrowed for the call.
        let r = unsafe { a.io(as_.as_fd()).recv(buf.as_mut_ptr(), buf.len()) };
        if let Some((sock, c)) = peer.take() {
            // Right after this side's look found the ring empty.
            send(c, sock.as_fd(), b"last");
            drop(sock);
        }
        r
    };
    assert_eq!(
        peek.read_or_end(as_.as_fd(), &mut read).unwrap(),
        4,
        "the end of the stream came before the frames published ahead of it"
    );
    // Empty now: the end is seen (again) by the next read.
    assert_eq!(peek.read_or_end(as_.as_fd(), &mut read).unwrap(), 0);
}

/// A thread counted among the sleepers stays counted until it disarms, whoever takes
/// the bell: when another thread of its side takes the bell and the bytes (the progress
/// thread, while this one waits in `ibv_get_cq_event`), the peer's next bytes ring
/// again. (With a flag that the ringer cleared, the sleeper's one ring was gone and it
/// slept through every later frame.)
#[test]
fn a_sleeper_whose_bell_another_thread_took_is_rung_again() {
    let (mut c, mut a, cs, as_) = linked();
    let mut buf = [0u8; 16];
    // The fresh segment's first bytes ring once; take that bell and the bytes.
    send(&mut c, cs.as_fd(), b"first");
    assert!(drain_bell(as_.as_fd()).unwrap());
    // SAFETY: `buf` is ours and not otherwise borrowed for the call.
    unsafe { a.io(as_.as_fd()).recv(buf.as_mut_ptr(), buf.len()) }.unwrap();
    let sleeper = a.peek();
    let armed = sleeper.arm();
    fence(Ordering::SeqCst);
    assert!(!sleeper.has_news());
    for round in 0..3 {
        send(&mut c, cs.as_fd(), b"frame");
        assert!(
            wait_bell(as_.as_fd(), Duration::ZERO),
            "round {round}: a counted sleeper was not rung"
        );
        // Another thread of this side takes the bell and the bytes.
        assert!(drain_bell(as_.as_fd()).unwrap());
        // SAFETY: as above.
        unsafe { a.io(as_.as_fd()).recv(buf.as_mut_ptr(), buf.len()) }.unwrap();
    }
    drop(armed);
    send(&mut c, cs.as_fd(), b"after");
    assert!(!wait_bell(as_.as_fd(), Duration::ZERO), "rung with no sleeper");
}

/// A write that leaves bytes for want of room asks the reader for a bell, whichever
/// thread sleeps (the one that filled the ring may be a poster that went on, while the
/// thread asleep on the socket armed before): the reader rings once half the ring is
/// free, once, not per read; a spinning writer sees the room in memory.
#[test]
fn a_full_ring_rings_its_writer_once_half_of_it_is_free() {
    let (mut c, mut a, cs, as_) = linked();
    let writer = c.peek();
    let mut buf = [0u8; SMALL];
    let big = [9u8; 2 * SMALL];
    let run = [RawSlice {
        base: big.as_ptr(),
        len: big.len(),
    }];
    // SAFETY: `run` is `big`, live across the call.
    assert_eq!(unsafe { c.io(cs.as_fd()).transmit(&run) }.unwrap(), SMALL);
    // (The fresh segment's first bytes rang the reader.)
    assert!(drain_bell(as_.as_fd()).unwrap());
    assert!(!writer.has_news(), "no room yet");
    let mut take = |n: usize| {
        // SAFETY: `buf` is ours, `n <= SMALL` bytes of it, not otherwise borrowed.
        let got = unsafe { a.io(as_.as_fd()).recv(buf.as_mut_ptr(), n) }.unwrap();
        assert_eq!(got, n);
    };
    take(SMALL / 4);
    assert!(
        !wait_bell(cs.as_fd(), Duration::ZERO),
        "rung for a quarter of the ring"
    );
    assert!(!writer.has_news());
    take(SMALL / 4);
    assert!(
        wait_bell(cs.as_fd(), Duration::ZERO),
        "not rung with half the ring free"
    );
    assert!(writer.has_news(), "half the ring is free");
    assert!(drain_bell(cs.as_fd()).unwrap());
    take(SMALL / 4);
    assert!(
        !wait_bell(cs.as_fd(), Duration::ZERO),
        "rung twice for one full ring"
    );
    // SAFETY: as above.
    assert_eq!(unsafe { c.io(cs.as_fd()).transmit(&run) }.unwrap(), 3 * SMALL / 4);
    assert!(!writer.has_news());
}

/// A received segment's rings are as large as its size says, of the two sizes this build
/// makes; any other size is refused before it is mapped.
#[test]
fn a_segment_maps_with_the_capacity_its_size_gives() {
    for cap in [CAPACITY, SMALL_CAPACITY] {
        let seg = create_with(cap).unwrap();
        let r = Rings::map(seg.as_fd(), Side::Acceptor).unwrap();
        assert_eq!(r.cap, cap);
    }
    let seg = create_with(SMALL).unwrap();
    let e = Rings::map(seg.as_fd(), Side::Acceptor)
        .err()
        .expect("a segment of another size");
    assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
}

/// A large copy publishes its index chunk by chunk, both ways: a reader takes the first
/// chunks of a payload while the writer still copies the rest, and the writer refills
/// what the reader freed while the reader still copies the rest, instead of the two
/// sides taking turns over whole payloads (a READ response, a WRITE). Counted as the
/// stores of each side's shared index during one call that moves a payload of about
/// half the ring (with one store per call, every byte of a payload waited for its last).
#[test]
fn a_large_copy_is_published_chunk_by_chunk_both_ways() {
    let (mut c, mut a, _) = pair(CAPACITY);
    let len = CAPACITY / 2 - 8;
    let src: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    let chunks = len.div_ceil(CHUNK) as u64;
    assert!(chunks > 1);
    // Off the ring's start, so that the copies wrap at its end too.
    for round in 0..3 {
        let before = (c.published, a.published);
        assert_eq!(write(&mut c, &[&src[..8], &src[8..]]).unwrap(), len);
        assert_eq!(
            c.published - before.0,
            chunks,
            "round {round}: the writer's tail was not published chunk by chunk"
        );
        assert_eq!(read(&mut a, len).unwrap(), src, "round {round}");
        assert_eq!(
            a.published - before.1,
            chunks,
            "round {round}: the reader's head was not published chunk by chunk"
        );
    }
}
