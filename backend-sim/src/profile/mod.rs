//! Device profiles: the sim plays a Soft-RoCE (`rxe`), a ConnectX (`mlx5`), or the
//! strictest HCA of the two (`portable`, the default).
//!
//! Real HCAs disagree in documented places, and code that works on one breaks on
//! another. A profile is the two things a device of one kind brings:
//!
//! - its attributes ([`attrs`]): the limits, vendor ids, atomic capability, inline size,
//!   MTU, message size and link layer that `ibv_query_device`/`ibv_query_port` report,
//!   which the sim also enforces (an Ethernet port is reached by GID alone:
//!   `addressing`);
//! - its behavioural switches ([`Switches`], defined in the protocol crate, which reads
//!   them): each choice where HCAs differ, one named field with its sources.
//!   [`switches::table`] lists them with their values under every profile.
//!
//! `portable` takes, for each resource and timing switch, the most restrictive choice
//! (a send slot freed only when its completion is polled, a QP's completions removed on
//! RESET and destroy, `retry_cnt` 7 as seven retries, the smaller limits) and for each
//! status and errno switch IBA's; where no single choice covers both HCAs, it also warns
//! (`tracing`) the first time an application relies on one ([`warnings`]).
//!
//! A profile is chosen per backend ([`SimConfig::profile`](crate::SimConfig)) or with
//! `RDMA_SIM_PROFILE=portable|rxe|mlx5` ([`SimBackend::from_env`](crate::SimBackend)).

use std::fmt;
use std::str::FromStr;

pub mod attrs;
pub mod switches;
pub mod warnings;

pub use attrs::Attrs;
pub use backend_sim_proto::switches::{RecvError, SlotRelease, Switches};

/// The kind of HCA a sim device plays.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Profile {
    /// The strictest of the HCAs below, with IBA's statuses and portability warnings.
    #[default]
    Portable,
    /// Soft-RoCE (`rdma_rxe`) of Linux 6.1 with rdma-core v44 (Debian bookworm's, the
    /// kernel the CI's rxe0 runs).
    Rxe,
    /// A ConnectX (mlx5) with rdma-core's mlx5 provider.
    Mlx5,
}

impl Profile {
    /// Every profile, in the order the docs list them.
    pub const ALL: [Profile; 3] = [Profile::Portable, Profile::Rxe, Profile::Mlx5];

    /// The name `RDMA_SIM_PROFILE` and `--profile` take.
    pub fn name(self) -> &'static str {
        match self {
            Profile::Portable => "portable",
            Profile::Rxe => "rxe",
            Profile::Mlx5 => "mlx5",
        }
    }

    /// The device and port attributes a device of this kind reports.
    pub fn attrs(self) -> Attrs {
        match self {
            Profile::Portable => Attrs::smaller(&Attrs::RXE, &Attrs::MLX5),
            Profile::Rxe => Attrs::RXE,
            Profile::Mlx5 => Attrs::MLX5,
        }
    }

    /// Its behavioural switches.
    pub fn switches(self) -> Switches {
        match self {
            Profile::Portable => Switches::PORTABLE,
            Profile::Rxe => Switches::RXE,
            Profile::Mlx5 => Switches::MLX5,
        }
    }

    /// Whether the portability warnings ([`warnings`]) are on: under `portable` only,
    /// whose purpose is to find what would behave differently on another HCA.
    pub fn warns(self) -> bool {
        self == Profile::Portable
    }
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An unknown profile name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownProfile(pub String);

impl fmt::Display for UnknownProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} is not a device profile: use portable (the default), rxe or mlx5",
            self.0
        )
    }
}

impl std::error::Error for UnknownProfile {}

impl FromStr for Profile {
    type Err = UnknownProfile;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Profile::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| UnknownProfile(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_say_what_is_known() {
        for p in Profile::ALL {
            assert_eq!(p.name().parse::<Profile>(), Ok(p));
        }
        assert_eq!("RXE".parse::<Profile>(), Ok(Profile::Rxe));
        let e = "cx7".parse::<Profile>().unwrap_err().to_string();
        assert!(
            e.contains("\"cx7\"") && e.contains("portable") && e.contains("mlx5"),
            "{e}"
        );
    }

    #[test]
    fn portable_limits_fit_both_hcas() {
        let p = Profile::Portable.attrs();
        for other in [Attrs::RXE, Attrs::MLX5] {
            assert!(p.max_qp_wr <= other.max_qp_wr && p.max_sge <= other.max_sge);
            assert!(p.max_cqe <= other.max_cqe && p.max_inline <= other.max_inline);
            assert!(p.max_srq_sge <= other.max_srq_sge && p.max_msg_sz <= other.max_msg_sz);
            assert!(p.max_qp_rd_atom <= other.max_qp_rd_atom);
            assert!((p.active_mtu as u32) <= other.active_mtu as u32);
            assert_eq!(p.page_size_cap & !other.page_size_cap, 0);
        }
    }
}
