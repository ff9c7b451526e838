//! The calls on an id once it has an address: what librdmacm's queries report
//! (`id->route`, `id->verbs`), `rdma_set_option`, `rdma_migrate_id`,
//! `rdma_init_qp_attr`, and the connection's calls, which [`crate::rdmacm::cm`] carries out.

use super::*;

impl Core {
    /// What librdmacm's address query reports.
    pub fn query_addr(&self, handle: u32) -> Result<CmAddr> {
        self.with("rdma_query_addr", handle, |_, st, _| {
            let id = &st.ids[&handle];
            Ok(CmAddr {
                src: id.src,
                dst: id.dst,
                node_guid: id.dev.as_ref().map_or(0, |d| d.shared().attr.node_guid),
                port_num: u8::from(id.dev.is_some()),
                pkey: 0xffff,
                ibdev_index: id.dev.as_ref().map(|d| d.index),
            })
        })
    }

    /// The id's path records.
    pub fn query_path(&self, handle: u32) -> Result<Vec<PathRecord>> {
        self.with("rdma_query_path", handle, |_, st, _| {
            Ok(st.ids[&handle].path.into_iter().collect())
        })
    }

    /// The id's source and destination GIDs.
    pub fn query_gid(&self, handle: u32) -> Result<(Gid, Gid)> {
        self.with("rdma_query_gid", handle, |_, st, _| {
            let id = &st.ids[&handle];
            let sgid = id.dev.as_ref().map_or(Gid::ZERO, |d| d.shared().addr.ip_gid());
            let dgid = match (&id.path, id.dst) {
                (Some(p), _) => p.dgid,
                (None, Some(d)) => Gid(route::ip16(d.ip())),
                (None, None) => Gid::ZERO,
            };
            Ok((sgid, dgid))
        })
    }

    /// The id's device.
    pub fn verbs(&self, handle: u32) -> Option<Arc<SimContext>> {
        self.st
            .lock()
            .ids
            .get(&handle)?
            .dev
            .as_ref()
            .map(|d| d.ctx.clone())
    }

    /// The id's context value.
    pub fn context(&self, handle: u32) -> u64 {
        self.st.lock().ids.get(&handle).map_or(0, |i| i.context)
    }

    /// Sets the id's context value.
    pub fn set_context(&self, handle: u32, context: u64) {
        if let Some(i) = self.st.lock().ids.get_mut(&handle) {
            i.context = context;
        }
    }

    /// `rdma_migrate_id`: the id and its pending events move to `to`.
    pub fn migrate(&self, handle: u32, to: Arc<Channel>) -> Result<()> {
        self.with("rdma_migrate_id", handle, |_, st, _| {
            let id = st.ids.get_mut(&handle).expect("checked");
            if Arc::ptr_eq(&id.channel, &to) {
                return Ok(());
            }
            for ev in id.channel.take_for(|e| e.handle == handle) {
                to.push(ev);
            }
            id.channel = to;
            Ok(())
        })
    }

    /// `rdma_set_option`.
    pub fn set_option(&self, handle: u32, opt: &CmOption) -> Result<()> {
        const CALL: &str = "rdma_set_option";
        self.with(CALL, handle, |_, st, _| {
            let id = st.ids.get_mut(&handle).expect("checked");
            match opt {
                CmOption::Tos(t) => id.opts.tos = *t,
                CmOption::ReuseAddr(r) => {
                    if !(id.state == State::Idle || (!*r && id.state != State::Listen)) {
                        return Err(cm_err(CALL, libc::EINVAL, "REUSEADDR is set before the id binds"));
                    }
                    id.opts.reuseaddr = *r;
                }
                CmOption::AfOnly(a) => {
                    id.need(CALL, &[State::Idle])?;
                    id.opts.afonly = *a;
                }
                CmOption::AckTimeout(t) => {
                    if id.qp_type != QpType::Rc {
                        return Err(cm_err(CALL, libc::EINVAL, "ACK_TIMEOUT is an RC id's"));
                    }
                    id.opts.ack_timeout = Some(*t);
                }
                CmOption::IbPath(recs) => {
                    id.need(CALL, &[State::AddrResolved])?;
                    let Some(p) = recs.first() else {
                        return Err(cm_err(CALL, libc::EINVAL, "no path record"));
                    };
                    id.path = Some(*p);
                    id.state = State::RouteResolved;
                    id.event(CmEventType::RouteResolved, 0, CmEventParam::None);
                }
            }
            Ok(())
        })
    }

    /// `rdma_init_qp_attr`: what moves the id's QP to `state` (the IB CM's attributes
    /// once a connection exists, `cma_ib_init_qp_attr`'s before and for UD).
    pub fn init_qp_attr(&self, handle: u32, state: QpState) -> Result<(QpAttr, QpAttrMask)> {
        const CALL: &str = "rdma_init_qp_attr";
        self.with(CALL, handle, |_, st, _| {
            let id = &st.ids[&handle];
            let dev = id.dev(CALL)?;
            let mut a = QpAttr {
                qp_state: state,
                port_num: 1,
                pkey_index: 0,
                ..Default::default()
            };
            let conn = id
                .conn
                .as_ref()
                .filter(|c| id.qp_type != QpType::Ud && c.phase.has_cm_id());
            let Some(c) = conn else {
                let mut m = QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT;
                if id.qp_type == QpType::Ud {
                    a.qkey = UDP_QKEY;
                    m |= QpAttrMask::QKEY;
                } else {
                    m |= QpAttrMask::ACCESS_FLAGS;
                }
                if state == QpState::Rtr {
                    a.rq_psn = id.seq_num;
                }
                return Ok((a, m));
            };
            let wrong = || {
                cm_err(
                    CALL,
                    libc::EINVAL,
                    format!(
                        "the connection is in {:?}, which has no {state:?} attributes",
                        c.phase
                    ),
                )
            };
            match state {
                QpState::Init => {
                    if !c.phase.allows_init() {
                        return Err(wrong());
                    }
                    a.qp_access_flags = AccessFlags::REMOTE_WRITE;
                    if c.responder_resources > 0 {
                        a.qp_access_flags |= AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
                    }
                    Ok((
                        a,
                        QpAttrMask::STATE
                            | QpAttrMask::ACCESS_FLAGS
                            | QpAttrMask::PKEY_INDEX
                            | QpAttrMask::PORT,
                    ))
                }
                QpState::Rtr => {
                    if !c.phase.allows_rtr() {
                        return Err(wrong());
                    }
                    let p = id.path.unwrap_or_else(|| {
                        route::path(dev.shared(), Some(&c.peer), c.peer.addr.ip(), id.opts.tos)
                    });
                    a.ah_attr = route::ah_attr(&p);
                    a.path_mtu = c.path_mtu;
                    a.dest_qp_num = c.remote_qpn;
                    a.rq_psn = id.seq_num;
                    a.max_dest_rd_atomic = c.responder_resources;
                    a.min_rnr_timer = 0;
                    let mut m = QpAttrMask::STATE
                        | QpAttrMask::AV
                        | QpAttrMask::PATH_MTU
                        | QpAttrMask::DEST_QPN
                        | QpAttrMask::RQ_PSN;
                    if id.qp_type == QpType::Rc {
                        m |= QpAttrMask::MAX_DEST_RD_ATOMIC | QpAttrMask::MIN_RNR_TIMER;
                    }
                    Ok((a, m))
                }
                QpState::Rts => {
                    if !c.phase.allows_rtr() {
                        return Err(wrong());
                    }
                    a.sq_psn = c.remote_psn;
                    let mut m = QpAttrMask::STATE | QpAttrMask::SQ_PSN;
                    if id.qp_type == QpType::Rc {
                        a.retry_cnt = c.retry_count;
                        a.rnr_retry = c.rnr_retry_count;
                        a.max_rd_atomic = c.initiator_depth;
                        a.timeout = id.opts.ack_timeout.unwrap_or(route::PACKET_LIFE_TIME + 1);
                        m |= QpAttrMask::RETRY_CNT
                            | QpAttrMask::RNR_RETRY
                            | QpAttrMask::MAX_QP_RD_ATOMIC
                            | QpAttrMask::TIMEOUT;
                    }
                    Ok((a, m))
                }
                _ => Err(wrong()),
            }
        })
    }

    /// The path MTU of a connection from device `d` whose peer offered `offered`.
    pub fn path_mtu(d: &DeviceShared, offered: u8) -> Mtu {
        route::min_mtu(d.limits.active_mtu, offered)
    }

    /// `rdma_connect`.
    pub fn connect(&self, handle: u32, param: &ConnParam) -> Result<()> {
        self.with("rdma_connect", handle, |_, st, out| {
            crate::rdmacm::cm::connect(st, handle, param, out)
        })
    }

    /// `rdma_accept` (with `None`: `rdma_establish`).
    pub fn accept(&self, handle: u32, param: Option<&ConnParam>) -> Result<()> {
        self.with("rdma_accept", handle, |_, st, out| {
            crate::rdmacm::cm::accept(st, handle, param, out)
        })
    }

    /// `rdma_reject`.
    pub fn reject(&self, handle: u32, private_data: &[u8], reason: u8) -> Result<()> {
        let reason = verbs_api::rdmacm::reject::checked(reason)?;
        self.with("rdma_reject", handle, |_, st, out| {
            crate::rdmacm::cm::reject(st, handle, private_data, reason, out)
        })
    }

    /// `rdma_disconnect`.
    pub fn disconnect(&self, handle: u32) -> Result<()> {
        self.with("rdma_disconnect", handle, |_, st, out| {
            crate::rdmacm::cm::disconnect(st, handle, out)
        })
    }

    /// `rdma_notify`.
    pub fn notify(&self, handle: u32, event: verbs_api::AsyncEventType) -> Result<()> {
        self.with("rdma_notify", handle, |_, st, _| {
            crate::rdmacm::cm::notify(st, handle, event)
        })
    }
}
