//! What both sides of perf set up alike: the connection's attributes, a QP of `-c`'s
//! type with its CQs (and SRQ), the UD peer's address handle.

use anyhow::Context as _;
use examples::conn::{self, QpOpts};
use examples::perftest::opts::{Connection, PerfCli};
use examples::perftest::params::perftest_rc_params;
use examples::perftest::side::UdPeer;
use examples::Res;
use std::sync::Arc;
use verbs_api::{ah_attr_for, Backend, Context, ProtectionDomain, RcParams, SrqAttr};

/// The connection's attributes: the common ones, or under `--perftest` perftest's.
pub(crate) fn rc_params<B: Backend>(ctx: &B::Context, cli: &PerfCli) -> Res<RcParams> {
    let base = RcParams {
        timeout: cli.qp_timeout,
        ..cli.common.rc_params()
    };
    Ok(if cli.perftest {
        perftest_rc_params(base, cli.test, &ctx.capabilities()?)
    } else {
        base
    })
}

/// A side's QP (of `-c`'s type), its CQ, its receive CQ where it has one, its SRQ.
pub(crate) struct Made<B: Backend> {
    pub(crate) rc: conn::RcQp<B>,
    pub(crate) recv_cq: Option<B::Cq>,
    pub(crate) srq: Option<B::Srq>,
}

/// A QP of `-c`'s type with a CQ for both queues, or under `--perftest` for a SEND test
/// (as perftest does) a send CQ and a receive CQ; with `--use_srq`, on an SRQ of
/// `opts.recv_wr` receives.
pub(crate) fn create_qp<B: Backend>(
    ctx: &B::Context,
    pd: &B::Pd,
    opts: &QpOpts,
    cli: &PerfCli,
) -> Res<Made<B>> {
    let srq = if cli.use_srq {
        let attr = SrqAttr::new(opts.recv_wr, 1);
        Some(
            pd.create_srq(&attr)
                .context("creating the shared receive queue")?,
        )
    } else {
        None
    };
    let qp_type = cli.connection.qp_type();
    let split = cli.perftest && cli.test.is_send();
    let cqe = if split { opts.send_wr } else { opts.cqe() };
    let cq = ctx
        .create_cq(cqe, None)
        .with_context(|| format!("creating a CQ of {cqe} entries"))?;
    let recv_cq = if split {
        Some(
            ctx.create_cq(opts.recv_wr, None)
                .with_context(|| format!("creating a receive CQ of {} entries", opts.recv_wr))?,
        )
    } else {
        None
    };
    let cqs = (&cq, recv_cq.as_ref().unwrap_or(&cq));
    let (qp, cap) = conn::create_qp_of::<B>(ctx, pd, cqs, opts, qp_type, srq.as_ref())?;
    Ok(Made {
        rc: conn::RcQp { cq, qp, cap },
        recv_cq,
        srq,
    })
}

/// On UD, the peer's address: an address handle from its endpoint, and its QP.
pub(crate) fn ud_peer<B: Backend>(
    pd: &B::Pd,
    cli: &PerfCli,
    params: &RcParams,
    peer: &verbs_api::Endpoint,
) -> Res<Option<UdPeer<B>>> {
    if cli.connection != Connection::Ud {
        return Ok(None);
    }
    let ah = pd
        .create_ah(&ah_attr_for(peer, params))
        .context("creating an address handle for the peer")?;
    Ok(Some(UdPeer {
        ah: Arc::new(ah),
        qpn: peer.qpn,
    }))
}

/// The receive CQ of a `--perftest` SEND test.
pub(crate) fn recv_cq_of<B: Backend>(recv_cq: Option<&B::Cq>) -> Res<&B::Cq> {
    recv_cq.context("a --perftest SEND test has a receive CQ of its own")
}
