//! Asynchronous events (`man ibv_get_async_event`) in the deterministic world: an event
//! of a QP goes to the context that made it, not to another context of the same device,
//! and SQ_DRAINED comes once the send queue of a QP moved to SQD has drained.

mod common;

use std::time::Duration;

use backend_sim_det::Det;
use verbs_api::{AsyncElement, AsyncEventType, Context, QpAttr, QpAttrMask as M, QpState, QueuePair};

#[test]
fn sq_drained_goes_to_the_context_that_made_the_qp() {
    let det = Det::builder().hosts(["client", "server"]).seed(9).build();
    let client = common::side(&det, "client").unwrap();
    let server = common::side(&det, "server").unwrap();
    common::connect(&client, &server).unwrap();
    // Another context of the client's device, which must not see the client QP's event.
    let other = verbs_api::Backend::open(&det, "client").unwrap();
    let sqd = QpAttr {
        qp_state: QpState::Sqd,
        en_sqd_async_notify: true,
        ..Default::default()
    };
    client.qp.modify(&sqd, M::STATE | M::EN_SQD_ASYNC_NOTIFY).unwrap();
    let wait = Some(Duration::from_millis(10));
    assert_eq!(other.get_async_event(wait).unwrap(), None);
    let e = client.ctx.get_async_event(wait).unwrap().expect("SQ_DRAINED");
    assert_eq!(
        (e.event_type, e.element),
        (AsyncEventType::SqDrained, AsyncElement::Qp(client.qp.qp_num()))
    );
    assert_eq!(client.ctx.get_async_event(wait).unwrap(), None, "raised once");
}
