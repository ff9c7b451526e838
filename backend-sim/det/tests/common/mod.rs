//! An RC client and server as an application writes them: generic over
//! `verbs_api::Backend`, sync polling loops (`poll_n`), no knowledge of the backend they
//! run on. The tests run them on the deterministic backend.

#![allow(dead_code)]

use std::time::Duration;

use verbs_api::{
    connect_rc, local_endpoint, poll_n, AccessFlags, Backend, Context, CqOf, MemoryRegion, MrOf, PdOf,
    ProtectionDomain, QpCap, QpInitAttr, QpOf, QpType, QueuePair, RcParams, RecvWr, SendWr, WcOpcode,
    WcStatus, WorkCompletion,
};

/// How long the application waits for completions (its own bound, wall-clock time).
pub const WAIT: Duration = Duration::from_secs(30);

/// One side: a device, a PD, one CQ, one RC QP, one region.
pub struct Side<B: Backend> {
    pub qp: QpOf<B>,
    pub cq: CqOf<B>,
    pub mr: MrOf<B>,
    pub pd: PdOf<B>,
    pub ctx: B::Context,
}

/// Bytes of each side's region.
pub const REGION: usize = 64 * 1024;

/// Opens `dev` and makes a side on it.
pub fn side<B: Backend>(b: &B, dev: &str) -> verbs_api::Result<Side<B>> {
    let ctx = b.open(dev)?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(1024, None)?;
    let mr = pd.reg_mr(REGION, AccessFlags::ALL)?;
    let cap = QpCap {
        max_send_wr: 128,
        max_recv_wr: 128,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq, cap))?;
    Ok(Side { qp, cq, mr, pd, ctx })
}

/// Connects the two sides' QPs to each other (the out-of-band exchange is a copy).
pub fn connect<B: Backend>(a: &Side<B>, b: &Side<B>) -> verbs_api::Result<()> {
    let params = RcParams {
        timeout: 10,
        ..RcParams::default()
    };
    let ea = local_endpoint(&a.ctx, &a.qp, &params, 100)?;
    let eb = local_endpoint(&b.ctx, &b.qp, &params, 9000)?;
    connect_rc(&a.qp, &params, ea.psn, &eb)?;
    connect_rc(&b.qp, &params, eb.psn, &ea)
}

/// Waits for `n` completions on `s`'s CQ, all successful.
pub fn wait_ok<B: Backend>(s: &Side<B>, n: usize) -> Result<Vec<WorkCompletion>, String> {
    let wcs = poll_n(&s.cq, n, WAIT).map_err(|e| e.to_string())?;
    if let Some(w) = wcs.iter().find(|w| w.status != WcStatus::Success) {
        return Err(format!("WR {} completed {:?}", w.wr_id, w.status));
    }
    Ok(wcs)
}

fn pattern(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|k| (k * 7 + i * 13 + 1) as u8).collect()
}

fn check(what: &str, got: &[u8], want: &[u8]) -> Result<(), String> {
    if got == want {
        Ok(())
    } else {
        let at = got.iter().zip(want).position(|(g, w)| g != w).unwrap_or(0);
        Err(format!(
            "{what}: byte {at} is {:#x}, not {:#x}",
            got[at], want[at]
        ))
    }
}

/// SENDs to posted receives, WRITEs, READs back, FETCH_AND_ADDs and COMPARE_AND_SWAPs
/// from the client to the server; what arrives, what is read and what the atomics
/// returned must be what RC guarantees (each atomic executed exactly once).
pub fn client_server<B: Backend>(b: &B) -> Result<(), String> {
    let e = |x: verbs_api::Error| x.to_string();
    let client = side(b, "client").map_err(e)?;
    let server = side(b, "server").map_err(e)?;
    connect(&client, &server).map_err(e)?;
    let (c, s) = (&client.mr, &server.mr);

    // SEND/RECV: 8 messages of different lengths into 8 posted receives.
    const MSGS: usize = 8;
    const SLOT: usize = 2048;
    for i in 0..MSGS {
        let sge = [s.sge(i * SLOT, SLOT).map_err(e)?];
        server
            .qp
            .post_recv(&[RecvWr::new(i as u64, &sge)])
            .map_err(|x| x.to_string())?;
    }
    for i in 0..MSGS {
        let len = 100 + i * 200;
        c.write(i * SLOT, &pattern(i, len)).map_err(e)?;
        let sge = [c.sge(i * SLOT, len).map_err(e)?];
        client
            .qp
            .post_send(&[SendWr::send(i as u64, &sge).signaled()])
            .map_err(|x| x.to_string())?;
    }
    wait_ok(&client, MSGS)?;
    let recvs = wait_ok(&server, MSGS)?;
    for (k, w) in recvs.iter().enumerate() {
        let i = w.wr_id as usize;
        if i != k || w.opcode != WcOpcode::Recv || w.byte_len as usize != 100 + i * 200 {
            return Err(format!("receive {k}: {w:?}"));
        }
        let mut got = vec![0u8; w.byte_len as usize];
        s.read(i * SLOT, &mut got).map_err(e)?;
        check(&format!("SEND {i}"), &got, &pattern(i, got.len()))?;
    }

    // RDMA WRITE 20 KiB into the server, then READ it back into another part of the client.
    const W_AT: usize = 20_000;
    const W_LEN: usize = 20_480;
    let data = pattern(99, W_LEN);
    c.write(W_AT, &data).map_err(e)?;
    let sge = [c.sge(W_AT, W_LEN).map_err(e)?];
    let wr = SendWr::write(100, &sge, s.remote().at(W_AT as u64)).signaled();
    client.qp.post_send(&[wr]).map_err(|x| x.to_string())?;
    wait_ok(&client, 1)?;
    let mut got = vec![0u8; W_LEN];
    s.read(W_AT, &mut got).map_err(e)?;
    check("WRITE", &got, &data)?;
    let sge = [c.sge(W_AT + W_LEN, W_LEN).map_err(e)?];
    let wr = SendWr::read(101, &sge, s.remote().at(W_AT as u64)).signaled();
    client.qp.post_send(&[wr]).map_err(|x| x.to_string())?;
    wait_ok(&client, 1)?;
    c.read(W_AT + W_LEN, &mut got).map_err(e)?;
    check("READ", &got, &data)?;

    // 16 FETCH_AND_ADDs of i + 1 and 16 COMPARE_AND_SWAPs i -> i + 1, all in flight at once.
    const ATOMICS: u64 = 16;
    const FAA_AT: usize = 8;
    const CAS_AT: usize = 16;
    const RESULTS: usize = 62 * 1024;
    s.write_u64(FAA_AT, 0).map_err(e)?;
    s.write_u64(CAS_AT, 0).map_err(e)?;
    for i in 0..ATOMICS {
        let r = RESULTS + i as usize * 16;
        let (faa, cas) = ([c.sge(r, 8).map_err(e)?], [c.sge(r + 8, 8).map_err(e)?]);
        let wrs = [
            SendWr::fetch_and_add(200 + i, &faa, s.remote().at(FAA_AT as u64), i + 1).signaled(),
            SendWr::cmp_and_swp(300 + i, &cas, s.remote().at(CAS_AT as u64), i, i + 1).signaled(),
        ];
        client.qp.post_send(&wrs).map_err(|x| x.to_string())?;
    }
    wait_ok(&client, 2 * ATOMICS as usize)?;
    let mut sum = 0;
    for i in 0..ATOMICS {
        let r = RESULTS + i as usize * 16;
        let (faa, cas) = (c.read_u64(r).map_err(e)?, c.read_u64(r + 8).map_err(e)?);
        if faa != sum || cas != i {
            return Err(format!(
                "atomic {i}: FETCH_AND_ADD returned {faa} (not {sum}), CMP_AND_SWP {cas} (not {i})"
            ));
        }
        sum += i + 1;
    }
    let (faa, cas) = (s.read_u64(FAA_AT).map_err(e)?, s.read_u64(CAS_AT).map_err(e)?);
    if faa != sum || cas != ATOMICS {
        return Err(format!(
            "after the atomics the words hold {faa} and {cas}, not {sum} and {ATOMICS}: one ran twice or not at all"
        ));
    }
    Ok(())
}
