//! One thread per connection: a client or reader process runs each of its QPs on a thread
//! of its own ([`on_threads`]) and gathers their reports.

use crate::Res;

/// Runs `work(0)` .. `work(n - 1)` on `n` threads at once and returns their results in
/// that order, or the first error (a thread that panicked: "`what` thread panicked").
pub fn on_threads<T: Send>(n: u32, what: &str, work: impl Fn(u32) -> Res<T> + Sync) -> Res<Vec<T>> {
    let work = &work;
    let results: Vec<Res<T>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n).map(|i| s.spawn(move || work(i))).collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("{what} thread panicked")))
            })
            .collect()
    });
    results.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_come_in_order_and_the_first_error_wins() {
        assert_eq!(on_threads(4, "t", |i| Ok(i * 10)).unwrap(), [0, 10, 20, 30]);
        let e = on_threads(3, "t", |i| if i == 0 { Ok(()) } else { anyhow::bail!("no {i}") }).unwrap_err();
        assert_eq!(e.to_string(), "no 1");
        let e = on_threads(2, "worker", |i| if i == 1 { panic!("boom") } else { Ok(()) }).unwrap_err();
        assert_eq!(e.to_string(), "worker thread panicked");
    }
}
