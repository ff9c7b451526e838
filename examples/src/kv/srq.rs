//! The kv-rpc server's bookkeeping of its shared receive queue (`--srq`): which of the
//! pool's receive slots are posted, which were consumed and answered and wait for the
//! next refill, the limit it arms, and what the refills did ([`SrqPool`]).
//!
//! The server refills in batches when the SRQ's limit event fires
//! (`IBV_EVENT_SRQ_LIMIT_REACHED`): it posts every slot freed since the last refill with
//! one `post_srq_recv` and arms the limit again. Armed while the SRQ already holds fewer
//! receives than the limit, the event fires at the next receive taken, which is the next
//! chance to refill. An empty SRQ takes no receive, so no event would come: then the
//! limit is left unarmed ([`SrqPool::can_arm`]) and the next slots answered are posted
//! at once instead ([`SrqPool::must_post_now`]). The completions polled cannot tell
//! that the SRQ is not empty (receives taken are polled later), so the limit is armed
//! only right after a post put receives in it: an event that finds nothing freed to
//! post leaves it unarmed.

use std::time::Instant;

use super::report::DryQueue;

/// One SRQ's receive slots, `0..depth`.
#[derive(Debug)]
pub struct SrqPool {
    depth: u32,
    limit: u32,
    /// Receives posted (as far as the completions tell: the device's count is lower by
    /// those taken and not yet polled).
    posted: u32,
    /// Slots consumed and answered, to post at the next refill.
    free: Vec<u32>,
    /// Whether the limit is armed.
    armed: bool,
    /// Whether receives were posted since the last event: then the SRQ surely holds one
    /// to take, and an armed limit will fire.
    just_posted: bool,
    /// Limit events handled.
    pub events: u64,
    /// Refills (one `post_srq_recv` each), on an event or because the SRQ was empty.
    pub refills: u64,
    /// Of those, refills without an event (the SRQ was empty, so none could come).
    pub refills_unarmed: u64,
    /// Receives they posted.
    pub reposted: u64,
    /// The fewest receives posted after a completion.
    pub low_water: u32,
    /// The SRQ's empty spells.
    pub dry: DryQueue,
}

impl SrqPool {
    /// `depth` receives posted, the limit `limit` (at most `depth`) not yet armed.
    pub fn new(depth: u32, limit: u32) -> SrqPool {
        SrqPool {
            depth,
            limit: limit.min(depth),
            posted: depth,
            free: Vec::new(),
            armed: false,
            just_posted: depth > 0,
            events: 0,
            refills: 0,
            refills_unarmed: 0,
            reposted: 0,
            low_water: depth,
            dry: DryQueue::default(),
        }
    }

    /// The SRQ's size.
    pub fn depth(&self) -> u32 {
        self.depth
    }

    /// The limit asked for.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// A receive of the SRQ completed at `now`.
    pub fn taken(&mut self, now: Instant) {
        self.posted = self.posted.saturating_sub(1);
        self.low_water = self.low_water.min(self.posted);
        if self.posted == 0 {
            self.dry.ran_dry(now);
        }
    }

    /// Slots consumed and answered: posted again at the next refill.
    pub fn freed(&mut self, slots: impl IntoIterator<Item = u32>) {
        self.free.extend(slots);
    }

    /// The limit event fired (it disarmed the limit).
    pub fn event(&mut self) {
        self.events += 1;
        self.armed = false;
        self.just_posted = false;
    }

    /// Whether freed slots must be posted without waiting for an event: the limit is
    /// not armed (the SRQ was empty), so no event will come.
    pub fn must_post_now(&self) -> bool {
        !self.armed && !self.free.is_empty()
    }

    /// The slots to post in a refill (all the freed ones).
    pub fn take_batch(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.free)
    }

    /// `n` receives were posted at `now` by a refill (`on_event`: the limit event's).
    pub fn reposted(&mut self, n: u32, now: Instant, on_event: bool) {
        if n == 0 {
            return;
        }
        self.posted += n;
        self.just_posted = true;
        self.refills += 1;
        self.refills_unarmed += u64::from(!on_event);
        self.reposted += u64::from(n);
        self.dry.refilled(now);
    }

    /// Whether arming the limit now surely brings an event: only if some receive is
    /// in the SRQ to be taken, which is certain right after a post only (the receives
    /// the completions count as posted may have been taken already, unpolled).
    pub fn can_arm(&self) -> bool {
        self.just_posted
    }

    /// The limit was armed.
    pub fn armed(&mut self) {
        self.armed = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refill_posts_what_was_freed_and_the_limit_never_exceeds_what_is_posted() {
        let now = Instant::now();
        let mut p = SrqPool::new(8, 4);
        assert!(p.can_arm());
        p.armed();
        for _ in 0..5 {
            p.taken(now);
        }
        p.freed([0, 1, 2]);
        assert!(!p.must_post_now(), "armed: wait for the event");
        p.event();
        assert!(p.must_post_now());
        let batch = p.take_batch();
        assert_eq!(batch, [0, 1, 2]);
        p.reposted(batch.len() as u32, now, true);
        assert_eq!((p.posted, p.refills, p.reposted, p.low_water), (6, 1, 3, 3));
        assert!(p.can_arm());
        p.armed();
        // Everything taken and nothing freed: arming could bring no event.
        for _ in 0..6 {
            p.taken(now);
        }
        p.event();
        assert!(!p.can_arm());
        assert_eq!(p.dry.count(), 1);
        p.freed([5]);
        assert!(p.must_post_now());
        let batch = p.take_batch();
        p.reposted(batch.len() as u32, now, false);
        assert_eq!((p.refills, p.refills_unarmed), (2, 1));
        assert!(
            p.can_arm(),
            "below the limit, but the next receive taken fires the event"
        );
    }

    /// The event came before any slot was freed: the receives the completions count as
    /// posted may all be taken already, so arming again could bring no event while the
    /// freed slots wait for one.
    #[test]
    fn an_event_with_nothing_to_post_leaves_the_limit_unarmed() {
        let now = Instant::now();
        let mut p = SrqPool::new(8, 4);
        p.armed();
        for _ in 0..5 {
            p.taken(now);
        }
        p.event();
        assert!(p.take_batch().is_empty());
        p.reposted(0, now, true);
        assert!(!p.can_arm(), "3 receives counted, none surely left");
        p.freed([0, 1]);
        assert!(p.must_post_now(), "unarmed: what is freed is posted at once");
    }
}
