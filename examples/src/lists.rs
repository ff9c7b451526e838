//! Posting many work requests in one call, as one doorbell does on an HCA: each WR with
//! one scatter/gather entry into a registered region, given as (wr_id, offset, length).
//! A refill of many receives or a batch of SENDs is one `post_recv` (`post_srq_recv`) or
//! `post_send`.

use verbs_api::{MemoryRegion, QueuePair, RecvWr, SendWr, Sge, SharedReceiveQueue};

/// One single-SGE WR: its `wr_id` and the bytes `offset..offset + length` of the region.
pub type Item = (u64, usize, usize);

fn sges<M: MemoryRegion>(mr: &M, items: &[Item]) -> verbs_api::Result<Vec<[Sge; 1]>> {
    items
        .iter()
        .map(|&(_, off, len)| mr.sge(off, len).map(|g| [g]))
        .collect()
}

/// Posts a receive for each item with one `post_recv`.
pub fn post_recvs<Q: QueuePair, M: MemoryRegion>(qp: &Q, mr: &M, items: &[Item]) -> verbs_api::Result<()> {
    let sges = sges(mr, items)?;
    let wrs: Vec<RecvWr<'_>> = items
        .iter()
        .zip(&sges)
        .map(|(&(id, _, _), g)| RecvWr::new(id, g))
        .collect();
    Ok(qp.post_recv(&wrs)?)
}

/// Posts a receive for each item to a shared receive queue with one `post_srq_recv`.
pub fn post_srq_recvs<S: SharedReceiveQueue, M: MemoryRegion>(
    srq: &S,
    mr: &M,
    items: &[Item],
) -> verbs_api::Result<()> {
    let sges = sges(mr, items)?;
    let wrs: Vec<RecvWr<'_>> = items
        .iter()
        .zip(&sges)
        .map(|(&(id, _, _), g)| RecvWr::new(id, g))
        .collect();
    Ok(srq.post_recv(&wrs)?)
}

/// Posts a signaled SEND of each item with one `post_send`.
pub fn post_sends<Q: QueuePair, M: MemoryRegion>(qp: &Q, mr: &M, items: &[Item]) -> verbs_api::Result<()> {
    let sges = sges(mr, items)?;
    let wrs: Vec<SendWr<'_>> = items
        .iter()
        .zip(&sges)
        .map(|(&(id, _, _), g)| SendWr::send(id, g).signaled())
        .collect();
    Ok(qp.post_send(&wrs)?)
}
