//! The QP state machine of `ibv_modify_qp`: which transitions exist and which attributes
//! each one requires and accepts (InfiniBand Architecture Specification vol. 1, chapter
//! 10.3 "QP state transitions"; `man ibv_modify_qp`, section "RC QP").
//!
//! [`check_modify`] is the one place that decides whether a modify call is well formed:
//! the simulated HCA enforces it, and the libibverbs backend uses it to explain an
//! `EINVAL` from the kernel in words (current state, requested state, which attributes
//! are missing or not allowed).

use crate::error::{Error, Result};
use crate::flags::QpAttrMask as M;
use crate::qp::{QpAttr, QpState, QpType};

/// The `(required, optional)` attribute sets of the transition `cur -> next` for a QP of
/// type `qp_type`, or `None` when the state machine has no such transition. `STATE` itself
/// is not part of either set.
pub fn transition_masks(cur: QpState, next: QpState, qp_type: QpType) -> Option<(M, M)> {
    use QpState::*;
    let none = M::empty();
    // Any state may be moved to RESET or ERR, with nothing but the state.
    if next == Reset || next == Err {
        return Some((none, none));
    }
    let connected = matches!(qp_type, QpType::Rc | QpType::Uc);
    let rc = qp_type == QpType::Rc;
    // Attributes that only RC has (reads and atomics, RNR, transport retries).
    let rc_only = |m: M| if rc { m } else { none };
    Some(match (cur, next) {
        (Reset, Init) => {
            if connected {
                (M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS, none)
            } else {
                (M::PKEY_INDEX | M::PORT | M::QKEY, none)
            }
        }
        (Init, Init) => {
            if connected {
                (none, M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS)
            } else {
                (none, M::PKEY_INDEX | M::PORT | M::QKEY)
            }
        }
        (Init, Rtr) => {
            if connected {
                (
                    M::AV
                        | M::PATH_MTU
                        | M::DEST_QPN
                        | M::RQ_PSN
                        | rc_only(M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER),
                    M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX,
                )
            } else {
                (none, M::PKEY_INDEX | M::QKEY)
            }
        }
        (Rtr, Rts) => {
            if connected {
                (
                    M::SQ_PSN | rc_only(M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC),
                    M::CUR_STATE
                        | M::ALT_PATH
                        | M::ACCESS_FLAGS
                        | M::PATH_MIG_STATE
                        | rc_only(M::MIN_RNR_TIMER),
                )
            } else {
                (M::SQ_PSN, M::CUR_STATE | M::QKEY)
            }
        }
        (Rts, Rts) | (Sqd, Rts) => {
            if connected {
                (
                    none,
                    M::CUR_STATE
                        | M::ACCESS_FLAGS
                        | M::ALT_PATH
                        | M::PATH_MIG_STATE
                        | rc_only(M::MIN_RNR_TIMER),
                )
            } else {
                (none, M::CUR_STATE | M::QKEY)
            }
        }
        (Rts, Sqd) => (none, M::EN_SQD_ASYNC_NOTIFY),
        (Sqd, Sqd) => {
            if connected {
                (
                    none,
                    rc_only(M::PORT)
                        | M::AV
                        | M::ALT_PATH
                        | M::ACCESS_FLAGS
                        | M::PKEY_INDEX
                        | M::PATH_MIG_STATE
                        | rc_only(
                            M::TIMEOUT
                                | M::RETRY_CNT
                                | M::RNR_RETRY
                                | M::MAX_QP_RD_ATOMIC
                                | M::MAX_DEST_RD_ATOMIC
                                | M::MIN_RNR_TIMER,
                        ),
                )
            } else {
                (none, M::PKEY_INDEX | M::QKEY)
            }
        }
        // SQE exists on the unreliable transports only.
        (Sqe, Rts) if qp_type == QpType::Uc => (none, M::CUR_STATE | M::ACCESS_FLAGS),
        (Sqe, Rts) if qp_type == QpType::Ud => (none, M::CUR_STATE | M::QKEY),
        _ => return None,
    })
}

/// Checks a modify call against the state machine: the transition must exist, the mask
/// must hold every required attribute and nothing the transition does not accept, and
/// `IBV_QP_CUR_STATE` (if given) must name the state the QP is in. Returns the state the
/// QP will be in afterwards.
pub fn check_modify(cur: QpState, qp_type: QpType, attr: &QpAttr, mask: M) -> Result<QpState> {
    let next = if mask.contains(M::STATE) {
        attr.qp_state
    } else {
        cur
    };
    let (required, optional) = transition_masks(cur, next, qp_type).ok_or(Error::InvalidTransition {
        current: cur,
        requested: next,
    })?;
    let given = mask - M::STATE;
    let missing = required - given;
    let not_allowed = given - required - optional;
    if !missing.is_empty() || !not_allowed.is_empty() {
        return Err(Error::InvalidAttrMask {
            current: cur,
            requested: next,
            missing,
            not_allowed,
        });
    }
    if mask.contains(M::CUR_STATE) && attr.cur_qp_state != cur {
        return Err(Error::InvalidAttr {
            name: "cur_qp_state",
            reason: format!("says {:?} but the QP is in {:?}", attr.cur_qp_state, cur),
        });
    }
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const STATES: [QpState; 7] = [
        QpState::Reset,
        QpState::Init,
        QpState::Rtr,
        QpState::Rts,
        QpState::Sqd,
        QpState::Sqe,
        QpState::Err,
    ];

    fn attr(state: QpState) -> QpAttr {
        QpAttr {
            qp_state: state,
            ..Default::default()
        }
    }

    #[test]
    fn rc_bring_up_masks() {
        let init = M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS;
        assert_eq!(
            check_modify(QpState::Reset, QpType::Rc, &attr(QpState::Init), init).unwrap(),
            QpState::Init
        );
        let rtr = M::STATE
            | M::AV
            | M::PATH_MTU
            | M::DEST_QPN
            | M::RQ_PSN
            | M::MAX_DEST_RD_ATOMIC
            | M::MIN_RNR_TIMER;
        assert_eq!(
            check_modify(QpState::Init, QpType::Rc, &attr(QpState::Rtr), rtr).unwrap(),
            QpState::Rtr
        );
        let rts = M::STATE | M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC;
        assert_eq!(
            check_modify(QpState::Rtr, QpType::Rc, &attr(QpState::Rts), rts).unwrap(),
            QpState::Rts
        );
    }

    /// UD and UC follow the kernel's `qp_state_table` (drivers/infiniband/core/verbs.c),
    /// which `ib_modify_qp_is_ok` enforces for every provider.
    #[test]
    fn ud_and_uc_masks_follow_the_kernel_table() {
        use QpState::*;
        let t = |c, n, ty| transition_masks(c, n, ty).unwrap();
        assert_eq!(
            t(Reset, Init, QpType::Ud),
            (M::PKEY_INDEX | M::PORT | M::QKEY, M::empty())
        );
        assert_eq!(t(Init, Rtr, QpType::Ud), (M::empty(), M::PKEY_INDEX | M::QKEY));
        assert_eq!(t(Rtr, Rts, QpType::Ud), (M::SQ_PSN, M::CUR_STATE | M::QKEY));
        assert_eq!(t(Sqd, Sqd, QpType::Ud), (M::empty(), M::PKEY_INDEX | M::QKEY));
        assert_eq!(t(Sqe, Rts, QpType::Ud), (M::empty(), M::CUR_STATE | M::QKEY));
        assert_eq!(
            t(Reset, Init, QpType::Uc),
            (M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS, M::empty())
        );
        assert_eq!(
            t(Init, Rtr, QpType::Uc),
            (
                M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN,
                M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX
            )
        );
        assert_eq!(
            t(Rtr, Rts, QpType::Uc),
            (
                M::SQ_PSN,
                M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::PATH_MIG_STATE
            )
        );
        assert_eq!(
            t(Sqd, Sqd, QpType::Uc),
            (
                M::empty(),
                M::AV | M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX | M::PATH_MIG_STATE
            )
        );
        assert_eq!(
            t(Sqe, Rts, QpType::Uc),
            (M::empty(), M::CUR_STATE | M::ACCESS_FLAGS)
        );
        assert!(t(Sqd, Sqd, QpType::Rc).1.contains(M::PORT));
        assert_eq!(transition_masks(Sqe, Rts, QpType::Rc), None);
    }

    #[test]
    fn missing_attribute_is_named() {
        let e = check_modify(
            QpState::Reset,
            QpType::Rc,
            &attr(QpState::Init),
            M::STATE | M::PORT,
        )
        .unwrap_err();
        match e {
            Error::InvalidAttrMask {
                missing, not_allowed, ..
            } => {
                assert_eq!(missing, M::PKEY_INDEX | M::ACCESS_FLAGS);
                assert!(not_allowed.is_empty());
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn reset_to_rts_is_not_a_transition() {
        let e = check_modify(QpState::Reset, QpType::Rc, &attr(QpState::Rts), M::STATE).unwrap_err();
        assert!(matches!(
            e,
            Error::InvalidTransition {
                current: QpState::Reset,
                requested: QpState::Rts
            }
        ));
        assert!(e.to_string().contains("Reset") && e.to_string().contains("Rts"));
    }

    #[test]
    fn rtr_to_rtr_does_not_exist() {
        // modifying attributes in RTR is not a transition the spec has
        assert!(check_modify(QpState::Rtr, QpType::Rc, &attr(QpState::Rtr), M::MIN_RNR_TIMER).is_err());
    }

    proptest! {
        /// Every state may go to RESET and to ERR with the state alone, and nothing else in
        /// the mask.
        #[test]
        fn reset_and_err_reachable_from_anywhere(i in 0usize..7, extra in 1u32..(1 << 21)) {
            let cur = STATES[i];
            for next in [QpState::Reset, QpState::Err] {
                prop_assert_eq!(check_modify(cur, QpType::Rc, &attr(next), M::STATE).unwrap(), next);
                let extra = M::from_bits_truncate(extra) - M::STATE;
                if !extra.is_empty() {
                    prop_assert!(check_modify(cur, QpType::Rc, &attr(next), M::STATE | extra).is_err());
                }
            }
        }

        /// A mask is accepted exactly when it holds the required set and stays inside
        /// required | optional.
        #[test]
        fn accepted_iff_required_subset_and_no_extra(i in 0usize..7, j in 0usize..7, bits in 0u32..(1 << 21)) {
            let (cur, next) = (STATES[i], STATES[j]);
            let mask = (M::from_bits_truncate(bits) - M::CUR_STATE) | M::STATE;
            let r = check_modify(cur, QpType::Rc, &attr(next), mask);
            match transition_masks(cur, next, QpType::Rc) {
                None => {
                    let is_transition_err = matches!(r, Err(Error::InvalidTransition { .. }));
                    prop_assert!(is_transition_err);
                }
                Some((req, opt)) => {
                    let given = mask - M::STATE;
                    let ok = given.contains(req) && (given - req - opt).is_empty();
                    prop_assert_eq!(r.is_ok(), ok);
                }
            }
        }
    }
}
