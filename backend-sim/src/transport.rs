//! The TCP side of the sim (tokio + socket2): the device's listener, and per QP one
//! outgoing connection for its requester and one incoming connection for its responder.
//! Everything protocol-related happens in the sans-IO [`Requester`](crate::requester)
//! and [`Responder`](crate::responder); this module only moves bytes and time.
//!
//! - Connection setup: the requester of a QP in RTS with work to do connects to the
//!   peer device (address from the QP's address vector) and says hello (its GID, LID and
//!   QPN, and the QPN it wants). The device accepts only for a QP in RTR/RTS/SQD whose
//!   destination QPN and address vector name exactly that peer. A refused or failed
//!   connection counts like a lost packet: the requester's ACK timer runs, and
//!   `retry_cnt` failed attempts end in `IBV_WC_RETRY_EXC_ERR`.
//! - No lock is held across I/O: a task takes the QP's lock to process what it read or
//!   to collect what to send, drops it, then reads or writes without blocking.
//! - Back-pressure: the responder stops reading requests while its replies back up, the
//!   requester stops building requests while its queue backs up; both always keep reading
//!   the other direction, so two peers can never block each other.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::TcpStream;
use verbs_api::{QpState, Result};

use crate::device::DeviceShared;
use crate::engine::{drive_requester, drive_responder, Stop};
use crate::qp::QpShared;
use crate::rx::{Event, Reader};
use crate::tx::TxQueue;
use crate::wire::{Frame, HelloReject};

/// Bound on connecting and on the hello exchange.
const SETUP_TIMEOUT: Duration = Duration::from_secs(5);
/// Stop producing frames while this many bytes wait to be written.
const TX_HIGH: usize = 4 << 20;
/// WQEs turned into frames per pass.
const BUDGET: usize = 64;

/// Starts accepting connections for `dev`.
pub fn spawn_listener(dev: &Arc<DeviceShared>, listener: std::net::TcpListener) -> Result<()> {
    let _guard = dev.rt.enter();
    let listener = tokio::net::TcpListener::from_std(listener).map_err(|source| verbs_api::Error::Os {
        call: "register listener",
        source,
    })?;
    let weak = Arc::downgrade(dev);
    dev.rt.spawn(async move {
        loop {
            match listener.accept().await {
                Ok((stream, peer)) => {
                    let _ = stream.set_nodelay(true);
                    let dev = weak.clone();
                    tokio::spawn(async move {
                        if let Err(e) = serve_inbound(dev, stream).await {
                            tracing::debug!(%peer, "inbound connection ended: {e}");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    });
    Ok(())
}

/// Starts the requester task of `qp` for `epoch` (called on RTR → RTS).
pub fn spawn_requester(qp: Arc<QpShared>, epoch: u64) {
    let rt = qp.dev.rt.clone();
    rt.spawn(requester_task(qp, epoch));
}

fn proto(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// Reads more bytes into `reader`, waiting until some arrive.
async fn fill(stream: &TcpStream, reader: &mut Reader) -> io::Result<()> {
    let fd = stream.as_raw_fd();
    loop {
        stream.readable().await?;
        match stream.try_io(Interest::READABLE, || reader.fill(fd)) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "peer closed the connection",
                ))
            }
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
}

async fn read_frame(stream: &TcpStream, reader: &mut Reader) -> io::Result<Frame> {
    loop {
        match reader.next_event().map_err(|e| proto(e.to_string()))? {
            Some(Event::Frame(f)) => return Ok(f),
            Some(Event::PayloadDone(_)) => return Err(proto("payload during setup")),
            None => fill(stream, reader).await?,
        }
    }
}

async fn send_frame(stream: &mut TcpStream, f: &Frame) -> io::Result<()> {
    let mut b = [0u8; crate::wire::MAX_HDR_LEN];
    let n = f.encode(&mut b);
    stream.write_all(&b[..n]).await
}

// ---------------------------------------------------------------- responder side

async fn serve_inbound(dev: Weak<DeviceShared>, mut stream: TcpStream) -> io::Result<()> {
    let mut reader = Reader::new();
    let hello = tokio::time::timeout(SETUP_TIMEOUT, read_frame(&stream, &mut reader))
        .await
        .map_err(|_| proto("no hello within the setup timeout"))??;
    let Frame::Hello {
        src_gid,
        src_lid,
        src_qpn,
        dst_qpn,
    } = hello
    else {
        return Err(proto(format!("expected hello, got {hello}")));
    };
    let Some(dev) = dev.upgrade() else {
        return Ok(());
    };
    let qp = dev.qps.lock().get(&dst_qpn).and_then(Weak::upgrade);
    drop(dev);
    let verdict = match &qp {
        None => Err(HelloReject::NoSuchQp),
        Some(qp) => {
            let mut g = qp.inner.lock();
            let ah = g.attr.ah_attr;
            if !matches!(g.state, QpState::Rtr | QpState::Rts | QpState::Sqd) {
                Err(HelloReject::NotReady)
            } else if g.attr.dest_qp_num != src_qpn
                || ah.dlid != src_lid
                || (ah.is_global && ah.grh.dgid.0 != src_gid)
            {
                Err(HelloReject::WrongPeer)
            } else {
                g.inbound_gen += 1;
                Ok((g.epoch, g.inbound_gen))
            }
        }
    };
    match verdict {
        Err(reason) => {
            send_frame(&mut stream, &Frame::HelloNak { reason }).await?;
            Err(proto(format!("refused hello for QP {dst_qpn:#x}: {reason:?}")))
        }
        Ok((epoch, gen)) => {
            send_frame(&mut stream, &Frame::HelloAck).await?;
            let qp = qp.expect("accepted QPs exist");
            qp.resp_wake.notify_one();
            responder_loop(qp, stream, reader, epoch, gen).await
        }
    }
}

async fn responder_loop(
    qp: Arc<QpShared>,
    stream: TcpStream,
    mut reader: Reader,
    epoch: u64,
    gen: u64,
) -> io::Result<()> {
    let fd = stream.as_raw_fd();
    let mut tx = TxQueue::new();
    loop {
        {
            let mut g = qp.inner.lock();
            if qp.is_stale(&g, epoch) || g.inbound_gen != gen {
                return Ok(());
            }
            loop {
                let accepting = matches!(g.state, QpState::Rtr | QpState::Rts | QpState::Sqd);
                let (_, resp, _, rwc) = QpShared::scratch(&mut g);
                let r = drive_responder(resp, accepting, &mut reader, &qp.dev.mrs, &mut tx, rwc, TX_HIGH);
                match r {
                    Ok(()) => {
                        qp.deliver(&mut g);
                        break;
                    }
                    Err(Stop::Fatal(status)) => {
                        tracing::debug!(qpn = qp.qpn, ?status, "responder error: QP to ERR");
                        qp.enter_error(&mut g);
                    }
                    Err(Stop::Protocol(msg)) => {
                        qp.enter_error(&mut g);
                        return Err(proto(msg));
                    }
                }
            }
        }
        if !tx.is_empty() {
            match stream.try_io(Interest::WRITABLE, || tx.write_to(fd)) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        tokio::select! {
            r = stream.readable(), if tx.pending() <= TX_HIGH => {
                r?;
                match stream.try_io(Interest::READABLE, || reader.fill(fd)) {
                    Ok(0) => return Ok(()),
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
            }
            r = stream.writable(), if !tx.is_empty() => { r?; }
            _ = qp.resp_wake.notified() => {}
        }
    }
}

// ---------------------------------------------------------------- requester side

enum End {
    /// The QP was reset, destroyed or moved to ERR: the task is done.
    Stale,
    /// The connection broke: reconnect and resend.
    Lost(io::Error),
}

async fn requester_task(qp: Arc<QpShared>, epoch: u64) {
    let mut backoff = Duration::from_millis(1);
    loop {
        let (remote, deadline, want) = {
            let g = qp.inner.lock();
            if qp.is_stale(&g, epoch) || g.state == QpState::Err {
                return;
            }
            (
                g.remote,
                g.req.next_deadline(),
                g.req.has_unsent() && g.state == QpState::Rts,
            )
        };
        if !want {
            wait_work(&qp, deadline).await;
            continue;
        }
        let Some(remote) = remote else { return };
        match connect(&qp, remote).await {
            Ok((stream, reader)) => {
                backoff = Duration::from_millis(1);
                match run_requester(&qp, epoch, stream, reader).await {
                    End::Stale => return,
                    End::Lost(e) => {
                        tracing::debug!(qpn = qp.qpn, "requester connection lost: {e}");
                        qp.inner.lock().req.on_connection_lost();
                    }
                }
            }
            Err(e) => {
                tracing::debug!(qpn = qp.qpn, %remote, "connection attempt failed: {e}");
                let deadline = {
                    let mut g = qp.inner.lock();
                    g.req.arm_timer(QpShared::now());
                    g.req.next_deadline()
                };
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = sleep_until(deadline) => {}
                }
                on_timer(&qp);
                backoff = (backoff * 2).min(Duration::from_millis(50));
            }
        }
    }
}

async fn sleep_until(deadline: Option<std::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        None => std::future::pending().await,
    }
}

fn on_timer(qp: &QpShared) {
    let mut g = qp.inner.lock();
    let (req, _, swc, _) = QpShared::scratch(&mut g);
    if req.on_timer(QpShared::now(), swc).is_err() {
        qp.enter_error(&mut g);
    }
    qp.deliver(&mut g);
}

async fn wait_work(qp: &QpShared, deadline: Option<std::time::Instant>) {
    tokio::select! {
        _ = qp.req_wake.notified() => {}
        _ = sleep_until(deadline) => on_timer(qp),
    }
}

async fn connect(qp: &QpShared, remote: std::net::SocketAddr) -> io::Result<(TcpStream, Reader)> {
    let mut stream = tokio::time::timeout(SETUP_TIMEOUT, TcpStream::connect(remote))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))??;
    stream.set_nodelay(true)?;
    let dst_qpn = qp.inner.lock().attr.dest_qp_num;
    let hello = Frame::Hello {
        src_gid: qp.dev.gid.0,
        src_lid: qp.dev.listen.port(),
        src_qpn: qp.qpn,
        dst_qpn,
    };
    send_frame(&mut stream, &hello).await?;
    let mut reader = Reader::new();
    let answer = tokio::time::timeout(SETUP_TIMEOUT, read_frame(&stream, &mut reader))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no answer to hello"))??;
    match answer {
        Frame::HelloAck => Ok((stream, reader)),
        Frame::HelloNak { reason } => Err(io::Error::new(
            io::ErrorKind::ConnectionRefused,
            format!("peer refused QP {dst_qpn:#x}: {reason:?}"),
        )),
        other => Err(proto(format!("expected hello answer, got {other}"))),
    }
}

async fn run_requester(qp: &Arc<QpShared>, epoch: u64, stream: TcpStream, mut reader: Reader) -> End {
    let fd = stream.as_raw_fd();
    let mut tx = TxQueue::new();
    let mut read_psn: Option<u32> = None;
    loop {
        let deadline = {
            let mut g = qp.inner.lock();
            if qp.is_stale(&g, epoch) || g.state == QpState::Err {
                return End::Stale;
            }
            let now = QpShared::now();
            let (req, _, swc, _) = QpShared::scratch(&mut g);
            let r = drive_requester(req, &mut reader, now, swc, &mut read_psn);
            match r {
                Ok(()) => qp.deliver(&mut g),
                Err(Stop::Fatal(_)) => qp.enter_error(&mut g),
                Err(Stop::Protocol(msg)) => {
                    tracing::warn!(qpn = qp.qpn, "{msg}");
                    qp.enter_error(&mut g);
                    return End::Stale;
                }
            }
            if g.state == QpState::Err {
                return End::Stale;
            }
            if tx.pending() < TX_HIGH && g.state == QpState::Rts {
                let (req, _, swc, _) = QpShared::scratch(&mut g);
                if req.poll_transmit(&qp.dev.mrs, now, &mut tx, BUDGET, swc).is_err() {
                    qp.enter_error(&mut g);
                }
                qp.deliver(&mut g);
            }
            g.req.next_deadline()
        };
        if !tx.is_empty() {
            match stream.try_io(Interest::WRITABLE, || tx.write_to(fd)) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return End::Lost(e),
            }
        }
        tokio::select! {
            r = stream.readable() => {
                if let Err(e) = r {
                    return End::Lost(e);
                }
                match stream.try_io(Interest::READABLE, || reader.fill(fd)) {
                    Ok(0) => return End::Lost(io::Error::new(io::ErrorKind::UnexpectedEof, "peer closed the connection")),
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return End::Lost(e),
                }
            }
            r = stream.writable(), if !tx.is_empty() => {
                if let Err(e) = r {
                    return End::Lost(e);
                }
            }
            _ = qp.req_wake.notified() => {}
            _ = sleep_until(deadline) => on_timer(qp),
        }
    }
}
