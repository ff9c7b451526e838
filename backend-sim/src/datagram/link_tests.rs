//! Unit tests of a link's writers: a connection manager's message is in the socket when
//! the call that sends it returns, whichever thread holds the writer then, and bytes a
//! sender leaves to the link's task while the task looks for a backlog are seen by it.

use std::io::Read;
use std::net::SocketAddr;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::sync::{mpsc, Arc};
use std::time::Duration;

use super::Link;
use crate::stream::Stream;
use backend_sim_proto::qp::DatagramSource;

/// How long the thread that holds the writer keeps it: long enough that a send which does
/// not wait for it returns first.
const HOLD: Duration = Duration::from_millis(200);

/// A link over a unix socket pair, and the other end of it (non-blocking).
fn link() -> (tokio::runtime::Runtime, Arc<Link>, StdUnixStream) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let (a, b) = {
        let _in = rt.enter();
        tokio::net::UnixStream::pair().expect("a socket pair")
    };
    let addr: SocketAddr = "127.0.0.1:4791".parse().expect("an address");
    let link = Link::new(Stream::Unix(a, addr, addr), addr, DatagramSource::default());
    let peer = b.into_std().expect("the peer's socket");
    peer.set_nonblocking(true).expect("non-blocking");
    (rt, link, peer)
}

/// What the other end can read now.
fn read_now(peer: &mut StdUnixStream) -> Vec<u8> {
    let mut got = vec![0u8; 4096];
    match peer.read(&mut got) {
        Ok(n) => got.truncate(n),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => got.clear(),
        Err(e) => panic!("reading the link's other end: {e}"),
    }
    got
}

#[test]
fn a_cm_message_is_in_the_socket_when_its_send_returns_though_another_thread_holds_the_writer() {
    let (_rt, link, mut peer) = link();
    let (held, holding) = mpsc::channel();
    // A thread in the middle of a write, descheduled, whose program exits before it goes
    // around again for what was appended meanwhile: it lets the writer go and writes
    // nothing more.
    let holder = {
        let link = link.clone();
        std::thread::spawn(move || {
            let w = link.writer.lock();
            held.send(()).expect("the test waits");
            std::thread::sleep(HOLD);
            drop(w);
        })
    };
    holding.recv().expect("the holder took the writer");
    let rej = b"a REJ, as the connection manager frames it";
    let mut woken = Vec::new();
    assert!(link.send_now(rej, &mut woken), "the link is open");
    assert_eq!(
        read_now(&mut peer),
        rej,
        "the CM message was not in the socket when its send returned"
    );
    holder.join().expect("the holder");
}

#[test]
fn bytes_left_to_the_task_while_it_looks_for_a_backlog_count_as_backlog() {
    let (_rt, link, mut peer) = link();
    let mut woken = Vec::new();
    // A sender that appends while the task's check holds the writer finds it taken and
    // leaves its bytes to the task.
    let waiting = link.backlog_with(|| {
        assert!(link.append_bytes(b"a datagram"));
        link.flush(&mut woken);
    });
    assert!(
        read_now(&mut peer).is_empty(),
        "the sender wrote with the writer taken"
    );
    assert!(
        waiting,
        "the task saw no backlog: the datagram waits for its next wake"
    );
}

/// A burst of CM messages larger than a datagram queue, to a peer that does not read
/// yet (its socket full), is kept whole up to [`GSI_QUEUE_MAX`](super::GSI_QUEUE_MAX):
/// dropped, each would wait for its resend. Beyond that bound they are dropped, so a
/// peer that never reads cannot grow this side's memory.
#[test]
fn a_burst_of_cm_messages_beyond_a_datagram_queue_is_kept_up_to_its_bound() {
    let (_rt, link, _peer) = link();
    let mut woken = Vec::new();
    let msg = [0x5au8; 400];
    let mut sent = 0;
    while sent < 2 * super::QUEUE_MAX + (256 << 10) {
        assert!(
            link.send_now(&msg, &mut woken),
            "a CM message was dropped after {sent} bytes"
        );
        sent += msg.len();
    }
    let mut more = 0;
    while link.send_now(&msg, &mut woken) {
        more += msg.len();
        assert!(
            sent + more <= super::GSI_QUEUE_MAX + (16 << 20),
            "no bound: {} bytes queued",
            sent + more
        );
    }
    assert!(link.queue.lock().len() <= super::GSI_QUEUE_MAX + msg.len());
}
