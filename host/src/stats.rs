//! Order statistics of a sample of timings: its median, and a confidence interval for the
//! median that assumes nothing of the distribution. Both take the sample sorted
//! ([`f64::total_cmp`]), so a caller that wants several sorts once.

/// The median of `sorted` (the mean of the middle two of an even count); 0 when empty.
pub fn median(sorted: &[f64]) -> f64 {
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// A 95% confidence interval for the median of the distribution `sorted` was drawn from:
/// the `j`-th smallest and the `j`-th largest value, `j` the largest rank for which fewer
/// than `j` of `n` values fall below the median with probability at most 2.5% (a fair
/// binomial's tail: each value is below it with probability one half; the sign test's
/// ranks). `None` under six values, where even the extremes cover less.
pub fn median_interval(sorted: &[f64]) -> Option<(f64, f64)> {
    let n = sorted.len();
    // P(B <= i) for B ~ Binomial(n, 1/2), term by term: C(n, i + 1) = C(n, i) (n - i) /
    // (i + 1), each term's logarithm kept (2^-n underflows past a thousand values).
    let mut log_term = -(n as f64) * std::f64::consts::LN_2;
    let mut below = 0.0;
    let mut rank = 0;
    for i in 0..n / 2 {
        below += log_term.exp();
        if 2.0 * below > 0.05 {
            break;
        }
        rank = i + 1;
        log_term += ((n - i) as f64 / (i + 1) as f64).ln();
    }
    (rank > 0).then(|| (sorted[rank - 1], sorted[n - rank]))
}

#[cfg(test)]
mod tests {
    use super::{median, median_interval};

    #[test]
    fn the_median_is_the_middle_value_or_the_mean_of_the_middle_two() {
        assert_eq!(median(&[1.0, 2.0, 3.0]), 2.0);
        assert_eq!(median(&[1.0, 2.0, 3.0, 4.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
    }

    #[test]
    fn the_median_interval_takes_the_ranks_of_the_binomial_table() {
        let ranks = |n: usize| median_interval(&(1..=n).map(|i| i as f64).collect::<Vec<_>>());
        // The published ranks: n = 6: 1 and 6 (96.9%); 10: 2 and 9 (97.9%); 40: 14 and 27.
        assert_eq!(ranks(6), Some((1.0, 6.0)));
        assert_eq!(ranks(10), Some((2.0, 9.0)));
        assert_eq!(ranks(40), Some((14.0, 27.0)));
        assert_eq!(ranks(5), None);
        assert_eq!(median_interval(&[]), None);
        // Past 2^-n's range (ranks from exact integer binomial sums: 1446 and 1555 of 3000).
        assert_eq!(ranks(3000), Some((1446.0, 1555.0)));
    }
}
