//! 24-bit packet sequence number arithmetic (IBA 9.7.1: PSNs wrap modulo 2^24; a PSN is
//! "ahead" when it lies in the half window after another).

use verbs_api::PSN_MASK;

/// `a + n` modulo 2^24.
pub fn add(a: u32, n: u32) -> u32 {
    a.wrapping_add(n) & PSN_MASK
}

/// Signed distance `a - b` in the 24-bit ring, in `-2^23..2^23`.
pub fn diff(a: u32, b: u32) -> i32 {
    ((a.wrapping_sub(b) << 8) as i32) >> 8
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn wraps() {
        assert_eq!(add(PSN_MASK, 1), 0);
        assert_eq!(diff(0, PSN_MASK), 1);
        assert_eq!(diff(PSN_MASK, 0), -1);
        assert_eq!(diff(5, 5), 0);
    }

    proptest! {
        #[test]
        fn diff_inverts_add(a in 0u32..=PSN_MASK, n in 0u32..(1 << 23)) {
            prop_assert_eq!(diff(add(a, n), a), n as i32);
            prop_assert_eq!(diff(a, add(a, n)), -(n as i32));
        }
    }
}
