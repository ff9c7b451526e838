//! How kv-rpc's `wr_id`s name what completed: a receive or a send, its connection, its
//! slot.

/// wr_id layout: bit 63 set for receives, bit 62 for receives of the shared queue,
/// bits 32..62 the connection (0 for the shared queue's: which QP takes a receive is
/// known only from its completion), low 32 bits the slot.
pub(crate) const RECV_BIT: u64 = 1 << 63;
pub(crate) const SRQ_BIT: u64 = 1 << 62;

pub(crate) fn wr_id(recv: bool, conn: usize, slot: u32) -> u64 {
    (if recv { RECV_BIT } else { 0 }) | ((conn as u64) << 32) | slot as u64
}

pub(crate) fn srq_wr_id(slot: u32) -> u64 {
    RECV_BIT | SRQ_BIT | slot as u64
}

pub(crate) fn split_wr_id(id: u64) -> (bool, usize, u32) {
    (
        id & RECV_BIT != 0,
        ((id & !(RECV_BIT | SRQ_BIT)) >> 32) as usize,
        id as u32,
    )
}
