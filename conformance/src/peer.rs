//! Cases with two halves on two hosts: the peer mode of the runner.
//!
//! Most cases build both QPs on one device. The `remote` group checks what crosses a
//! network: each of its cases has a *client* half, which the runner runs as usual and
//! reports, and a *server* half, which runs where [`Config::peer`] points, in another
//! runner started with `--serve ADDR` (on another host or in another network namespace),
//! or, without a peer, in a thread of this process on a second context of the same device.
//! The halves meet through [`verbs_api::cm`]: the client names its case in the private
//! data, both QPs come up in RTS, and the cm side channel carries their few messages
//! ([`Link`]): "ready", "check", and the server's verdict.
//!
//! ```text
//! host A$ conformance --backend sim --serve 0.0.0.0:18600
//! host B$ conformance --backend sim --peer 10.0.0.1:18600 --filter remote
//! ```

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use verbs_api::cm::{self, CmListener, Offer};
use verbs_api::{
    modify_to_init, AccessFlags, Backend, Context, MemoryRegion, ProtectionDomain, QpCap, QpInitAttr,
    RcParams, RemoteMr,
};

use crate::{Config, Env, Failure};

/// Bytes of the region the server offers.
pub const SERVER_MR: usize = 64 * 1024;

/// The cm side channel of a case: one line per message.
pub struct Link {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    timeout: Duration,
}

impl Link {
    fn new(stream: TcpStream, timeout: Duration) -> Result<Link, Failure> {
        let writer = stream
            .try_clone()
            .map_err(|e| Failure(format!("side channel: {e}")))?;
        Ok(Link {
            reader: BufReader::new(stream),
            writer,
            timeout,
        })
    }

    /// Sends one message.
    pub fn say(&mut self, msg: &str) -> Result<(), Failure> {
        debug_assert!(!msg.contains('\n'));
        writeln!(self.writer, "{msg}").map_err(|e| Failure(format!("side channel: cannot send {msg:?}: {e}")))
    }

    /// Waits (bounded) for the next message.
    pub fn hear(&mut self) -> Result<String, Failure> {
        let _ = self.reader.get_ref().set_read_timeout(Some(self.timeout));
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) => Err(Failure("side channel: the peer hung up".into())),
            Ok(_) => Ok(line.trim_end().to_string()),
            Err(e) => Err(Failure(format!(
                "side channel: no message within {:?}: {e}",
                self.timeout
            ))),
        }
    }

    /// Waits for exactly `want`.
    pub fn expect(&mut self, want: &str) -> Result<(), Failure> {
        match self.hear()? {
            got if got == want => Ok(()),
            got => Err(Failure(format!("side channel: expected {want:?}, got {got:?}"))),
        }
    }
}

/// What the server half of a case gets: its own device context, a QP in RTS connected to
/// the client's, its CQ and the region it offered (all access rights).
pub struct ServerSide<'a, B: Backend> {
    /// The server's context.
    pub ctx: &'a B::Context,
    /// The server's QP (RTS).
    pub qp: &'a B::Qp,
    /// Its CQ (send and receive).
    pub cq: &'a B::Cq,
    /// The region offered to the client, [`SERVER_MR`] bytes, zeroed.
    pub mr: &'a B::Mr,
    /// The client's endpoint as it sent it.
    pub peer: verbs_api::Endpoint,
    /// The side channel.
    pub link: Link,
    /// Bound on every wait.
    pub timeout: Duration,
}

/// A server half: checks its side and returns why not.
pub type ServerHalf<B> = fn(&mut ServerSide<B>) -> Result<(), Failure>;

/// The server halves by case id (see `cases::remote`).
pub type Halves<B> = fn(&str) -> Option<ServerHalf<B>>;

/// The QP capacities both halves use.
pub fn cap() -> QpCap {
    QpCap {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    }
}

/// The connection attributes of a run (its GID index, a short RNR timer).
pub fn params(cfg: &Config) -> RcParams {
    RcParams {
        gid_index: cfg.gid_index,
        min_rnr_timer: 1,
        ..RcParams::default()
    }
}

/// Serves one client of `listener`: sets up a QP, runs the server half of the case the
/// client names, and tells it the verdict.
pub fn serve_one<B: Backend>(
    backend: &B,
    cfg: &Config,
    listener: &CmListener,
    halves: Halves<B>,
) -> Result<String, Failure> {
    let ctx = backend.open(&cfg.device)?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(256, None)?;
    let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq, cap()))?;
    let mr = pd.reg_mr(SERVER_MR, AccessFlags::ALL)?;
    let p = RcParams {
        access: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC,
        ..params(cfg)
    };
    modify_to_init(&qp, &p)?;
    let offer = Offer::new().mr(mr.remote()).timeout(cfg.timeout);
    let peer = listener.accept(&ctx, &qp, &p, &offer)?;
    let id = String::from_utf8_lossy(&peer.private_data).to_string();
    let mut side = ServerSide::<B> {
        ctx: &ctx,
        qp: &qp,
        cq: &cq,
        mr: &mr,
        peer: peer.endpoint,
        link: Link::new(peer.stream, cfg.timeout)?,
        timeout: cfg.timeout,
    };
    let verdict = match halves(&id) {
        Some(half) => half(&mut side),
        None => Err(Failure(format!(
            "this server has no case {id:?} (another build?)"
        ))),
    };
    let line = match &verdict {
        Ok(()) => "ok".to_string(),
        Err(f) => format!("fail {}", f.0.replace('\n', " ")),
    };
    side.link.say(&line)?;
    // Wait for the client to hang up, so that our QP outlives its last operation.
    let _ = side.link.hear();
    Ok(format!("{id}: {line}"))
}

/// Runs server halves for every client of `addr` until `cases` were served (forever with
/// `None`), printing one line per case.
pub fn serve<B: Backend>(
    backend: &B,
    cfg: &Config,
    addr: &str,
    cases: Option<usize>,
    halves: Halves<B>,
) -> Result<(), Failure> {
    let listener = CmListener::bind(addr)?;
    eprintln!("serving remote cases on {}", listener.local_addr()?);
    let mut served = 0;
    while cases.is_none_or(|n| served < n) {
        match serve_one(backend, cfg, &listener, halves) {
            Ok(line) => println!("{line}"),
            Err(f) => println!("error: {f}"),
        }
        served += 1;
    }
    Ok(())
}

/// The client's end of a case: its QP connected to the server's, the server's region,
/// and the side channel.
pub struct ClientSide {
    /// The server's region ([`SERVER_MR`] bytes, all rights).
    pub mr: RemoteMr,
    /// The server's endpoint as it sent it.
    pub peer: verbs_api::Endpoint,
    /// The side channel.
    pub link: Link,
}

impl ClientSide {
    /// Waits for the server's verdict.
    pub fn verdict(&mut self) -> Result<(), Failure> {
        let v = self.link.hear()?;
        match v.strip_prefix("fail ") {
            None if v == "ok" => Ok(()),
            Some(why) => Err(Failure(format!("the peer's half failed: {why}"))),
            None => Err(Failure(format!("side channel: expected a verdict, got {v:?}"))),
        }
    }
}

/// Connects `qp` (on `ctx`) to a server half of case `id`: at `cfg.peer`, or in a
/// thread of this process on a second context of the device; then runs `client` and
/// waits for the server's verdict.
pub fn run_client<B: Backend, T>(
    env: &Env<B>,
    qp: &B::Qp,
    p: &RcParams,
    id: &str,
    halves: Halves<B>,
    client: impl FnOnce(&mut ClientSide) -> Result<T, Failure>,
) -> Result<T, Failure> {
    let (backend, cfg, ctx) = (env.backend, env.cfg, &env.ctx);
    let connect = |addr: &str| -> Result<(T, ClientSide), Failure> {
        let offer = Offer::new().private_data(id.as_bytes()).timeout(cfg.timeout);
        let peer = connect_retrying(addr, ctx, qp, p, &offer, cfg.timeout)?;
        let mut side = ClientSide {
            mr: *peer
                .mrs
                .first()
                .ok_or_else(|| Failure("the peer offered no region".into()))?,
            peer: peer.endpoint,
            link: Link::new(peer.stream, cfg.timeout)?,
        };
        let out = client(&mut side)?;
        Ok((out, side))
    };
    let finish = |(out, mut side): (T, ClientSide)| -> Result<T, Failure> {
        side.verdict()?;
        let _ = side.link.say("bye");
        Ok(out)
    };
    match cfg.peer {
        Some(addr) => finish(connect(&addr.to_string())?),
        None => {
            // The server half runs on a thread of its own, which a backend on a virtual
            // clock cannot take part in: say so at once rather than wait out the client's
            // timeout.
            if backend.clock_is_virtual() {
                return Err(Failure(format!(
                    "the server half runs on another thread over a TCP side channel, which the \
                     {} backend refuses: its clock is virtual, moved by one thread's verbs \
                     (one thread, no sockets)",
                    backend.name()
                )));
            }
            let listener = CmListener::bind("127.0.0.1:0")?;
            let addr = listener.local_addr()?.to_string();
            std::thread::scope(|s| {
                let server = s.spawn(|| serve_one(backend, cfg, &listener, halves));
                let r = connect(&addr).and_then(finish);
                let served = server
                    .join()
                    .map_err(|_| Failure("the server half panicked".into()))?;
                match (r, served) {
                    (Ok(out), Ok(_)) => Ok(out),
                    (Err(e), _) => Err(e),
                    (Ok(_), Err(e)) => Err(Failure(format!("server half: {e}"))),
                }
            })
        }
    }
}

/// `cm::connect`, retried while the peer runner is between two clients (its listener
/// refuses nobody, but its accept may not have started yet).
fn connect_retrying<C: Context, Q: verbs_api::QueuePair>(
    addr: &str,
    ctx: &C,
    qp: &Q,
    p: &RcParams,
    offer: &Offer,
    timeout: Duration,
) -> Result<cm::Peer, Failure> {
    let deadline = Instant::now() + timeout;
    loop {
        match cm::connect(addr, ctx, qp, p, offer) {
            Ok(peer) => return Ok(peer),
            Err(e) if Instant::now() < deadline && matches!(e, verbs_api::Error::Os { .. }) => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => return Err(Failure(format!("cannot connect to the peer at {addr}: {e}"))),
        }
    }
}

/// Parses `--peer`.
pub fn parse_peer(s: &str) -> Result<SocketAddr, String> {
    use std::net::ToSocketAddrs;
    s.to_socket_addrs()
        .map_err(|e| format!("{s}: {e}"))?
        .next()
        .ok_or_else(|| format!("{s}: no address"))
}
