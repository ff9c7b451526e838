//! Two sequences of rows side by side: repeats folded (a run of equal rows, or of a
//! block of a few rows such as a request and its RNR NAK, into one with a count), then
//! the folded blocks aligned by their longest common subsequence, so that a packet one
//! device sends and the other does not shows as a gap rather than shifting every row
//! after it.

/// A block of rows and how many times it came in a row.
pub type Run = (Vec<String>, usize);

/// The longest block [`fold`] looks for.
const MAX_BLOCK: usize = 4;

/// `rows` with each repeat of a block of up to [`MAX_BLOCK`] rows folded into one: at
/// each row, the block length whose repeats cover the most rows (the shortest of equals).
pub fn fold(rows: &[String]) -> Vec<Run> {
    let mut out: Vec<Run> = Vec::new();
    let mut i = 0;
    while i < rows.len() {
        let mut best = (1, 1);
        for k in 1..=MAX_BLOCK.min(rows.len() - i) {
            let block = &rows[i..i + k];
            let mut n = 1;
            while rows.get(i + n * k..i + (n + 1) * k) == Some(block) {
                n += 1;
            }
            if n > 1 && n * k > best.0 * best.1 {
                best = (k, n);
            }
        }
        let (k, n) = best;
        out.push((rows[i..i + k].to_vec(), n));
        i += k * n;
    }
    out
}

/// One line of the side-by-side view.
#[derive(Debug, PartialEq, Eq)]
pub enum Line<'a> {
    /// The same row on both sides, the same number of times.
    Same(&'a Run),
    /// The same row, a different number of times.
    Count(&'a Run, &'a Run),
    /// Rows that differ: one side's, the other's, or both (a row replaced).
    Differ(Option<&'a Run>, Option<&'a Run>),
}

impl Line<'_> {
    /// Whether the line shows a difference.
    pub fn differs(&self) -> bool {
        !matches!(self, Line::Same(_))
    }
}

/// Above this many cells the alignment pairs rows by position instead.
const MAX_CELLS: usize = 20_000_000;

/// `a` and `b` aligned.
pub fn align<'a>(a: &'a [Run], b: &'a [Run]) -> Vec<Line<'a>> {
    let (n, m) = (a.len(), b.len());
    let mut pairs = Vec::new();
    if n * m <= MAX_CELLS {
        // lcs[i][j]: the longest common subsequence of a[i..] and b[j..], by row text.
        let w = m + 1;
        let mut lcs = vec![0u32; (n + 1) * w];
        for i in (0..n).rev() {
            for j in (0..m).rev() {
                lcs[i * w + j] = if a[i].0 == b[j].0 {
                    lcs[(i + 1) * w + j + 1] + 1
                } else {
                    lcs[(i + 1) * w + j].max(lcs[i * w + j + 1])
                };
            }
        }
        let (mut i, mut j) = (0, 0);
        while i < n && j < m {
            if a[i].0 == b[j].0 {
                pairs.push((i, j));
                i += 1;
                j += 1;
            } else if lcs[(i + 1) * w + j] >= lcs[i * w + j + 1] {
                i += 1;
            } else {
                j += 1;
            }
        }
    } else {
        pairs.extend((0..n.min(m)).filter(|&k| a[k].0 == b[k].0).map(|k| (k, k)));
    }
    let mut out = Vec::new();
    let (mut i, mut j) = (0, 0);
    for (pi, pj) in pairs.into_iter().chain(std::iter::once((n, m))) {
        // The rows between two matches: paired up as replaced, the rest one-sided.
        let (ga, gb) = (&a[i..pi], &b[j..pj]);
        for k in 0..ga.len().max(gb.len()) {
            out.push(Line::Differ(ga.get(k), gb.get(k)));
        }
        if pi < n && pj < m {
            out.push(if a[pi].1 == b[pj].1 {
                Line::Same(&a[pi])
            } else {
                Line::Count(&a[pi], &b[pj])
            });
        }
        (i, j) = (pi + 1, pj + 1);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(s: &[&str]) -> Vec<String> {
        s.iter().map(|r| r.to_string()).collect()
    }

    #[test]
    fn runs_fold() {
        let f = fold(&rows(&["a", "a", "b", "a"]));
        assert_eq!(f, vec![(rows(&["a"]), 2), (rows(&["b"]), 1), (rows(&["a"]), 1)]);
    }

    #[test]
    fn repeated_blocks_fold() {
        let f = fold(&rows(&["s", "rnr", "s", "rnr", "s", "rnr", "s", "ack"]));
        assert_eq!(
            f,
            vec![(rows(&["s", "rnr"]), 3), (rows(&["s"]), 1), (rows(&["ack"]), 1)]
        );
    }

    #[test]
    fn a_missing_row_is_a_gap_not_a_shift() {
        let a = fold(&rows(&["req", "ack", "req2", "ack2"]));
        let b = fold(&rows(&["req", "req2", "ack2"]));
        let l = align(&a, &b);
        assert_eq!(l.len(), 4);
        assert_eq!(l[0], Line::Same(&a[0]));
        assert_eq!(l[1], Line::Differ(Some(&a[1]), None));
        assert_eq!(l[2], Line::Same(&a[2]));
        assert_eq!(l[3], Line::Same(&a[3]));
    }

    #[test]
    fn counts_and_replacements_differ() {
        let a = fold(&rows(&["x", "x", "y", "z"]));
        let b = fold(&rows(&["x", "w", "z"]));
        let l = align(&a, &b);
        assert_eq!(l[0], Line::Count(&a[0], &b[0]));
        assert_eq!(l[1], Line::Differ(Some(&a[1]), Some(&b[1])));
        assert_eq!(l[2], Line::Same(&a[2]));
        assert_eq!(l.iter().filter(|l| l.differs()).count(), 2);
    }
}
