//! Connection setup for the sim (tokio + socket2): the device's listener, and for every
//! QP pair one TCP connection that carries both directions. Once the hello exchange is
//! done, the socket is handed to the device's [`progress`](crate::progress) engine, which
//! runs the data path; this module only sets connections up, and again when they break.
//!
//! - The QP with the smaller (GID, LID, QPN) is *active*: from RTR on it connects to the
//!   peer device (address from its address vector) and says hello (its GID, LID and QPN,
//!   and the QPN it wants). The peer device accepts only for a passive QP in RTR/RTS/SQD
//!   whose destination QPN and address vector name exactly that peer.
//! - A refused or failed connection is retried with backoff (100 µs doubling to 10 ms)
//!   while the QP lives; meanwhile WRs wait as for lost packets: the requester's ACK timer
//!   runs (in the progress engine), and `retry_cnt` expiries end in `IBV_WC_RETRY_EXC_ERR`.
//! - A hello of another protocol version ([`wire::VERSION`](crate::wire::VERSION): another
//!   build of the sim) is refused as such (`HelloReject::Version`, and a warning on both
//!   sides); that refusal is final: the connecting QP stops trying, and its WRs end in
//!   `IBV_WC_RETRY_EXC_ERR` with `vendor_err` EPROTO.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::TcpStream;
use verbs_api::{QpState, Result};

use crate::device::DeviceShared;
use crate::qp::QpShared;
use crate::rx::{Event, Reader};
use crate::wire::{Frame, HelloReject, WireError, VERSION};

/// Bound on connecting and on the hello exchange.
const SETUP_TIMEOUT: Duration = Duration::from_secs(5);

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
                    let _ = crate::sockopt::tune(&stream);
                    let dev = weak.clone();
                    tokio::spawn(async move {
                        if let Err(e) = serve_inbound(dev, stream).await {
                            tracing::debug!(%peer, "inbound connection ended: {e}");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!("accept failed: {e}{}", fd_hint(&e));
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    });
    Ok(())
}

/// Starts the task that connects `qp` (the active side of its pair) for `epoch`.
pub fn spawn_connector(qp: Arc<QpShared>, epoch: u64) {
    let rt = qp.dev.rt.clone();
    rt.spawn(connector_task(qp, epoch));
}

/// For errors that mean the process ran out of file descriptors: what to do about it.
fn fd_hint(e: &io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::EMFILE) | Some(libc::ENFILE) => {
            " (every connected QP holds a socket: raise the open-file limit, `ulimit -n`)"
        }
        _ => "",
    }
}

/// The `errno` that best names why a connection attempt failed (see
/// `Requester::link_error`).
fn errno_of(e: &io::Error) -> u32 {
    let errno = e.raw_os_error().unwrap_or(match e.kind() {
        io::ErrorKind::TimedOut => libc::ETIMEDOUT,
        io::ErrorKind::ConnectionRefused => libc::ECONNREFUSED,
        io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset => libc::ECONNRESET,
        _ => libc::EPROTO,
    });
    errno.max(0) as u32
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

/// Reads one frame; a malformed one is an `InvalidData` error carrying the [`WireError`].
async fn read_frame(stream: &TcpStream, reader: &mut Reader) -> io::Result<Frame> {
    loop {
        match reader
            .next_event()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?
        {
            Some(Event::Frame(f)) => return Ok(f),
            Some(Event::PayloadDone(_) | Event::PayloadLost(_)) => return Err(proto("payload during setup")),
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
    let hello = match tokio::time::timeout(SETUP_TIMEOUT, read_frame(&stream, &mut reader))
        .await
        .map_err(|_| proto("no hello within the setup timeout"))?
    {
        Ok(f) => f,
        Err(e) => {
            if let Some(WireError::Version(v)) = e.get_ref().and_then(|i| i.downcast_ref::<WireError>()) {
                // Another build: say so, so that its side reports it instead of retrying.
                tracing::warn!("refused a connection from a peer that speaks sim protocol version {v} (this build: {VERSION})");
                send_frame(
                    &mut stream,
                    &Frame::HelloNak {
                        reason: HelloReject::Version,
                    },
                )
                .await?;
            }
            return Err(e);
        }
    };
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
            let peer = (src_gid, src_lid, src_qpn);
            let self_loop = g.active && peer == qp.local_id();
            if !matches!(g.state, QpState::Rtr | QpState::Rts | QpState::Sqd) {
                Err(HelloReject::NotReady)
            } else if g.attr.dest_qp_num != src_qpn
                || ah.dlid != src_lid
                || (ah.is_global && ah.grh.dgid.0 != src_gid)
            {
                Err(HelloReject::WrongPeer)
            } else if g.active && !self_loop {
                // This side sets the connection up; a peer that thinks otherwise names
                // the pair differently (e.g. another GID).
                Err(HelloReject::WrongPeer)
            } else {
                g.conn_gen += 1;
                Ok((g.epoch, g.conn_gen, self_loop))
            }
        }
    };
    match verdict {
        Err(reason) => {
            send_frame(&mut stream, &Frame::HelloNak { reason }).await?;
            Err(proto(format!("refused hello for QP {dst_qpn:#x}: {reason:?}")))
        }
        Ok((epoch, gen, self_loop)) => {
            send_frame(&mut stream, &Frame::HelloAck).await?;
            let qp = qp.expect("accepted QPs exist");
            let sock = stream.into_std()?;
            let progress = qp.dev.progress.clone();
            let conn = progress.register(&qp, epoch, sock, reader)?;
            let old = {
                let mut g = qp.inner.lock();
                if qp.is_stale(&g, epoch) || g.conn_gen != gen {
                    drop(g);
                    progress.close(&conn);
                    return Ok(());
                }
                if self_loop {
                    g.self_conn.replace(conn.clone())
                } else {
                    // A newer connection supersedes the old one: what was in flight on it
                    // is resent, half-received requests are forgotten. Only now, in the
                    // same critical section that retires the old connection: rewound
                    // earlier, the old connection (still current) would carry the resent
                    // requests to a peer that has left it, and responses still buffered
                    // on it would complete the resent WQEs out of order.
                    g.resp.connection_lost();
                    g.req.on_connection_lost();
                    g.req.link_error = 0;
                    g.conn.replace(conn.clone())
                }
            };
            if let Some(old) = old {
                progress.close(&old);
            }
            progress.activate(&conn);
            Ok(())
        }
    }
}

// ---------------------------------------------------------------- requester side

async fn connector_task(qp: Arc<QpShared>, epoch: u64) {
    let mut backoff = Duration::from_micros(100);
    loop {
        // Wait until the QP needs a connection it does not have.
        let remote = loop {
            let notified = qp.req_wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let g = qp.inner.lock();
                if qp.is_stale(&g, epoch) || g.state == QpState::Err {
                    return;
                }
                if g.conn.is_none() && matches!(g.state, QpState::Rtr | QpState::Rts | QpState::Sqd) {
                    match g.remote {
                        Some(r) => break r,
                        None => return,
                    }
                }
            }
            notified.await;
        };
        match connect(&qp, remote).await {
            Ok((stream, reader)) => {
                backoff = Duration::from_micros(100);
                let progress = qp.dev.progress.clone();
                let gen = {
                    let mut g = qp.inner.lock();
                    g.conn_gen += 1;
                    g.conn_gen
                };
                let conn = match stream
                    .into_std()
                    .and_then(|s| progress.register(&qp, epoch, s, reader))
                {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(
                            qpn = qp.qpn,
                            "cannot hand the connection to the progress engine: {e}"
                        );
                        continue;
                    }
                };
                {
                    let mut g = qp.inner.lock();
                    if qp.is_stale(&g, epoch) || g.state == QpState::Err || g.conn_gen != gen {
                        drop(g);
                        progress.close(&conn);
                        return;
                    }
                    g.conn = Some(conn.clone());
                    g.req.link_error = 0;
                }
                progress.activate(&conn);
            }
            Err(e) if e.kind() == io::ErrorKind::Unsupported => {
                // The peer will never accept: say so once, and let the WRs fail as for a
                // lost link (the ACK timer runs out; `vendor_err` EPROTO).
                tracing::warn!(qpn = qp.qpn, %remote, "cannot connect: {e}");
                let mut g = qp.inner.lock();
                g.req.link_error = errno_of(&e);
                g.req.arm_timer(QpShared::now());
                qp.dev.progress.rearm(&qp, &mut g);
                return;
            }
            Err(e) => {
                match fd_hint(&e) {
                    "" => tracing::debug!(qpn = qp.qpn, %remote, "connection attempt failed: {e}"),
                    hint => tracing::warn!(qpn = qp.qpn, %remote, "cannot connect: {e}{hint}"),
                }
                {
                    // Like a lost packet: the ACK timer runs (if there is work) and counts.
                    let mut g = qp.inner.lock();
                    g.req.link_error = errno_of(&e);
                    g.req.arm_timer(QpShared::now());
                    qp.dev.progress.rearm(&qp, &mut g);
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(10));
            }
        }
    }
}

async fn connect(qp: &QpShared, remote: std::net::SocketAddr) -> io::Result<(TcpStream, Reader)> {
    let mut stream = tokio::time::timeout(SETUP_TIMEOUT, TcpStream::connect(remote))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))??;
    crate::sockopt::tune(&stream)?;
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
        // Permanent: `Unsupported` tells the connector to stop trying.
        Frame::HelloNak {
            reason: HelloReject::Version,
        } => Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("the peer device speaks another sim protocol version (this build: {VERSION}); run the same build on both sides"),
        )),
        Frame::HelloNak { reason } => Err(io::Error::new(
            io::ErrorKind::ConnectionRefused,
            format!("peer refused QP {dst_qpn:#x}: {reason:?}"),
        )),
        other => Err(proto(format!("expected hello answer, got {other}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn running_out_of_descriptors_comes_with_a_hint() {
        for errno in [libc::EMFILE, libc::ENFILE] {
            assert!(fd_hint(&io::Error::from_raw_os_error(errno)).contains("ulimit -n"));
        }
        assert_eq!(fd_hint(&io::Error::from_raw_os_error(libc::ECONNREFUSED)), "");
        assert_eq!(fd_hint(&proto("bad hello")), "");
    }

    #[test]
    fn a_failed_connection_is_named_by_an_errno() {
        let os = |n| io::Error::from_raw_os_error(n);
        assert_eq!(errno_of(&os(libc::EMFILE)), libc::EMFILE as u32);
        assert_eq!(errno_of(&os(libc::ECONNREFUSED)), libc::ECONNREFUSED as u32);
        let kind = |k, m: &str| io::Error::new(k, m.to_string());
        // A hello the peer refused, no answer in time, a peer that hung up, nonsense.
        assert_eq!(
            errno_of(&kind(io::ErrorKind::ConnectionRefused, "refused")),
            libc::ECONNREFUSED as u32
        );
        assert_eq!(
            errno_of(&kind(io::ErrorKind::TimedOut, "no answer")),
            libc::ETIMEDOUT as u32
        );
        assert_eq!(
            errno_of(&kind(io::ErrorKind::UnexpectedEof, "closed")),
            libc::ECONNRESET as u32
        );
        assert_eq!(errno_of(&proto("bad hello")), libc::EPROTO as u32);
    }
}
