//! What comes to a connection from outside the calls: its timers (resends, and giving
//! up), a peer that is gone, and the peer's messages (REQ, SIDR_REQ, and those of a
//! connection under way).

use super::*;

// ------------------------------------------------------------------- timers

/// `id`'s timer: the awaited answer did not come in time (resend, or give up), or the
/// time wait ended.
pub fn on_timer(st: &mut Ids, handle: u32, out: &mut Outbox) {
    let id = st.ids.get_mut(&handle).expect("checked");
    let Some(c) = id.conn.as_mut() else {
        return;
    };
    if c.phase == Phase::Timewait {
        c.phase = Phase::Idle;
        if id.state == State::Disconnect {
            id.event(CmEventType::TimewaitExit, 0, CmEventParam::None);
        }
        return;
    }
    if c.last.is_some() && c.tries > 1 {
        c.tries -= 1;
        send_last(out, id);
        return;
    }
    give_up(id, out);
}

/// The awaited answer will not come (timed out, or the peer's device is gone).
fn give_up(id: &mut Id, out: &mut Outbox) {
    let Some(phase) = id.conn.as_ref().map(|c| c.phase) else {
        return;
    };
    match phase {
        Phase::ReqSent { .. } | Phase::SidrReqSent => fail_handshake(id, None),
        Phase::RepSent => {
            disarm(id);
            id.conn.as_mut().expect("checked").phase = Phase::Idle;
            if id.state == State::Connect {
                id.event(CmEventType::Unreachable, -libc::ETIMEDOUT, CmEventParam::None);
            }
        }
        Phase::DreqSent => {
            disconnected(id, -libc::ETIMEDOUT);
            enter_timewait(id, out);
        }
        _ => disarm(id),
    }
}

/// The device at `peer` cannot be reached from device `index`: what waited for it gives
/// up at once, and its connections are disconnected.
pub fn on_peer_gone(st: &mut Ids, index: u32, peer: std::net::SocketAddr, out: &mut Outbox) {
    for id in st.ids.values_mut() {
        let mine = id.dev.as_ref().is_some_and(|d| d.index == index);
        let Some(c) = id.conn.as_ref().filter(|c| mine && c.peer.addr == peer) else {
            continue;
        };
        match c.phase {
            Phase::ReqSent { .. } | Phase::SidrReqSent | Phase::RepSent | Phase::DreqSent => give_up(id, out),
            Phase::Established | Phase::DreqRcvd | Phase::RepRcvd => {
                tracing::debug!(handle = id.handle, %peer, "rdma_cm: the peer's device is gone: disconnected");
                disconnected(id, 0);
                enter_timewait(id, out);
            }
            _ => {}
        }
    }
}

// ------------------------------------------------------------------- messages

/// A message from device `peer` to device `dev`.
pub fn on_message(st: &mut Ids, dev: &Dev, peer: Peer, msg: CmMsg, out: &mut Outbox) {
    match msg.body {
        Body::Req(r) => on_req(st, dev, peer, msg.local_comm_id, r, out),
        Body::SidrReq(r) => on_sidr_req(st, dev, peer, msg.local_comm_id, r, out),
        body => {
            let handle = st.by_comm.get(&msg.remote_comm_id).copied().filter(|h| {
                st.ids.get(h).is_some_and(|i| {
                    i.conn.as_ref().is_some_and(|c| {
                        c.peer.addr == peer.addr && (c.remote_comm == 0 || c.remote_comm == msg.local_comm_id)
                    })
                })
            });
            match handle {
                Some(h) => on_conn_message(st.ids.get_mut(&h).expect("found"), msg.local_comm_id, body, out),
                None => on_stray(dev, peer, msg.local_comm_id, msg.remote_comm_id, body, out),
            }
        }
    }
}

/// A message for no connection of this side: a DREQ is answered (the peer's disconnect
/// completes), a REP rejected (its connection is over here); the rest is dropped.
fn on_stray(dev: &Dev, peer: Peer, local: u32, remote: u32, body: Body, out: &mut Outbox) {
    tracing::debug!(%peer.addr, ?body, "rdma_cm: message for no connection");
    match body {
        Body::Dreq { .. } => answer(out, dev, &peer, remote, local, Body::Drep),
        Body::Rep(_) => answer(
            out,
            dev,
            &peer,
            remote,
            local,
            Body::Rej {
                reason: 6, // IB_CM_REJ_INVALID_COMM_ID
                of: Kind::Rep,
                private_data: Vec::new(),
            },
        ),
        _ => {}
    }
}

/// A listener for a request to `(ps, port)` at `ip` on device `dev`.
fn listener_for(st: &Ids, dev: &Dev, service_id: u64, ip: std::net::IpAddr) -> Option<u32> {
    let ps = (service_id >> 16) as u16;
    let port = (service_id & 0xffff) as u16;
    st.ids
        .values()
        .find(|i| {
            i.state == State::Listen
                && i.ps as u16 == ps
                && i.dev.as_ref().is_none_or(|d| d.index == dev.index)
                && i.src
                    .is_some_and(|s| s.port() == port && (s.ip().is_unspecified() || s.ip() == ip))
        })
        .map(|i| i.handle)
}

/// Whether `listener` has room for one more request; if so, takes it.
fn take_backlog(st: &mut Ids, listener: u32) -> bool {
    match st.ids.get_mut(&listener).and_then(|i| i.listen.as_mut()) {
        Some(l) if l.queued < l.backlog => {
            l.queued += 1;
            true
        }
        _ => false,
    }
}

fn on_req(st: &mut Ids, dev: &Dev, peer: Peer, remote_comm: u32, r: Req, out: &mut Outbox) {
    if let Some(h) = st.by_remote.get(&(peer.addr, remote_comm)).copied() {
        // A resent request: the answer is resent (or its receipt, while the consumer
        // decides).
        let id = st.ids.get_mut(&h).expect("indexed");
        match id.conn.as_ref().map(|c| (c.phase, c.last.clone())) {
            Some((Phase::RepSent, Some(rep))) => {
                out.sends.push((dev.shared().clone(), peer.addr, rep));
            }
            Some((Phase::ReqRcvd, _)) => {
                let c = id.conn.as_ref().expect("checked");
                answer(
                    out,
                    dev,
                    &peer,
                    c.local_comm,
                    remote_comm,
                    Body::Mra { of: Kind::Req },
                );
            }
            _ => {}
        }
        return;
    }
    let dst_ip = route::ip_of16(r.dst_ip);
    let refuse = |out: &mut Outbox, reason: i32| {
        answer(
            out,
            dev,
            &peer,
            0,
            remote_comm,
            Body::Rej {
                reason: reason as u16,
                of: Kind::Req,
                private_data: Vec::new(),
            },
        )
    };
    let Some(listener) = listener_for(st, dev, r.service_id, dst_ip) else {
        tracing::debug!(%peer.addr, service_id = r.service_id, "rdma_cm: REQ for no listener: rejected");
        return refuse(out, reject::INVALID_SERVICE_ID);
    };
    if st.ids[&listener].qp_type as u8 != r.qp_type {
        return refuse(out, reject::CONSUMER_DEFINED);
    }
    if !take_backlog(st, listener) {
        tracing::debug!(listener, "rdma_cm: REQ dropped: the listener's backlog is full");
        return;
    }
    let port = (r.service_id & 0xffff) as u16;
    let src = std::net::SocketAddr::new(dst_ip, port);
    let dst = std::net::SocketAddr::new(route::ip_of16(r.src_ip), r.src_port);
    let qp_type = if r.qp_type == QpType::Uc as u8 {
        QpType::Uc
    } else {
        QpType::Rc
    };
    let handle = new_conn_id(st, listener, dev, src, dst, qp_type);
    let local_comm = st.fresh_comm();
    st.by_comm.insert(local_comm, handle);
    st.by_remote.insert((peer.addr, remote_comm), handle);
    let id = st.ids.get_mut(&handle).expect("just made");
    let mut path = route::path(dev.shared(), Some(&peer), dst.ip(), id.opts.tos);
    path.mtu = Core::path_mtu(dev.shared(), r.path_mtu);
    id.path = Some(path);
    id.peer = Some(peer);
    id.conn = Some(Conn {
        phase: Phase::ReqRcvd,
        local_comm,
        remote_comm,
        peer,
        local_qpn: 0,
        remote_qpn: r.qpn,
        remote_psn: r.starting_psn,
        responder_resources: r.initiator_depth,
        initiator_depth: r.responder_resources,
        retry_count: r.retry_count,
        rnr_retry_count: r.rnr_retry_count,
        flow_control: r.flow_control,
        srq: false,
        path_mtu: path.mtu,
        last: None,
        tries: 0,
    });
    let param = ConnParam {
        private_data: padded(&r.private_data, Kind::Req),
        responder_resources: r.initiator_depth,
        initiator_depth: r.responder_resources,
        flow_control: r.flow_control,
        retry_count: r.retry_count,
        rnr_retry_count: r.rnr_retry_count,
        srq: r.srq != 0,
        qp_num: r.qpn,
        qkey: 0,
    };
    request_event(st, listener, handle, CmEventParam::Conn(param));
    answer(
        out,
        dev,
        &peer,
        local_comm,
        remote_comm,
        Body::Mra { of: Kind::Req },
    );
}

/// Queues a connection request for `listener`, naming the new id `handle`.
fn request_event(st: &Ids, listener: u32, handle: u32, param: CmEventParam) {
    let l = &st.ids[&listener];
    l.channel.push(crate::rdmacm::channel::Queued {
        handle,
        context: l.context,
        listen: Some(listener),
        event: CmEventType::ConnectRequest,
        status: 0,
        param,
        mcast: None,
    });
}

fn on_sidr_req(st: &mut Ids, dev: &Dev, peer: Peer, request_id: u32, r: SidrReq, out: &mut Outbox) {
    if st.by_remote.contains_key(&(peer.addr, request_id)) {
        return;
    }
    let dst_ip = route::ip_of16(r.dst_ip);
    let refuse = |out: &mut Outbox, status: i32| {
        answer(
            out,
            dev,
            &peer,
            0,
            request_id,
            Body::SidrRep(SidrRep {
                status: status as u8,
                qpn: 0,
                qkey: 0,
                private_data: Vec::new(),
            }),
        )
    };
    let Some(listener) = listener_for(st, dev, r.service_id, dst_ip) else {
        return refuse(out, sidr::UNSUPPORTED);
    };
    if st.ids[&listener].qp_type != QpType::Ud {
        return refuse(out, sidr::UNSUPPORTED);
    }
    if !take_backlog(st, listener) {
        return;
    }
    let port = (r.service_id & 0xffff) as u16;
    let src = std::net::SocketAddr::new(dst_ip, port);
    let dst = std::net::SocketAddr::new(route::ip_of16(r.src_ip), r.src_port);
    let handle = new_conn_id(st, listener, dev, src, dst, QpType::Ud);
    let local_comm = st.fresh_comm();
    st.by_comm.insert(local_comm, handle);
    st.by_remote.insert((peer.addr, request_id), handle);
    let id = st.ids.get_mut(&handle).expect("just made");
    let path = route::path(dev.shared(), Some(&peer), dst.ip(), id.opts.tos);
    id.path = Some(path);
    id.peer = Some(peer);
    id.conn = Some(Conn {
        phase: Phase::SidrReqRcvd,
        local_comm,
        remote_comm: request_id,
        peer,
        local_qpn: 0,
        remote_qpn: 0,
        remote_psn: 0,
        responder_resources: 0,
        initiator_depth: 0,
        retry_count: 0,
        rnr_retry_count: 0,
        flow_control: 0,
        srq: false,
        path_mtu: path.mtu,
        last: None,
        tries: 0,
    });
    let param = UdParam {
        private_data: padded(&r.private_data, Kind::SidrReq),
        ..Default::default()
    };
    request_event(st, listener, handle, CmEventParam::Ud(param));
}

/// A message for `id`'s connection, from its peer (`remote` the peer's comm ID).
fn on_conn_message(id: &mut Id, remote: u32, body: Body, out: &mut Outbox) {
    let phase = id.conn.as_ref().expect("a connection").phase;
    match (body, phase) {
        (Body::Mra { of: Kind::Req }, Phase::ReqSent { .. }) => {
            let c = id.conn.as_mut().expect("checked");
            c.phase = Phase::ReqSent { mra: true };
            c.last = None;
            arm(out, id, MRA_WAIT);
        }
        (Body::Rep(r), Phase::ReqSent { .. }) => {
            disarm(id);
            let c = id.conn.as_mut().expect("checked");
            c.remote_comm = remote;
            c.remote_qpn = r.qpn;
            c.remote_psn = r.starting_psn;
            c.responder_resources = r.initiator_depth;
            c.initiator_depth = r.responder_resources;
            c.rnr_retry_count = r.rnr_retry_count;
            c.phase = Phase::RepRcvd;
            let param = ConnParam {
                private_data: padded(&r.private_data, Kind::Rep),
                responder_resources: r.initiator_depth,
                initiator_depth: r.responder_resources,
                flow_control: r.flow_control,
                retry_count: 0,
                rnr_retry_count: r.rnr_retry_count,
                srq: r.srq != 0,
                qp_num: r.qpn,
                qkey: 0,
            };
            id.event(CmEventType::ConnectResponse, 0, conn_event(&param));
        }
        (Body::Rep(_), Phase::Established) => {
            // The RTU was lost with a link: sent again.
            send(out, id, Body::Rtu, None);
        }
        (Body::Rtu, Phase::RepSent) => establish_passive(id),
        (
            Body::Rej {
                reason, private_data, ..
            },
            Phase::ReqSent { .. } | Phase::RepRcvd | Phase::RepSent,
        ) => {
            disarm(id);
            id.conn.as_mut().expect("checked").phase = Phase::Idle;
            let param = ConnParam {
                private_data: padded(&private_data, Kind::Rej),
                ..Default::default()
            };
            if id.state == State::Connect {
                id.event(CmEventType::Rejected, i32::from(reason), conn_event(&param));
            }
        }
        (Body::Dreq { .. }, Phase::Established | Phase::RepSent) => {
            disarm(id);
            id.conn.as_mut().expect("checked").phase = Phase::DreqRcvd;
            disconnected(id, 0);
        }
        (Body::Dreq { .. }, Phase::DreqSent) => {
            // Both ended it at once.
            send(out, id, Body::Drep, None);
            disconnected(id, 0);
            enter_timewait(id, out);
        }
        (Body::Dreq { .. }, Phase::Timewait | Phase::Idle) => send(out, id, Body::Drep, None),
        (Body::Drep, Phase::DreqSent) => {
            disconnected(id, 0);
            enter_timewait(id, out);
        }
        (Body::SidrRep(r), Phase::SidrReqSent) => {
            disarm(id);
            let c = id.conn.as_mut().expect("checked");
            c.phase = Phase::Idle;
            c.remote_comm = remote;
            let private_data = padded(&r.private_data, Kind::SidrRep);
            if i32::from(r.status) != sidr::SUCCESS {
                id.event(
                    CmEventType::Unreachable,
                    i32::from(r.status),
                    CmEventParam::Ud(UdParam {
                        private_data,
                        ..Default::default()
                    }),
                );
                return;
            }
            let ah_attr = id.path.as_ref().map(route::ah_attr).unwrap_or_default();
            id.event(
                CmEventType::Established,
                0,
                CmEventParam::Ud(UdParam {
                    private_data,
                    ah_attr,
                    qp_num: r.qpn,
                    qkey: r.qkey,
                }),
            );
        }
        (body, phase) => {
            tracing::debug!(
                handle = id.handle,
                ?phase,
                ?body,
                "rdma_cm: message not expected now: dropped"
            );
        }
    }
}
