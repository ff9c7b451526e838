//! The case table. Each module holds one group; [`cases`] concatenates them in a fixed
//! order so reports line up across backends.

use verbs_api::rdmacm::CmBackend;
use verbs_api::Backend;

use crate::Case;

mod access;
mod aio;
mod atomic;
mod cq;
mod cq_resize;
mod device;
mod errors;
mod events;
mod mcast;
mod mr;
mod mw;
mod order;
mod port;
mod post;
mod profile;
mod qp;
mod rdma;
mod rdmacm;
mod remote;
mod rnr;
mod send;
mod send_error;
mod srq;
mod uc;
mod ud;

/// Builds a [`Case`] from its metadata and a generic function, optionally with the
/// capabilities it requires (`requires [Lack::Srq, ..]`).
macro_rules! case {
    ($id:literal, $name:literal, $source:literal, $f:ident) => {
        case!($id, $name, $source, $f, requires [])
    };
    ($id:literal, $name:literal, $source:literal, $f:ident, requires [$($lack:ident),*]) => {
        $crate::Case {
            id: $id,
            group: match $id.split_once('.') {
                Some((g, _)) => g,
                None => $id,
            },
            name: $name,
            source: $source,
            requires: &[$($crate::report::Lack::$lack),*],
            run: $f::<B>,
        }
    };
}
pub(crate) use case;

/// Every case, in report order.
pub fn cases<B: CmBackend>() -> Vec<Case<B>> {
    let mut v = verbs_cases::<B>();
    v.extend(rdmacm::list::<B>());
    v
}

/// Every case but the connection manager's (`rdmacm`), in report order: what a backend
/// without rdma_cm runs (the deterministic one).
pub fn verbs_cases<B: Backend>() -> Vec<Case<B>> {
    let mut v = Vec::new();
    v.extend(device::list::<B>());
    v.extend(mr::list::<B>());
    v.extend(cq::list::<B>());
    v.extend(cq_resize::list::<B>());
    v.extend(qp::list::<B>());
    v.extend(post::list::<B>());
    v.extend(send::list::<B>());
    v.extend(rnr::list::<B>());
    v.extend(access::list::<B>());
    v.extend(mw::list::<B>());
    v.extend(atomic::list::<B>());
    v.extend(rdma::list::<B>());
    v.extend(order::list::<B>());
    v.extend(errors::list::<B>());
    v.extend(aio::list::<B>());
    v.extend(srq::list::<B>());
    v.extend(uc::list::<B>());
    v.extend(ud::list::<B>());
    v.extend(mcast::list::<B>());
    v.extend(events::list::<B>());
    v.extend(port::list::<B>());
    v.extend(remote::list::<B>());
    v.extend(profile::list::<B>());
    v
}

/// The server halves of the `remote` group, for a runner in `--serve` mode.
pub fn remote_halves<B: Backend>() -> crate::peer::Halves<B> {
    remote::halves::<B>
}
