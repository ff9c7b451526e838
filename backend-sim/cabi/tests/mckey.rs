//! rdma-core's `mckey` (librdmacm's multicast example, this library preloaded) under the
//! portable (InfiniBand) and rxe (RoCE v2) profiles: a receiver joins a group through
//! `rdma_join_multicast_ex` (`JOIN_MCAST`), librdmacm attaches its QP with the event's
//! MGID and MLID, a sender in another process joins and sends its datagrams to the
//! group's address vector, the receiver takes all of them, and both leave
//! (`LEAVE_MCAST`).

mod common;

use std::io::{BufRead, BufReader};
use std::process::Command;
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(60);
const MESSAGES: &str = "10";

/// `mckey ARGS` preloaded under `profile`, its output line-buffered (stdbuf) so that the
/// receiver's "joined" line can be waited for.
fn mckey(profile: &str, args: &[&str]) -> Command {
    let mut all = vec!["-oL", "mckey"];
    all.extend_from_slice(args);
    let mut c = common::preloaded("stdbuf", &all);
    c.env("RDMA_SIM_PROFILE", profile);
    c
}

#[test]
fn mckey_receives_every_datagram_sent_to_its_group() {
    for (i, profile) in ["portable", "rxe"].into_iter().enumerate() {
        // A group of this test run alone (tests of other runs may use the host's view).
        let pid = std::process::id();
        let group = format!("239.{}.{}.{}", 64 + i, (pid >> 8) & 0xff, pid & 0xff);
        let args = ["-m", group.as_str(), "-b", "127.0.0.1", "-C", MESSAGES];
        let mut rx = mckey(profile, &args).spawn().expect("mckey");
        // Until the receiver has joined (its QP attached), the group has no member.
        let mut out = BufReader::new(rx.stdout.take().expect("stdout"));
        let deadline = Instant::now() + LIMIT;
        let mut seen = String::new();
        loop {
            let mut line = String::new();
            assert!(
                out.read_line(&mut line).expect("read") > 0,
                "{profile}: the receiver ended before it joined:\n{seen}"
            );
            seen.push_str(&line);
            if line.starts_with("mckey: joined dgid:") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{profile}: the receiver never joined:\n{seen}"
            );
        }
        let mut sender_args = args.to_vec();
        sender_args.push("-s");
        let sent = common::wait(mckey(profile, &sender_args).spawn().expect("mckey"), LIMIT);
        let sent_out = String::from_utf8_lossy(&sent.stdout);
        assert!(
            sent.status.success() && sent_out.contains("return status 0"),
            "{profile}: sender {}:\n{sent_out}\n{}",
            sent.status,
            String::from_utf8_lossy(&sent.stderr)
        );
        // The receiver ends once it has taken every datagram.
        let rest = std::thread::spawn(move || {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut out, &mut s).map(|_| s)
        });
        let got = common::wait(rx, LIMIT);
        let rest = rest.join().expect("reader").expect("read");
        assert!(
            got.status.success() && rest.contains("return status 0"),
            "{profile}: receiver {}:\n{seen}{rest}\n{}",
            got.status,
            String::from_utf8_lossy(&got.stderr)
        );
        if profile == "rxe" {
            // RoCE v2: the group's MGID is its address, IPv4-mapped.
            assert!(seen.contains(&format!("dgid: ::ffff:{group} mlid 0x0")), "{seen}");
        } else {
            // InfiniBand: IPoIB's mapping with rdma_cm's signature, and a multicast LID.
            assert!(seen.contains("dgid: ff12:4001:ffff::"), "{seen}");
            assert!(!seen.contains("mlid 0x0 "), "{seen}");
        }
    }
}
