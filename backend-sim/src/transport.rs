//! Connection setup for the sim (tokio + socket2): for every QP pair one TCP connection
//! (a unix socket between two devices on the same host, see
//! [`same_host`](crate::same_host)) that carries both directions (and, handed to [`datagram`](crate::datagram), the
//! hellos of links for UD datagrams and their checks). Once the hello exchange is done, the socket is handed to
//! the device's [`progress`](crate::progress) engine, which runs the data path; this
//! module only sets connections up, and again when they break. The device's
//! [`listener`](crate::listener) accepts the connections and bounds them.
//!
//! - The QP with the smaller (GID, LID, QPN) is *active*: from RTR on it connects to the
//!   peer device (address from its address vector) and says hello (its GID, LID and QPN,
//!   the QPN it wants, and a fresh token). The peer device considers it only for a
//!   passive QP in RTR/RTS/SQD whose destination QPN and address vector name exactly that
//!   peer, and accepts it only once the device at the address that address vector names
//!   confirmed the token ([`verify`](crate::verify)). A confirmed hello replaces the QP's
//!   connection (a reconnect after a reset or a half-open socket); nothing else touches it.
//! - Every refusal is the same bytes ([`HelloReject::Refused`]): a stranger learns
//!   nothing about which QPs exist. The real reason is logged at debug level.
//! - The active QP's connector runs from RTR until the QP is reset, destroyed or in ERR
//!   (or the peer speaks another version, below), and sets a connection up whenever the
//!   QP has none: at first, and whenever one is lost, whichever end lost it (the passive
//!   end, which never connects, closes its side, and the active end reads the close).
//! - A refused or failed connection is retried with backoff (100 µs doubling to 10 ms)
//!   while the QP lives; meanwhile WRs wait as for lost packets: the requester's ACK timer
//!   runs (in the progress engine), and `retry_cnt` expiries end in `IBV_WC_RETRY_EXC_ERR`.
//!   An attempt still under way (from RTR on, before the setup thread first runs the
//!   connector) does not count (for up to a second, see
//!   [`Qp::handle_connecting`](backend_sim_proto::qp::Qp::handle_connecting)): an
//!   HCA has nothing to set up, and a loaded machine must not turn the sim's hello into
//!   lost packets.
//! - A hello of another protocol version ([`wire::VERSION`](backend_sim_proto::wire::VERSION): another
//!   build of the sim) is refused as such (`HelloReject::Version`, and a warning on both
//!   sides); that refusal is final: the connecting QP stops trying, and its WRs end in
//!   `IBV_WC_RETRY_EXC_ERR` with `vendor_err` EPROTO.

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::net::TcpStream;
use verbs_api::{QpState, QpType, Result};

use crate::addressing::{canonical, Addressing};
use crate::datagram::Datagrams;
use crate::listener::{fd_limit_hint, is_out_of_fds};
use crate::progress::Progress;
use crate::qp::{Conn, QpInner, QpShared, QpTable};
use crate::same_host::Transport;
use crate::shm_ring::Rings;
use crate::stream::Stream;
use crate::verify::{self, send_frame};
use backend_sim_proto::rx::Reader;
use backend_sim_proto::wire::{Frame, HelloReject, TOKEN_LEN, VERSION};

/// Bound on connecting and on the hello exchange.
const SETUP_TIMEOUT: Duration = Duration::from_secs(5);

/// What connection setup needs of its device.
pub struct Setup {
    /// The device's name (for the log).
    pub name: String,
    /// The runtime of the setup tasks.
    pub rt: tokio::runtime::Handle,
    /// Where the device is reached.
    pub addr: Arc<Addressing>,
    /// The hellos its QPs are sending, which peers check with it.
    pub claims: Arc<verify::Claims>,
    /// Its QPs, by number.
    pub qps: Arc<QpTable>,
    /// Its data path, which takes over established connections.
    pub progress: Arc<Progress>,
    /// Its UD side, which takes over links to other devices.
    pub datagrams: Arc<Datagrams>,
    /// Its port: while it is down nothing is set up or accepted.
    pub port: Arc<crate::port::Port>,
    /// How its connections run.
    pub transport: Transport,
    /// Its table for same-host peers' one-sided fast path, if it has one.
    pub onesided: Option<Arc<crate::onesided::owner::Owner>>,
    /// Its counters (of connections set up, by path).
    pub counters: Arc<crate::counters::DeviceCounters>,
}

/// A device's listening at one address: its TCP listener's task and, when it published
/// one, its same-host socket's task and file. Dropping it closes both and unpublishes
/// the socket (the device's address moved: `port_addr`; or the device closed).
pub struct Listening {
    tasks: Vec<tokio::task::AbortHandle>,
    _published: Option<crate::same_host::Published>,
}

impl Drop for Listening {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Starts accepting connections for the device of `dev` at the address `listener` is
/// bound to: on the TCP listener, and, unless the device's transport is TCP only, on a
/// same-host socket published for that address (without one, same-host peers connect
/// over TCP).
pub fn spawn_listener(dev: &Arc<Setup>, listener: std::net::TcpListener) -> Result<Listening> {
    let bound = listener.local_addr().map_err(|source| verbs_api::Error::Os {
        call: "getsockname (sim device listener)",
        source,
    })?;
    let same_host = match dev.transport {
        Transport::Auto => crate::same_host::publish(bound)
            .inspect_err(|e| {
                tracing::debug!(
                    device = dev.name,
                    "no same-host socket (peers on this host connect over TCP): {e}"
                )
            })
            .ok(),
        Transport::Tcp => None,
    };
    let _guard = dev.rt.enter();
    let mut tasks = Vec::with_capacity(2);
    let (same_host, published) = same_host.unzip();
    let _guard = dev.rt.enter();
    if let Some(l) = same_host {
        let l = tokio::net::UnixListener::from_std(l).map_err(|source| verbs_api::Error::Os {
            call: "register same-host listener",
            source,
        })?;
        let weak = Arc::downgrade(dev);
        // A same-host connection arrived at this listener's address, which its connector
        // looked up and a UD link's check names (after a LID change or on an added GID,
        // not the address the device opened at).
        let local = bound;
        let task = dev
            .rt
            .spawn(crate::same_host::accept_loop(dev.name.clone(), l, move |s| {
                let dev = weak.clone();
                async move {
                    // Until the hello names the peer, the connection stands for no address.
                    let unspecified = SocketAddr::new(std::net::Ipv4Addr::UNSPECIFIED.into(), 0);
                    if let Err(e) = serve_inbound(dev, Stream::Unix(s, local, unspecified)).await {
                        tracing::debug!("inbound same-host connection ended: {e}");
                    }
                }
            }));
        tasks.push(task.abort_handle());
    }
    let listener = tokio::net::TcpListener::from_std(listener).map_err(|source| verbs_api::Error::Os {
        call: "register listener",
        source,
    })?;
    let weak = Arc::downgrade(dev);
    let task = dev.rt.spawn(crate::listener::accept_loop(
        dev.name.clone(),
        listener,
        move |stream, peer| {
            let dev = weak.clone();
            async move {
                let _ = crate::sockopt::tune(&stream);
                if let Err(e) = serve_inbound(dev, Stream::Tcp(stream)).await {
                    tracing::debug!(%peer, "inbound connection ended: {e}");
                }
            }
        },
    ));
    tasks.push(task.abort_handle());
    Ok(Listening {
        tasks,
        _published: published,
    })
}

/// Starts the task that connects `qp` (the active side of its pair) for `epoch`.
pub fn spawn_connector(dev: &Arc<Setup>, qp: Arc<QpShared>, epoch: u64) {
    dev.rt.spawn(connector_task(dev.clone(), qp, epoch));
}

/// For errors that mean the process ran out of file descriptors: what to do about it.
fn fd_hint(e: &io::Error) -> String {
    if is_out_of_fds(e) {
        format!(" ({})", fd_limit_hint())
    } else {
        String::new()
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

/// Counts a connection of QP `qpn` set up over `sock`, and logs which way it runs.
fn set_up(counters: &crate::counters::DeviceCounters, qpn: u32, sock: &crate::stream::DataSock) {
    let same_host = sock.is_same_host();
    counters.link_set_up(same_host);
    let via = if same_host {
        "a same-host unix socket"
    } else {
        "TCP"
    };
    tracing::debug!(qpn, peer = ?sock.peer_addr(), "connection set up over {via}");
}

/// Puts a just registered connection's frames on the rings set up for it, if any.
fn install_rings(counters: &crate::counters::DeviceCounters, conn: &Conn, rings: Option<Rings>) {
    if let Some(r) = rings {
        crate::progress::ring_wire::install(conn, r);
        counters.rings_set_up();
        tracing::debug!(qpn = conn.qp.qpn, "its frames go over shared-memory rings");
    }
}

// ---------------------------------------------------------------- responder side

/// A hello's claim: the active QP `(src_gid, src_lid, src_qpn)` wants the passive QP
/// `dst_qpn`, and `token` proves it with the claimed device.
struct Claim {
    src_gid: [u8; 16],
    src_lid: u16,
    qp_type: QpType,
    src_qpn: u32,
    dst_qpn: u32,
    token: [u8; TOKEN_LEN],
}

/// What a QP that may accept a hello must still have when the hello is accepted.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Expect {
    epoch: u64,
    remote: SocketAddr,
    self_loop: bool,
}

/// Whether `qp` may take `c` as its peer's hello, and if so what the check of the claim
/// needs; `Err` names why not (for the log only: the stranger is told nothing).
fn admissible(qp: &QpShared, g: &QpInner, c: &Claim) -> std::result::Result<Expect, &'static str> {
    if !crate::qp::receives_in(g.qp.state()) {
        return Err("the QP is not in RTR, RTS, SQD or SQE");
    }
    if c.qp_type != qp.qp_type {
        // An HCA drops packets of another transport's opcodes (rxe's
        // `check_type_state()`); the sim never connects the two.
        return Err("the QP is of another transport type (RC and UC do not talk)");
    }
    let ah = g.qp.attr().ah_attr;
    let named = crate::addressing::fabric_gid(&ah.grh.dgid.0);
    if g.qp.attr().dest_qp_num != c.src_qpn
        || qp.dev.addr.av_lid(&ah) != c.src_lid
        || (ah.is_global && named != c.src_gid)
    {
        return Err("the hello does not come from the QP's configured peer");
    }
    let self_loop =
        g.active && (c.src_gid, c.src_lid, c.src_qpn) == qp.dev.addr.local_id(qp.qpn, g.qp.attr());
    if g.active && !self_loop {
        // This side sets the connection up; a peer that thinks otherwise names the pair
        // differently (e.g. another GID).
        return Err("the QP is the active side of its pair");
    }
    let remote = g.remote.ok_or("the QP has no peer address")?;
    Ok(Expect {
        epoch: g.epoch,
        remote,
        self_loop,
    })
}

/// How long a hello for a QP in RESET or INIT waits for it to reach RTR before it is
/// looked at: the two ends of a pair reach RTR one after the other (rdma_cm's passive
/// side before its REP, the active side once it has the REP), and the side that gets
/// there first may be the one that connects. Waiting, the hello is accepted as soon as
/// the peer is ready instead of being refused and tried again (a refused attempt costs
/// both processes a connection, and the connector's backoff adds its pause); short
/// against the requester's [`LINK_SETUP_GRACE`](backend_sim_proto::requester::LINK_SETUP_GRACE),
/// so that a QP whose peer stays in INIT still sees its attempts fail, as packets to a
/// QP in INIT are dropped.
pub const NOT_READY_WAIT: Duration = Duration::from_millis(250);

/// Waits, for at most [`NOT_READY_WAIT`], while `qp` is in RESET or INIT (and not
/// destroyed); every state change and the destroy wake it ([`QpShared::ready`]).
async fn until_past_init(qp: &QpShared) {
    let deadline = tokio::time::Instant::now() + NOT_READY_WAIT;
    loop {
        let notified = qp.ready.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let waiting = matches!(qp.inner.lock().qp.state(), QpState::Reset | QpState::Init)
            && !qp.destroyed.load(std::sync::atomic::Ordering::Acquire);
        if !waiting || tokio::time::timeout_at(deadline, notified).await.is_err() {
            return;
        }
    }
}

/// The count of setups of the connection slot an accepted hello fills: `self_conn` for
/// a QP connected to itself, `conn` otherwise.
fn accepted_gen(g: &mut QpInner, self_loop: bool) -> &mut u64 {
    match self_loop {
        true => &mut g.self_conn_gen,
        false => &mut g.conn_gen,
    }
}

async fn serve_inbound(dev: Weak<Setup>, mut stream: Stream) -> io::Result<()> {
    let first = verify::read_first(&mut stream).await?;
    let claim = match first {
        Frame::Hello {
            src_gid,
            src_lid,
            qp_type,
            src_qpn,
            dst_qpn,
            token,
        } => Claim {
            src_gid,
            src_lid,
            qp_type,
            src_qpn,
            dst_qpn,
            token,
        },
        Frame::Verify {
            src_qpn,
            dst_qpn,
            token,
        } => {
            // A peer checks a hello that claims to come from one of our QPs.
            let yes = dev
                .upgrade()
                .is_some_and(|d| d.claims.confirms(src_qpn, dst_qpn, &token));
            let answer = if yes {
                Frame::HelloAck
            } else {
                Frame::HelloNak {
                    reason: HelloReject::Refused,
                }
            };
            return send_frame(&mut stream, &answer).await;
        }
        Frame::LinkHello {
            src_gid,
            src_lid,
            token,
        } => {
            let Some(dg) = dev.upgrade().map(|d| d.datagrams.clone()) else {
                return Ok(());
            };
            return crate::datagram::setup::serve(dg, stream, src_gid, src_lid, token).await;
        }
        Frame::LinkVerify {
            at_ip,
            at_port,
            token,
        } => {
            // A device checks a link that claims to come from this one.
            let at = canonical(SocketAddr::new(std::net::Ipv6Addr::from(at_ip).into(), at_port));
            let yes = dev.upgrade().is_some_and(|d| d.claims.confirms_link(at, &token));
            let answer = if yes {
                Frame::HelloAck
            } else {
                Frame::HelloNak {
                    reason: HelloReject::Refused,
                }
            };
            return send_frame(&mut stream, &answer).await;
        }
        other => return Err(proto(format!("expected hello, got {other}"))),
    };
    let Some(dev) = dev.upgrade() else {
        return Ok(());
    };
    let qp = dev.qps.lock().get(&claim.dst_qpn).and_then(Weak::upgrade);
    if let Some(qp) = &qp {
        until_past_init(qp).await;
    }
    let verdict = match &qp {
        _ if !dev.port.is_up() => Err("the port is down"),
        None => Err("no such QP"),
        Some(qp) => admissible(qp, &qp.inner.lock(), &claim),
    };
    let verdict = match verdict {
        Ok(expect) => {
            // The one check a stranger cannot pass: the device at the address the QP's
            // own address vector names confirms the token.
            let confirmed = if dev.addr.is_self(expect.remote) {
                dev.claims.confirms(claim.src_qpn, claim.dst_qpn, &claim.token)
            } else {
                verify::ask(
                    expect.remote,
                    dev.transport == Transport::Auto,
                    claim.src_qpn,
                    claim.dst_qpn,
                    claim.token,
                )
                    .await
                    .unwrap_or_else(|e| {
                        tracing::debug!(remote = %expect.remote, "cannot check a hello with its claimed device: {e}");
                        false
                    })
            };
            match confirmed {
                true => Ok(expect),
                false => Err("the device at the QP's peer address did not confirm the hello"),
            }
        }
        Err(why) => Err(why),
    };
    let progress = dev.progress.clone();
    let counters = dev.counters.clone();
    let advertised = dev.addr.advertise.ip();
    let port = dev.port.clone();
    let onesided = dev.onesided.clone();
    drop(dev);
    let (qp, expect) = match (qp, verdict) {
        (Some(qp), Ok(expect)) => (qp, expect),
        (_, Err(why)) => {
            tracing::debug!(
                dst_qpn = claim.dst_qpn,
                src_qpn = claim.src_qpn,
                "refused a hello: {why}"
            );
            send_frame(
                &mut stream,
                &Frame::HelloNak {
                    reason: HelloReject::Refused,
                },
            )
            .await?;
            return Err(proto(format!("refused hello for QP {:#x}: {why}", claim.dst_qpn)));
        }
        (None, Ok(_)) => unreachable!("only an existing QP is admissible"),
    };
    // The check took a round trip: the QP must still be what it was when it began.
    let gen = {
        let mut g = qp.inner.lock();
        if admissible(&qp, &g, &claim).ok() == Some(expect) && !qp.is_stale(&g, expect.epoch) {
            let gen = accepted_gen(&mut g, expect.self_loop);
            *gen += 1;
            Some(*gen)
        } else {
            None
        }
    };
    let Some(gen) = gen else {
        send_frame(
            &mut stream,
            &Frame::HelloNak {
                reason: HelloReject::Refused,
            },
        )
        .await?;
        return Err(proto("the QP changed while its hello was checked"));
    };
    send_frame(&mut stream, &Frame::HelloAck).await?;
    let (rings, link) = tokio::time::timeout(
        SETUP_TIMEOUT,
        crate::ring_setup::accept(&stream, onesided.as_ref()),
    )
    .await
    .map_err(|_| {
        io::Error::new(
            io::ErrorKind::TimedOut,
            "no ring segment after the hello's answer",
        )
    })??;
    if let Stream::Unix(_, local, peer) = &mut stream {
        // The peer is the device the QP's address vector names (its check said so); this
        // end, a wildcard listener's, is at the IP the device advertises.
        *peer = expect.remote;
        if local.ip().is_unspecified() {
            local.set_ip(advertised);
        }
    }
    let sock = stream.into_data()?;
    set_up(&counters, qp.qpn, &sock);
    let conn = progress.register(&qp, expect.epoch, sock, Reader::new())?;
    install_rings(&counters, &conn, rings);
    crate::faults::setup_pause(&qp).await;
    let old = {
        let mut g = qp.inner.lock();
        // The port checked with the hello may have gone down since: a port going down
        // closes the connections its QPs hold (under each QP's lock, after the port's
        // state changed), so one installed past that point must not be.
        if qp.is_stale(&g, expect.epoch) || *accepted_gen(&mut g, expect.self_loop) != gen || !port.is_up() {
            drop(g);
            progress.close(&conn);
            return Ok(());
        }
        if expect.self_loop {
            g.self_conn.replace(conn.clone())
        } else {
            // A newer connection supersedes the old one: what was in flight on it
            // is resent, half-received requests are forgotten. Only now, in the
            // same critical section that retires the old connection: rewound
            // earlier, the old connection (still current) would carry the resent
            // requests to a peer that has left it, and responses still buffered
            // on it would complete the resent WQEs out of order.
            tracing::debug!(qpn = qp.qpn, "connection from the peer accepted");
            qp.link_lost(&mut g);
            g.qp.handle_connection_up();
            let old = g.conn.replace(conn.clone());
            qp.offer_direct(&mut g, link);
            qp.note_link(&mut g);
            old
        }
    };
    if let Some(old) = old {
        progress.close(&old);
    }
    progress.activate(&conn);
    Ok(())
}

// ---------------------------------------------------------------- requester side

async fn connector_task(dev: Arc<Setup>, qp: Arc<QpShared>, epoch: u64) {
    let mut backoff = Duration::from_micros(100);
    loop {
        // Wait until the QP needs a connection it does not have.
        let remote = loop {
            let notified = qp.req_wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut g = qp.inner.lock();
                if qp.is_stale(&g, epoch) || g.qp.state() == QpState::Err {
                    return;
                }
                if g.conn.is_none() && crate::qp::receives_in(g.qp.state()) {
                    match g.remote {
                        Some(r) => {
                            g.qp.handle_connecting(Some(QpShared::now()));
                            break r;
                        }
                        None => return,
                    }
                }
            }
            notified.await;
        };
        let attempt = connect(&dev, &qp, remote).await;
        let gen = {
            let mut g = qp.inner.lock();
            if qp.is_stale(&g, epoch) {
                // The QP was reset (or destroyed) meanwhile: its requester, its count of
                // setups and its next connection are a newer connector's (a connection
                // just set up closes here, and its peer sees it go).
                return;
            }
            g.qp.handle_connecting(None);
            match &attempt {
                Ok(_) => {
                    g.conn_gen += 1;
                    g.conn_gen
                }
                Err(e) => {
                    // Like a lost packet (`Qp::handle_connection_failed`).
                    g.qp.handle_connection_failed(errno_of(e), QpShared::now());
                    dev.progress.rearm(&qp, &mut g);
                    0
                }
            }
        };
        match attempt {
            Ok((stream, (rings, link))) => {
                backoff = Duration::from_micros(100);
                let progress = dev.progress.clone();
                let conn = match stream.into_data().and_then(|s| {
                    set_up(&dev.counters, qp.qpn, &s);
                    let conn = progress.register(&qp, epoch, s, Reader::new())?;
                    install_rings(&dev.counters, &conn, rings);
                    Ok(conn)
                }) {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(
                            qpn = qp.qpn,
                            "cannot hand the connection to the progress engine: {e}"
                        );
                        continue;
                    }
                };
                crate::faults::setup_pause(&qp).await;
                {
                    let mut g = qp.inner.lock();
                    if qp.is_stale(&g, epoch) || g.qp.state() == QpState::Err {
                        drop(g);
                        progress.close(&conn);
                        return;
                    }
                    if g.conn_gen != gen || g.conn.is_some() || !dev.port.is_up() {
                        // Not this setup's to install (or the port went down during it,
                        // closing what its QPs held): the QP keeps its connector, which
                        // sets another up when the QP needs one and the port is up.
                        drop(g);
                        progress.close(&conn);
                        continue;
                    }
                    // What the requester started before this connection existed was
                    // lost on the way (`QpShared::send_unconnected`): resent on it.
                    g.qp.handle_connection_set_up();
                    g.conn = Some(conn.clone());
                    g.qp.handle_connection_up();
                    qp.offer_direct(&mut g, link);
                    qp.note_link(&mut g);
                }
                progress.activate(&conn);
            }
            Err(e) if e.kind() == io::ErrorKind::Unsupported => {
                // The peer will never accept: say so once, and let the WRs fail as for a
                // lost link (the ACK timer runs out; `vendor_err` EPROTO).
                tracing::warn!(qpn = qp.qpn, %remote, "cannot connect: {e}");
                return;
            }
            Err(e) => {
                match fd_hint(&e) {
                    hint if hint.is_empty() => {
                        tracing::debug!(qpn = qp.qpn, %remote, "connection attempt failed: {e}")
                    }
                    hint => tracing::warn!(qpn = qp.qpn, %remote, "cannot connect: {e}{hint}"),
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(10));
            }
        }
    }
}

async fn connect(
    dev: &Setup,
    qp: &QpShared,
    remote: SocketAddr,
) -> io::Result<(Stream, crate::ring_setup::SetUp)> {
    if !dev.port.is_up() {
        // As a packet sent through a port that is down: lost, and retried per
        // `retry_cnt` while the connector waits for the port (see `DeviceShared::set_port`).
        return Err(io::Error::from_raw_os_error(libc::ENETDOWN));
    }
    let same_host = match dev.transport {
        Transport::Auto => crate::same_host::connect(remote).await,
        Transport::Tcp => None,
    };
    let mut stream = match same_host {
        Some((s, _)) => Stream::Unix(s, dev.addr.advertise, remote),
        None => {
            let s = tokio::time::timeout(SETUP_TIMEOUT, TcpStream::connect(remote))
                .await
                .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))??;
            crate::sockopt::tune(&s)?;
            Stream::Tcp(s)
        }
    };
    let (src_gid, src_lid, _) = qp.dev.addr.local_id(qp.qpn, qp.inner.lock().qp.attr());
    let dst_qpn = qp.inner.lock().qp.attr().dest_qp_num;
    // Held until the answer: the peer checks the token with this device meanwhile.
    let claim = dev.claims.begin(qp.qpn, dst_qpn);
    let hello = Frame::Hello {
        src_gid,
        src_lid,
        qp_type: qp.qp_type,
        src_qpn: qp.qpn,
        dst_qpn,
        token: claim.token(),
    };
    send_frame(&mut stream, &hello).await?;
    // Exactly the answer's header: what the peer sends after it is the data path's.
    let answer = tokio::time::timeout(SETUP_TIMEOUT, verify::read_one(&mut stream))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no answer to hello"))??;
    drop(claim);
    match answer {
        Frame::HelloAck => {
            let set_up = tokio::time::timeout(SETUP_TIMEOUT, crate::ring_setup::offer(&stream, dev.onesided.as_ref()))
                .await
                .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no answer to the fast path's offer"))??;
            Ok((stream, set_up))
        }
        // Permanent: `Unsupported` tells the connector to stop trying.
        Frame::HelloNak {
            reason: HelloReject::Version,
        } => Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("the peer device speaks another sim protocol version (this build: {VERSION}); run the same build on both sides"),
        )),
        Frame::HelloNak { .. } => Err(io::Error::new(
            io::ErrorKind::ConnectionRefused,
            format!("the peer device refused QP {dst_qpn:#x} (no such QP, not ready, or not connected to this one)"),
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
