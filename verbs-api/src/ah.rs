//! The address handle (`struct ibv_ah`, `man ibv_create_ah`) as a trait: a send work
//! request names one by reference, so the trait sits below the work requests; the public
//! path is [`crate::traits::AddressHandle`].

use crate::qp::AhAttr;

/// An address handle (`struct ibv_ah`): where a UD send goes. A send WR names it by
/// reference ([`SendWr::ud`](crate::SendWr::ud)), so a backend recognises its own handles
/// (the trait is `Any`) and refuses another backend's with EINVAL.
pub trait AddressHandle: std::any::Any + Send + Sync {
    /// The attributes it was created with.
    fn attr(&self) -> AhAttr;
}
