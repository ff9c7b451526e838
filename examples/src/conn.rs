//! Connected RC queue pairs on top of `verbs_api::cm`: create a CQ and a QP with the
//! capacities an example needs, and accept or connect with clear error messages. What the
//! peers say to each other afterwards goes over the TCP side channel `cm` leaves open
//! ([`side_channel`](crate::side_channel)).
//!
//! A server accepts its clients through an [`Acceptor`]: a client that sends garbage or
//! nothing is dropped with a warning naming its address, and the others go on. A server
//! that must have receives in place before its peer can send moves the QP to INIT
//! ([`verbs_api::modify_to_init`]) and posts them in the `prepare` step of
//! [`Acceptor::accept`].

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use verbs_api::cm::{self, CmListener, ConnectRequest, Offer, Peer};
use verbs_api::{
    Backend, Context, ProtectionDomain, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QpType, QueuePair,
    RcParams,
};

use anyhow::Context as _;

use crate::Res;

/// Queue sizes of a QP.
#[derive(Clone, Copy, Debug)]
pub struct QpOpts {
    /// Outstanding send WRs.
    pub send_wr: u32,
    /// Outstanding receive WRs.
    pub recv_wr: u32,
    /// Inline bytes asked for (granted up to the device's limit; see [`RcQp::cap`]).
    pub inline: u32,
}

impl QpOpts {
    /// `send_wr` sends and `recv_wr` receives, no inline data.
    pub fn new(send_wr: u32, recv_wr: u32) -> Self {
        QpOpts {
            send_wr: send_wr.max(1),
            recv_wr: recv_wr.max(1),
            inline: 0,
        }
    }

    /// Asks for `bytes` of inline data.
    pub fn inline(mut self, bytes: u32) -> Self {
        self.inline = bytes;
        self
    }

    /// CQ entries enough for every WR of one such QP.
    pub fn cqe(&self) -> u32 {
        self.send_wr + self.recv_wr
    }
}

/// A QP (RC, or a UC or UD one from [`create_qp_of`]) and the CQ it reports to (send and
/// receive completions on the same CQ).
pub struct RcQp<B: Backend> {
    /// The CQ.
    pub cq: B::Cq,
    /// The QP (in RESET until connected).
    pub qp: B::Qp,
    /// The capacities granted.
    pub cap: QpCap,
}

/// Creates a QP on `cq` (for both queues) with the sizes of `opts`; the inline size is
/// capped at what the device offers.
pub fn create_qp_on<B: Backend>(
    ctx: &B::Context,
    pd: &B::Pd,
    cq: &B::Cq,
    opts: &QpOpts,
) -> Res<(B::Qp, QpCap)> {
    create_qp_with::<B>(ctx, pd, cq, cq, opts)
}

/// Creates a QP whose send completions go to `send_cq` and receive completions to
/// `recv_cq`, otherwise as [`create_qp_on`].
pub fn create_qp_with<B: Backend>(
    ctx: &B::Context,
    pd: &B::Pd,
    send_cq: &B::Cq,
    recv_cq: &B::Cq,
    opts: &QpOpts,
) -> Res<(B::Qp, QpCap)> {
    create_qp_of::<B>(ctx, pd, (send_cq, recv_cq), opts, QpType::Rc, None)
}

/// Creates a QP of `qp_type` (RC, UC or UD) on `(send_cq, recv_cq)`, taking its receives
/// from `srq` if given, otherwise as [`create_qp_on`]. A UC or UD QP is brought up
/// through [`Typed`](crate::transport::Typed).
pub fn create_qp_of<B: Backend>(
    ctx: &B::Context,
    pd: &B::Pd,
    (send_cq, recv_cq): (&B::Cq, &B::Cq),
    opts: &QpOpts,
    qp_type: QpType,
    srq: Option<&B::Srq>,
) -> Res<(B::Qp, QpCap)> {
    let caps = ctx.capabilities().context("querying the device's capabilities")?;
    let lacks = match qp_type {
        QpType::Rc => None,
        QpType::Uc => (!caps.uc).then_some("UC QPs"),
        QpType::Ud => (!caps.ud).then_some("UD QPs"),
    };
    if let Some(what) = lacks.or((srq.is_some() && !caps.srq).then_some("shared receive queues")) {
        anyhow::bail!("device {} has no {what} (its capabilities say so)", ctx.name());
    }
    let cap = QpCap {
        max_send_wr: opts.send_wr.min(caps.max_qp_wr.max(1)),
        max_recv_wr: opts.recv_wr.min(caps.max_qp_wr.max(1)),
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: opts.inline.min(caps.max_inline_data),
    };
    let mut init = QpInitAttr::new(qp_type, send_cq, recv_cq, cap);
    if let Some(srq) = srq {
        init = init.with_srq(srq);
    }
    let qp = pd.create_qp(&init).with_context(|| {
        format!(
            "creating a{} {} QP ({cap:?})",
            if qp_type == QpType::Rc { "n" } else { "" },
            crate::transport::type_name(qp_type),
        )
    })?;
    let granted = qp.query().context("querying the new QP")?.cap;
    Ok((qp, granted))
}

/// Creates a CQ big enough for the QP and the QP on it.
pub fn create_rc<B: Backend>(ctx: &B::Context, pd: &B::Pd, opts: &QpOpts) -> Res<RcQp<B>> {
    let cq = ctx
        .create_cq(opts.cqe(), None)
        .with_context(|| format!("creating a CQ of {} entries", opts.cqe()))?;
    let (qp, cap) = create_qp_on::<B>(ctx, pd, &cq, opts)?;
    Ok(RcQp { cq, qp, cap })
}

/// A server's clients, accepted so that no client can stop the server or hold up the
/// others: one thread reads the connection requests of every client connecting at once
/// ([`CmListener::request`]), each within `setup` (at most [`cm::REQUEST_TIMEOUT`]), with
/// the connections in setup bounded ([`cm::SETUP_BOUND`]) and descriptors kept in reserve
/// for the clients being served, so that a flood of connections that say nothing holds
/// neither threads nor descriptors. A client that sends something else, hangs up or says
/// nothing in time is dropped with a warning that names its address and what was wrong;
/// the others go on. At most [`QUEUED`] requests wait for [`Acceptor::accept`] (more are
/// dropped). Dropping the `Acceptor` stops it.
pub struct Acceptor {
    requests: Receiver<ConnectRequest>,
    stop: Arc<AtomicBool>,
    addr: SocketAddr,
    setup: Duration,
}

impl Acceptor {
    /// Starts accepting on `listener`.
    pub fn start(listener: CmListener, setup: Duration) -> Res<Acceptor> {
        let addr = listener.local_addr()?;
        let listener = listener.with_request_timeout(setup.min(cm::REQUEST_TIMEOUT));
        let (tx, requests) = sync_channel(QUEUED);
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        std::thread::Builder::new()
            .name("acceptor".into())
            .spawn(move || accept_loop(&listener, &tx, &stopped))
            .context("starting the thread that accepts clients")?;
        Ok(Acceptor {
            requests,
            stop,
            addr,
            setup,
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Accepts the next client whose connection request arrives within `timeout` with
    /// `qp`, and brings `qp` to RTS towards it (the rest of the exchange bounded by
    /// `setup` again). `prepare` readies `qp`, which is in RESET, for each attempt (e.g.
    /// INIT and receives posted; doing nothing leaves INIT to `cm`). A client that fails
    /// the rest of the exchange is dropped with a warning, `qp` goes back to RESET and
    /// the next client gets it.
    pub fn accept<C: Context, Q: QueuePair>(
        &self,
        ctx: &C,
        qp: &Q,
        mut prepare: impl FnMut(&Q) -> Res<()>,
        params: &RcParams,
        offer: Offer,
        timeout: Duration,
    ) -> Res<Peer> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let request = match self.requests.recv_timeout(left) {
                Ok(r) => r,
                Err(RecvTimeoutError::Timeout) => {
                    anyhow::bail!("no client connected to {} within {timeout:?}", self.addr)
                }
                Err(RecvTimeoutError::Disconnected) => {
                    anyhow::bail!("the thread accepting clients on {} stopped", self.addr)
                }
            };
            let from = request.peer_addr();
            prepare(qp).context("preparing the QP for a client")?;
            match request.accept(ctx, qp, params, &offer.clone().timeout(self.setup)) {
                Ok(peer) => return Ok(peer),
                Err(e) => {
                    tracing::warn!("dropped the client at {from}: {e}");
                    qp.modify(
                        &QpAttr {
                            qp_state: QpState::Reset,
                            ..QpAttr::default()
                        },
                        QpAttrMask::STATE,
                    )
                    .context("resetting the QP for the next client")?;
                }
            }
        }
    }
}

impl Drop for Acceptor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Connection requests that may wait for [`Acceptor::accept`].
pub const QUEUED: usize = 16;

fn accept_loop(listener: &CmListener, tx: &SyncSender<ConnectRequest>, stop: &AtomicBool) {
    let addr = listener.local_addr().ok();
    while !stop.load(Ordering::Relaxed) {
        match listener.request(Duration::from_millis(100)) {
            Ok(request) => {
                let from = request.peer_addr();
                match tx.try_send(request) {
                    Ok(()) => {}
                    Err(TrySendError::Full(_)) => {
                        tracing::warn!("dropped the client at {from}: {QUEUED} clients wait to be served")
                    }
                    // The server has all its clients: the request is dropped, which
                    // closes its connection.
                    Err(TrySendError::Disconnected(_)) => {}
                }
            }
            // No request yet; or out of descriptors, which the listener has warned about
            // once and waits out.
            Err(verbs_api::Error::Timeout { .. } | verbs_api::Error::OutOfFiles { .. }) => {}
            Err(e) => {
                let on = addr.map_or_else(String::new, |a| format!(" on {a}"));
                tracing::warn!("accepting clients{on}: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// Connects `qp` to the server at `addr`.
pub fn connect<C: Context, Q: QueuePair>(
    addr: impl ToSocketAddrs + std::fmt::Display,
    ctx: &C,
    qp: &Q,
    params: &RcParams,
    offer: Offer,
    timeout: Duration,
) -> Res<Peer> {
    cm::connect(&addr, ctx, qp, params, &offer.timeout(timeout)).with_context(|| {
        format!("connecting to the server at {addr} (is it running, and with the same --backend?)")
    })
}

/// Binds the connection listener, with a helpful message when the port is taken.
pub fn listen(addr: &str) -> Res<CmListener> {
    CmListener::bind(addr).with_context(|| {
        format!("listening on {addr} (another server running? use --listen 127.0.0.1:0 for a free port)")
    })
}

/// Parses `host:port`, `:port` or `port` (host defaults to 127.0.0.1).
pub fn parse_addr(s: &str) -> Res<SocketAddr> {
    let full = if s.parse::<u16>().is_ok() {
        format!("127.0.0.1:{s}")
    } else if let Some(p) = s.strip_prefix(':') {
        format!("127.0.0.1:{p}")
    } else {
        s.to_string()
    };
    full.to_socket_addrs()
        .with_context(|| format!("resolving {s:?}"))?
        .next()
        .ok_or_else(|| anyhow::anyhow!("{s:?} resolves to no address"))
}
