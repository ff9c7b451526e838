//! RNR retries counted over the fabric: a SEND to a responder that never posts a receive
//! is NAKed RNR once for its first attempt and once for each of `rnr_retry` retries, then
//! fails with RNR_RETRY_EXC_ERR (IBA 9.7.5.2.8), whatever frames the network lost on the
//! way (a lost SEND or NAK costs a timeout and a resend, not an RNR retry).

use std::time::Duration;

use verbs_api::{SendWr, WcStatus};

use super::workload::{region, sge};
use super::{Attrs, Dir, Fabric, FaultMix};
use crate::wire::{Frame, NakCode};

/// The `rnr_retry` of the check (finite: 7 retries for ever).
const RNR_RETRY: u8 = 3;

/// Runs one unanswerable SEND under `seed` and `mix`; why the RNR count was wrong, if it
/// was.
pub(super) fn rnr_retries_counted(seed: u64, mix: FaultMix) -> Result<(), String> {
    let attrs = Attrs {
        rnr_retry: RNR_RETRY,
        ..Attrs::default()
    };
    let mut f = Fabric::new(seed, mix, attrs);
    f.record();
    let src = region(&mut f, false, 64);
    f.a.post(&SendWr::send(1, &[sge(&src, 0, 8)]).signaled())
        .map_err(|e| format!("seed {seed}: post: {e:?}"))?;
    f.run_until(Duration::from_secs(10), 100_000);
    if let Some(b) = f.broken() {
        return Err(format!("seed {seed}: {b:?}"));
    }
    let st: Vec<_> = f.a.send_wc.iter().map(|w| w.status).collect();
    // Each RNR NAK that reached A: every one but the last costs a retry.
    let naks = f
        .recorded()
        .iter()
        .filter(|(d, fr, lost)| {
            *d == Dir::BtoA
                && !*lost
                && matches!(
                    fr,
                    Frame::Nak {
                        code: NakCode::Rnr { .. },
                        ..
                    }
                )
        })
        .count();
    if st != [WcStatus::RnrRetryExcErr] || naks != usize::from(RNR_RETRY) + 1 {
        return Err(format!(
            "seed {seed}: rnr_retry {RNR_RETRY}: completions {st:?} after {naks} RNR NAKs \
             reached the requester (the first attempt and {RNR_RETRY} retries: {})",
            RNR_RETRY + 1
        ));
    }
    Ok(())
}

/// The mix the check runs under: frames lost, none duplicated (a duplicate RNR NAK
/// reaching A during its RNR wait would be counted here, yet not by A).
pub(super) fn mix() -> FaultMix {
    FaultMix::lossy(10, 0)
}

#[test]
fn each_rnr_nak_but_the_last_is_one_retry() {
    for seed in 0..24 {
        rnr_retries_counted(seed, mix()).unwrap_or_else(|v| panic!("{v}"));
    }
    rnr_retries_counted(0, FaultMix::clean(Duration::from_micros(2))).unwrap();
}
