//! The spread of a case run several times: the median of the per-run medians (which the
//! ratio against the reference uses) and their range, min–max, which the report shows beside it.

/// Per-run medians summarised.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spread {
    /// The median of the per-run medians (the mean of the middle two for an even count).
    pub median: f64,
    /// The smallest per-run median.
    pub min: f64,
    /// The largest per-run median.
    pub max: f64,
    /// The run whose median is the median (for an even count, the lower of the middle two): its
    /// percentiles stand for the row.
    pub middle: usize,
}

impl Spread {
    /// The spread of `runs`, each one run's median in seconds; `None` for no runs or a value
    /// that is not a finite time.
    pub fn of(runs: &[f64]) -> Option<Spread> {
        if runs.is_empty() || runs.iter().any(|r| !r.is_finite()) {
            return None;
        }
        let mut order: Vec<usize> = (0..runs.len()).collect();
        order.sort_by(|&a, &b| runs[a].total_cmp(&runs[b]).then(a.cmp(&b)));
        let n = order.len();
        let lower = order[(n - 1) / 2];
        let upper = order[n / 2];
        Some(Spread {
            median: (runs[lower] + runs[upper]) / 2.0,
            min: runs[order[0]],
            max: runs[order[n - 1]],
            middle: lower,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_of_three_runs_is_the_middle_one_and_the_range_spans_them() {
        let s = Spread::of(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!(s.median, 2.0);
        assert_eq!((s.min, s.max), (1.0, 3.0));
        assert_eq!(s.middle, 2, "the run at index 2 holds the median");
    }

    #[test]
    fn an_even_count_averages_the_middle_two_and_keeps_the_lower_run() {
        let s = Spread::of(&[4.0, 1.0, 3.0, 2.0]).unwrap();
        assert_eq!(s.median, 2.5);
        assert_eq!(s.middle, 3, "2.0, the lower of the middle two, is run 3");
        assert_eq!((s.min, s.max), (1.0, 4.0));
    }

    #[test]
    fn one_run_has_no_range_and_nothing_has_no_spread() {
        let s = Spread::of(&[0.5]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.middle), (0.5, 0.5, 0.5, 0));
        assert!(Spread::of(&[]).is_none());
        assert!(Spread::of(&[1.0, f64::NAN]).is_none());
    }

    #[test]
    fn equal_runs_pick_the_first_of_the_middle() {
        let s = Spread::of(&[2.0, 2.0, 2.0]).unwrap();
        assert_eq!(s.middle, 1);
        assert_eq!((s.min, s.max), (2.0, 2.0));
    }
}
