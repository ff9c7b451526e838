//! The state of a device's port (`man ibv_query_port`: `state`, `phys_state`; IBA 7.2 and
//! 14.2.5.6): active, or down as a cable pulled or a netdev taken down leaves it. Fault
//! injection moves it ([`Faults::port_down`](crate::faults::Faults::port_down)); what a
//! port that is down does to traffic is the device's (`DeviceShared::set_port`): no
//! connection or link is set up, served or kept, and what would be sent is lost (or, on
//! rxe, fails: `Switches::port_down_fails_sends`). C programs schedule the fault with
//! [`SCHEDULE_SETTING`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use verbs_api::PortState;

/// `IB_PORT_PHYS_STATE_LINK_UP`: what `phys_state` reads while the port is active.
pub const PHYS_LINK_UP: u8 = 5;
/// `IB_PORT_PHYS_STATE_DISABLED`: what it reads while the port is down (rxe0 reads it
/// with its netdev down).
pub const PHYS_DISABLED: u8 = 3;

/// One port's state.
#[derive(Debug, Default)]
pub struct Port {
    /// How many times the state changed: even while the port is up, odd while it is
    /// down. A setup that reads it when it checks the port can tell at its end whether
    /// the port went down meanwhile, even if it is back ([`Port::up_since`]).
    changes: AtomicU64,
}

impl Port {
    /// Whether the port is active (up).
    pub fn is_up(&self) -> bool {
        self.changes.load(Ordering::Acquire) % 2 == 0
    }

    /// The port's state now, for [`Port::up_since`].
    pub fn epoch(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    /// Whether the port was up at `epoch` and has not gone down since (a connection or
    /// link set up meanwhile may carry traffic: what the port's going down closed cannot
    /// have included it, nor may what was sent to the port while it was down arrive on
    /// it).
    pub fn up_since(&self, epoch: u64) -> bool {
        epoch % 2 == 0 && self.changes.load(Ordering::Acquire) == epoch
    }

    /// Moves the port up (`true`) or down; whether that changed its state.
    pub fn set_up(&self, up: bool) -> bool {
        self.changes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n % 2 == u64::from(up)).then_some(n + 1)
            })
            .is_ok()
    }

    /// `state` and `phys_state` as `ibv_query_port` reports them.
    pub fn states(&self) -> (PortState, u8) {
        if self.is_up() {
            (PortState::Active, PHYS_LINK_UP)
        } else {
            (PortState::Down, PHYS_DISABLED)
        }
    }
}

/// The environment variable that schedules a port fault for C programs (which have no
/// [`Faults`](crate::faults::Faults) handle): `AFTER[:FOR]` in milliseconds, the port of
/// every device the process opens goes down `AFTER` ms after the device opens, and up
/// again `FOR` ms later (down for good without `:FOR`).
pub const SCHEDULE_SETTING: &str = "RDMA_SIM_PORT_DOWN";

/// When a port goes down and for how long ([`SCHEDULE_SETTING`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// From the device's opening to the port going down.
    pub after: Duration,
    /// How long it stays down (`None`: until the device closes).
    pub down_for: Option<Duration>,
}

impl std::str::FromStr for Schedule {
    type Err = String;

    fn from_str(v: &str) -> Result<Self, String> {
        let ms = |s: &str| {
            s.trim()
                .parse::<u64>()
                .map(Duration::from_millis)
                .map_err(|_| format!("{v:?}: expected AFTER[:FOR], both in milliseconds (e.g. 500:2000)"))
        };
        let (after, down_for) = match v.split_once(':') {
            Some((a, f)) => (ms(a)?, Some(ms(f)?)),
            None => (ms(v)?, None),
        };
        Ok(Schedule { after, down_for })
    }
}

/// The schedule [`SCHEDULE_SETTING`] asks for (unset or empty: none).
pub fn schedule_from_env() -> verbs_api::Result<Option<Schedule>> {
    schedule_from(SCHEDULE_SETTING)
}

/// The schedule the environment variable `setting` asks for (unset or empty: none).
pub fn schedule_from(setting: &'static str) -> verbs_api::Result<Option<Schedule>> {
    match std::env::var(setting) {
        Ok(v) if !v.trim().is_empty() => v
            .parse()
            .map(Some)
            .map_err(|e: String| verbs_api::Error::invalid(setting, e)),
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schedule_is_after_and_for_in_milliseconds() {
        assert_eq!(
            "500:2000".parse(),
            Ok(Schedule {
                after: Duration::from_millis(500),
                down_for: Some(Duration::from_millis(2000))
            })
        );
        assert_eq!(
            "10".parse(),
            Ok(Schedule {
                after: Duration::from_millis(10),
                down_for: None
            })
        );
        for bad in ["", "x", "1:", ":1", "1:2:3", "-1"] {
            let e = bad.parse::<Schedule>().unwrap_err();
            assert!(e.contains("AFTER[:FOR]"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_port_says_whether_it_changed() {
        let p = Port::default();
        assert!(p.is_up());
        assert!(!p.set_up(true));
        assert!(p.set_up(false));
        assert_eq!(p.states(), (PortState::Down, PHYS_DISABLED));
        assert!(!p.set_up(false));
        assert!(p.set_up(true));
        assert_eq!(p.states(), (PortState::Active, PHYS_LINK_UP));
    }

    #[test]
    fn a_port_that_went_down_and_back_is_not_up_since_before() {
        let p = Port::default();
        let e = p.epoch();
        assert!(p.up_since(e));
        assert!(!p.set_up(true));
        assert!(p.up_since(e), "a port already up did not change");
        p.set_up(false);
        let down = p.epoch();
        assert!(!p.up_since(e) && !p.up_since(down));
        p.set_up(true);
        assert!(p.is_up());
        assert!(!p.up_since(e), "it went down since");
        assert!(p.up_since(p.epoch()));
    }
}
