//! What the deterministic backend cannot run is refused with what to change, never a
//! hang: a verb from another thread, a poll loop waiting for a completion nothing will
//! produce, a blocking wait with nothing left to happen, UD.

mod common;

use std::time::Duration;

use backend_sim_det::Det;
use verbs_api::{
    poll_n, Backend, CompletionChannel, CompletionQueue, Context, Error, ProtectionDomain, QpCap, QpInitAttr,
    QpType,
};

fn world() -> Det {
    Det::builder().hosts(["client", "server"]).seed(3).build()
}

fn refusal(e: &Error) -> &str {
    match e {
        Error::Unsupported { backend: "det", what } => what,
        other => panic!("not the det backend's refusal: {other}"),
    }
}

#[test]
fn another_thread_is_refused() {
    let det = world();
    let ctx = det.open("client").unwrap();
    let e = std::thread::spawn(move || ctx.alloc_pd().err()).join().unwrap();
    assert!(refusal(&e.expect("refused")).contains("single-threaded"));
}

#[test]
fn polling_for_a_completion_nothing_will_produce_fails_instead_of_hanging() {
    let det = world();
    let client = common::side(&det, "client").unwrap();
    let server = common::side(&det, "server").unwrap();
    common::connect(&client, &server).unwrap();
    // The server waits for a SEND the client never posts.
    let e = poll_n(&server.cq, 1, Duration::from_secs(600)).unwrap_err();
    let why = refusal(&e);
    assert!(
        why.contains("nothing left to happen") && why.contains("Post the work"),
        "{why}"
    );
}

#[test]
fn a_blocking_wait_with_nothing_to_happen_is_refused_and_a_timed_one_passes_virtual_time() {
    let det = world();
    let ctx = det.open("server").unwrap();
    let ch = ctx.create_comp_channel().unwrap();
    let cq = ctx.create_cq(16, Some(&ch)).unwrap();
    cq.req_notify(false).unwrap();
    assert!(refusal(&ch.get_cq_event(None).unwrap_err()).contains("wait forever"));
    let before = det.now();
    assert_eq!(ch.get_cq_event(Some(Duration::from_secs(5))).unwrap(), None);
    assert_eq!(det.now() - before, Duration::from_secs(5));
    assert!(refusal(&ctx.get_async_event(None).unwrap_err()).contains("wait forever"));
}

#[test]
fn ud_is_refused() {
    let det = world();
    let ctx = det.open("client").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None).unwrap();
    let attr = QpInitAttr::new(QpType::Ud, &cq, &cq, QpCap::default());
    assert!(refusal(&pd.create_qp(&attr).err().unwrap()).contains("UD"));
}
