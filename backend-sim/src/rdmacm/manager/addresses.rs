//! Addresses and ports (`rdma_bind_addr`, `rdma_resolve_addr`, `rdma_resolve_route`,
//! `rdma_listen`, the lookups at a destination's rendezvous) and multicast groups
//! (`rdma_join_multicast_ex`, `rdma_leave_multicast`).

use super::*;

impl Core {
    // ------------------------------------------------------------------ multicast

    /// `rdma_join_multicast_ex` (the kernel's `rdma_join_multicast()`): a UD id bound
    /// to an address or resolved joins the group of multicast IP `addr`; the
    /// `MULTICAST_JOIN` event follows at once ([`crate::rdmacm::mcast::join_param`]).
    pub fn join_multicast(
        &self,
        handle: u32,
        addr: SocketAddr,
        context: u64,
        _send_only: bool,
    ) -> Result<()> {
        const CALL: &str = "rdma_join_multicast";
        self.with(CALL, handle, |_, st, _| {
            let id = st.ids.get_mut(&handle).expect("checked");
            id.need(CALL, &[State::AddrBound, State::AddrResolved])?;
            if id.qp_type != QpType::Ud {
                return Err(cm_err(CALL, libc::EINVAL, "only UD ids join multicast groups"));
            }
            let addr = canon(addr);
            if !addr.ip().is_multicast() {
                return Err(cm_err(
                    CALL,
                    libc::EINVAL,
                    format!("{} is not a multicast address", addr.ip()),
                ));
            }
            let dev = id.dev(CALL)?.shared().clone();
            let param = crate::rdmacm::mcast::join_param(addr, id.ps, dev.limits.link_layer, id.opts.tos);
            dev.datagrams.prepare_group(&param.ah_attr.grh.dgid);
            id.joins.push(Join { addr, context });
            if !id.unclaimed {
                id.channel.push(Queued {
                    handle,
                    context: id.context,
                    listen: None,
                    event: CmEventType::MulticastJoin,
                    status: 0,
                    param: CmEventParam::Ud(param),
                    mcast: Some(context),
                });
            }
            Ok(())
        })
    }

    /// `rdma_leave_multicast`: the id's first join that `which` picks ends, and its
    /// events not taken yet go (the kernel's `ucma_leave_multicast()`). Returns the
    /// group's address, `None` if no join matches.
    pub fn leave_multicast(&self, handle: u32, which: impl Fn(&Join) -> bool) -> Result<Option<SocketAddr>> {
        const CALL: &str = "rdma_leave_multicast";
        self.with(CALL, handle, |_, st, _| {
            let id = st.ids.get_mut(&handle).expect("checked");
            let Some(i) = id.joins.iter().position(&which) else {
                return Ok(None);
            };
            let j = id.joins.remove(i);
            id.channel
                .take_for(|e| e.handle == handle && e.mcast == Some(j.context));
            Ok(Some(j.addr))
        })
    }

    // ------------------------------------------------------------------ addresses

    /// Holds port `port` (0: a free one) of `ps` at `ip` for id `handle`.
    fn hold_port(st: &mut Ids, call: &'static str, handle: u32, ip: IpAddr, port: u16) -> Result<u16> {
        let (ps, reuse) = {
            let id = &st.ids[&handle];
            (id.ps, id.opts.reuseaddr)
        };
        let port = if port == 0 {
            loop {
                let p = st.choices.in_range(Choice::CmPort, EPHEMERAL);
                if !st.ports.contains_key(&(ps, p)) {
                    break p;
                }
            }
        } else {
            if port < 1024 && rustix::process::geteuid().as_raw() != 0 {
                return Err(cm_err(call, libc::EACCES, format!("port {port} is privileged")));
            }
            let clash = st.ports.get(&(ps, port)).into_iter().flatten().any(|h| {
                let o = &st.ids[h];
                let oip = o.src.map(|s| s.ip());
                let overlap = oip.is_none_or(|o| o.is_unspecified() || ip.is_unspecified() || o == ip);
                overlap && !(reuse && o.opts.reuseaddr && o.state != State::Listen)
            });
            if clash {
                return Err(cm_err(call, libc::EADDRINUSE, format!("port {port} is taken")));
            }
            port
        };
        st.ports.entry((ps, port)).or_default().push(handle);
        let id = st.ids.get_mut(&handle).expect("checked");
        id.holds_port = true;
        Ok(port)
    }

    /// `rdma_bind_addr`.
    pub fn bind(&self, handle: u32, addr: SocketAddr) -> Result<()> {
        const CALL: &str = "rdma_bind_addr";
        let addr = canon(addr);
        self.with(CALL, handle, |core, st, _| {
            st.ids[&handle].need(CALL, &[State::Idle])?;
            let dev = match addr.ip().is_unspecified() {
                true => None,
                false => Some(core.device_for(st, CALL, addr.ip())?),
            };
            // A port-0 bind takes a TCP port the id may listen on later.
            let (port, reserved) = if addr.port() == 0 {
                let s = bind_ephemeral(&st.choices, addr).map_err(|e| Error::from_io(CALL, e))?;
                let p = s
                    .local_addr()
                    .ok()
                    .and_then(|a| a.as_socket())
                    .map_or(0, |a| a.port());
                (p, Some(s))
            } else {
                (addr.port(), None)
            };
            let port = Core::hold_port(st, CALL, handle, addr.ip(), port)?;
            let id = st.ids.get_mut(&handle).expect("checked");
            id.dev = dev;
            id.src = Some(SocketAddr::new(addr.ip(), port));
            id.reserved = reserved;
            id.state = State::AddrBound;
            Ok(())
        })
    }

    /// `rdma_resolve_addr`.
    pub fn resolve_addr(
        &self,
        handle: u32,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<()> {
        const CALL: &str = "rdma_resolve_addr";
        let mut dst = canon(dst);
        if dst.ip().is_unspecified() {
            // The kernel resolves a wildcard destination to this host.
            dst.set_ip(match dst.ip() {
                IpAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                IpAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        self.with(CALL, handle, |core, st, out| {
            let id = &st.ids[&handle];
            id.need(CALL, &[State::Idle, State::AddrBound])?;
            let bound_ip = id.src.map(|s| s.ip()).filter(|ip| !ip.is_unspecified());
            let src_ip = match (bound_ip, src.map(canon).filter(|s| !s.ip().is_unspecified())) {
                (Some(ip), _) => ip,
                (None, Some(s)) => s.ip(),
                (None, None) => route::source_for(dst.ip()).map_err(|e| Error::from_io(CALL, e))?,
            };
            let dev = match &id.dev {
                Some(d) => d.clone(),
                None => core.device_for(st, CALL, src_ip)?,
            };
            if st.ids[&handle].state == State::Idle {
                let want = src.map_or(0, |s| s.port());
                let port = Core::hold_port(st, CALL, handle, src_ip, want)?;
                st.ids.get_mut(&handle).expect("checked").src = Some(SocketAddr::new(src_ip, port));
            }
            let id = st.ids.get_mut(&handle).expect("checked");
            let port = id.src.map_or(0, |s| s.port());
            id.src = Some(SocketAddr::new(src_ip, port));
            id.dev = Some(dev.clone());
            id.dst = Some(dst);
            id.gen += 1;
            if dst.ip().is_multicast() {
                // A group's address needs no neighbour: the kernel maps it (ARP's
                // multicast mapping) at once.
                id.peer = None;
                id.state = State::AddrResolved;
                id.event(CmEventType::AddrResolved, 0, CmEventParam::None);
                return Ok(());
            }
            id.state = State::AddrQuery;
            out.lookups.push(Lookup {
                dev: dev.shared().clone(),
                handle,
                gen: id.gen,
                dst,
                ps: id.ps as u16,
                timeout,
                connect: false,
            });
            Ok(())
        })
    }

    /// A lookup ended: for an address query, the address resolved (or not); for a
    /// connect, the request goes (or the connect fails as rdma_cm's would).
    pub(super) fn on_lookup(&self, handle: u32, gen: u64, found: Found, connect: bool) {
        let mut out = Outbox::default();
        {
            let mut st = self.st.lock();
            let Some(id) = st.ids.get_mut(&handle) else {
                return;
            };
            if id.gen != gen {
                return;
            }
            if connect {
                crate::rdmacm::cm::after_lookup(&mut st, handle, found, &mut out);
            } else if id.state == State::AddrQuery {
                match found {
                    Found::Unreachable(errno) => {
                        id.state = State::AddrBound;
                        id.event(CmEventType::AddrError, -errno, CmEventParam::None);
                    }
                    Found::Device(p) => {
                        id.peer = Some(p);
                        id.state = State::AddrResolved;
                        id.event(CmEventType::AddrResolved, 0, CmEventParam::None);
                    }
                    Found::NoListener => {
                        id.peer = None;
                        id.state = State::AddrResolved;
                        id.event(CmEventType::AddrResolved, 0, CmEventParam::None);
                    }
                }
            }
        }
        self.run(out);
    }

    /// `rdma_resolve_route`: the path to the device the address resolved to.
    pub fn resolve_route(&self, handle: u32) -> Result<()> {
        const CALL: &str = "rdma_resolve_route";
        self.with(CALL, handle, |_, st, _| {
            let id = st.ids.get_mut(&handle).expect("checked");
            id.need(CALL, &[State::AddrResolved])?;
            let dev = id.dev(CALL)?.clone();
            let dst = id.dst.expect("a resolved id has a destination");
            id.path = Some(route::path(dev.shared(), id.peer.as_ref(), dst.ip(), id.opts.tos));
            id.state = State::RouteResolved;
            id.event(CmEventType::RouteResolved, 0, CmEventParam::None);
            Ok(())
        })
    }

    /// `rdma_listen`: takes requests for the id's address and port, which a client finds
    /// through the rendezvous port opened here.
    pub fn listen(&self, handle: u32, backlog: u32) -> Result<()> {
        const CALL: &str = "rdma_listen";
        let backlog = if backlog > 0 && backlog < MAX_BACKLOG {
            backlog
        } else {
            MAX_BACKLOG
        };
        if self
            .st
            .lock()
            .ids
            .get(&handle)
            .is_some_and(|i| i.state == State::Idle)
        {
            self.bind(handle, SocketAddr::new(std::net::Ipv4Addr::UNSPECIFIED.into(), 0))?;
        }
        self.with(CALL, handle, |core, st, _| {
            let id = &st.ids[&handle];
            id.need(CALL, &[State::AddrBound])?;
            let src = id.src.expect("a bound id has an address");
            let dev = match &id.dev {
                Some(d) => d.clone(),
                None => core.device(st, 0)?,
            };
            let id = st.ids.get_mut(&handle).expect("checked");
            let reserved = id.reserved.take();
            let at = match st.rendezvous.get_mut(&src) {
                Some((r, users)) => {
                    *users += 1;
                    r.addr
                }
                None => {
                    let sock = match reserved {
                        Some(s) => s,
                        None => rendezvous::bind(src).map_err(|e| match e.kind() {
                            std::io::ErrorKind::AddrInUse => {
                                cm_err(CALL, libc::EADDRINUSE, format!("{src} is taken"))
                            }
                            _ => Error::from_io(CALL, e),
                        })?,
                    };
                    let r = rendezvous::open(sock, &dev.shared().setup.rt, core.me.clone())
                        .map_err(|e| Error::from_io(CALL, e))?;
                    st.rendezvous.insert(src, (r, 1));
                    src
                }
            };
            let id = st.ids.get_mut(&handle).expect("checked");
            id.listen = Some(Listen {
                backlog,
                queued: 0,
                rendezvous: at,
                dev,
            });
            id.state = State::Listen;
            tracing::debug!(handle, %src, ps = ?id.ps, "rdma_cm: listening");
            Ok(())
        })
    }

    /// The rendezvous: the device that takes requests for `(ps, port)` at `at` (the
    /// address a client reached), if an id listens there.
    pub fn lookup(&self, at: SocketAddr, ps: u16, port: u16) -> Option<Peer> {
        let at = canon(at);
        let mut st = self.st.lock();
        let (bound, held) = st
            .ids
            .values()
            .find(|i| {
                i.state == State::Listen
                    && i.ps as u16 == ps
                    && i.src
                        .is_some_and(|s| s.port() == port && (s.ip().is_unspecified() || s.ip() == at.ip()))
            })
            .map(|i| (i.dev.clone(), i.listen.as_ref().map(|l| l.dev.clone())))?;
        // A wildcard listener's device for this address: an open one that has it, else
        // the one it holds.
        let open = || {
            (0..self.devices.count())
                .filter_map(|i| self.devices.opened(i).map(|c| (i, c)))
                .find(|(_, c)| route::has_ip(&c.dev, at.ip()))
        };
        let dev = match (bound, open()) {
            (Some(d), _) => d,
            (None, Some((i, _))) => self.device(&mut st, i).ok()?,
            (None, None) => held?,
        };
        let d = dev.shared();
        Some(Peer::new(d.addr.ip_gid().0, d.addr.lid()))
    }
}

/// How many seeded ports a port-0 bind tries before it gives up.
const SEEDED_PORT_TRIES: usize = 64;

/// A TCP socket bound to `addr`'s IP on a port of rdma_cm's choosing: the kernel's
/// ephemeral port, or under a seed the first port drawn from it that binds, so that a
/// seeded run's listeners take the same ports again ([`crate::choices`]).
fn bind_ephemeral(choices: &Choices, addr: SocketAddr) -> std::io::Result<socket2::Socket> {
    if !choices.seeded() {
        return rendezvous::bind(addr);
    }
    let mut last = None;
    for _ in 0..SEEDED_PORT_TRIES {
        let mut a = addr;
        a.set_port(choices.in_range(Choice::CmPort, EPHEMERAL));
        match rendezvous::bind(a) {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::ErrorKind::AddrInUse.into()))
}
