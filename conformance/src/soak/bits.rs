//! A bitmap that proves "each value once": the old values FETCH_AND_ADD returns and the
//! shared CMP_AND_SWP word's hits are set in one, and a bit set twice is a failure.

/// A bitmap, allocated and touched up front.
pub(super) struct Bits(Vec<u64>);

impl Bits {
    /// Room for bits `0..n`.
    pub(super) fn new(n: u64) -> Bits {
        let mut v = vec![0u64; n.div_ceil(64) as usize + 1];
        // Touch every page now (a zeroed allocation is mapped lazily).
        for w in v.iter_mut() {
            *w = std::hint::black_box(0);
        }
        Bits(v)
    }
    /// How many bits it holds.
    pub(super) fn capacity(&self) -> u64 {
        (self.0.len() as u64 - 1) * 64
    }
    /// Sets bit `i`; false if it was set already.
    pub(super) fn set(&mut self, i: u64) -> bool {
        let (w, b) = ((i / 64) as usize, 1u64 << (i % 64));
        let was = self.0[w] & b != 0;
        self.0[w] |= b;
        !was
    }
    /// Whether bits `0..n` are all set.
    pub(super) fn all_set_below(&self, n: u64) -> bool {
        (0..n).all(|i| self.0[(i / 64) as usize] & (1 << (i % 64)) != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_detect_twice() {
        let mut b = Bits::new(100);
        assert!(b.set(5));
        assert!(!b.set(5));
        assert!(!b.all_set_below(6));
        for i in 0..5 {
            b.set(i);
        }
        assert!(b.all_set_below(6));
    }
}
