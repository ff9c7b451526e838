//! Creating and destroying ids (`rdma_create_id`, `rdma_destroy_id`, the kernel's
//! `cma_new_conn_id` for a connection request), and taking their events off a channel.

use super::*;

impl Core {
    /// `rdma_create_id`.
    pub fn create_id(&self, channel: Arc<Channel>, context: u64, ps: PortSpace, qp_type: QpType) -> u32 {
        let mut st = self.st.lock();
        let handle = st.handle();
        let seq_num = st.fresh_psn();
        st.ids
            .insert(handle, new_id(handle, channel, context, ps, qp_type, seq_num));
        handle
    }

    /// `rdma_destroy_id`: rejects or disconnects what the id was doing, stops its
    /// listening (destroying the requests nobody took), and drops its pending events.
    pub fn destroy(&self, handle: u32) {
        let mut out = Outbox::default();
        let mut orphans = Vec::new();
        // The id leaves the table under the lock but is dropped after it: it may hold the
        // last reference to a device, whose closing joins the device's threads, and one
        // of them may be waiting for this lock (telling of a link that closed).
        let gone;
        {
            let mut st = self.st.lock();
            let Some(id) = st.ids.remove(&handle) else {
                return;
            };
            crate::rdmacm::cm::on_destroy(&mut st, &id, &mut out);
            if id.holds_port {
                if let Some(src) = id.src {
                    if let Some(v) = st.ports.get_mut(&(id.ps, src.port())) {
                        v.retain(|h| *h != handle);
                        if v.is_empty() {
                            st.ports.remove(&(id.ps, src.port()));
                        }
                    }
                }
            }
            if let Some(l) = &id.listen {
                if let Some((_, users)) = st.rendezvous.get_mut(&l.rendezvous) {
                    *users -= 1;
                    if *users == 0 {
                        st.rendezvous.remove(&l.rendezvous);
                    }
                }
            }
            // Its events, and the requests it listened for that nobody took (their
            // new ids go too: the peer is rejected).
            for ev in id
                .channel
                .take_for(|e| e.handle == handle || e.listen == Some(handle))
            {
                if ev.listen == Some(handle) && ev.event == CmEventType::ConnectRequest {
                    orphans.push(ev.handle);
                }
            }
            gone = id;
        }
        self.run(out);
        drop(gone);
        for h in orphans {
            self.destroy(h);
        }
    }

    /// Takes an event from `ch` for a caller: a connection request's taking frees a
    /// place in its listener's backlog.
    pub fn taken(&self, ev: &Queued) {
        if let Some(l) = ev.listen {
            if let Some(lid) = self.st.lock().ids.get_mut(&l).and_then(|i| i.listen.as_mut()) {
                lid.queued = lid.queued.saturating_sub(1);
            }
        }
    }
}

fn new_id(
    handle: u32,
    channel: Arc<Channel>,
    context: u64,
    ps: PortSpace,
    qp_type: QpType,
    seq_num: u32,
) -> Id {
    Id {
        handle,
        context,
        ps,
        qp_type,
        channel,
        state: State::Idle,
        dev: None,
        src: None,
        dst: None,
        holds_port: false,
        reserved: None,
        peer: None,
        path: None,
        seq_num,
        listen: None,
        conn: None,
        opts: Opts::default(),
        unclaimed: false,
        gen: 0,
        joins: Vec::new(),
    }
}

/// A connection request's new id (`cma_new_conn_id`): on `dev`, reporting to the
/// listener's channel with its context, its addresses the request's.
pub fn new_conn_id(
    st: &mut Ids,
    listener: u32,
    dev: &Dev,
    src: SocketAddr,
    dst: SocketAddr,
    qp_type: QpType,
) -> u32 {
    let handle = st.handle();
    let (channel, context, ps, tos) = {
        let l = &st.ids[&listener];
        (l.channel.clone(), l.context, l.ps, l.opts.tos)
    };
    let seq_num = st.fresh_psn();
    let mut id = new_id(handle, channel, context, ps, qp_type, seq_num);
    id.dev = Some(dev.clone());
    id.src = Some(src);
    id.dst = Some(dst);
    id.state = State::Connect;
    id.opts.tos = tos;
    id.unclaimed = true;
    st.ids.insert(handle, id);
    handle
}
