//! How many orders a worker offers to queue beyond its batch slots: as many as it expects to
//! start within `HORIZON`, judged by how long its recent runs held a slot, and never more than
//! `WORKER_PREFETCH`. A worker of quick tasks offers its whole queue, so every hop carries more
//! orders at once; a worker of long tasks offers none, so no order waits behind a long run while
//! another worker could take it (ARCHITECTURE, "A queue as deep as a short wait").

use std::time::Duration;

/// The longest a queued order is expected to wait for a slot.
pub const HORIZON: Duration = Duration::from_millis(100);

/// Places offered before any run has been measured (after a start): the queue a worker offered
/// before its offer followed its run times.
pub const UNMEASURED_PLACES: u32 = 2;

/// The weight of the latest run in the running mean: the offer follows a change of workload
/// within a few runs, and one odd run moves it only so far.
const LATEST_WEIGHT: f64 = 0.2;

/// The queue a worker offers, from the runs it has measured.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueDepth {
    /// `WORKER_PREFETCH`: the most it ever offers.
    most: u32,
    /// Its batch slots: the runs that turn over at once.
    slots: u32,
    /// The running mean of how long a batch task held its slot, in milliseconds; `None` before
    /// the first run.
    mean_ms: Option<f64>,
}

impl QueueDepth {
    /// Nothing measured yet.
    pub fn new(most: u32, slots: u32) -> QueueDepth {
        QueueDepth { most, slots, mean_ms: None }
    }

    /// A batch task held its slot for `took`.
    pub fn ran(&mut self, took: Duration) {
        let ms = took.as_secs_f64() * 1000.0;
        self.mean_ms = Some(match self.mean_ms {
            None => ms,
            Some(mean) => mean + LATEST_WEIGHT * (ms - mean),
        });
    }

    /// The places to offer now: the orders its slots are expected to start within `HORIZON`
    /// (slots × horizon ÷ mean run), at most `most`.
    pub fn places(&self) -> u32 {
        let Some(mean_ms) = self.mean_ms else { return self.most.min(UNMEASURED_PLACES) };
        let horizon_ms = HORIZON.as_secs_f64() * 1000.0;
        // A float cast saturates: a mean of zero offers `most`.
        let fit = (f64::from(self.slots.max(1)) * horizon_ms / mean_ms).floor() as u32;
        fit.min(self.most)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn after(most: u32, slots: u32, runs_ms: &[u64]) -> u32 {
        let mut depth = QueueDepth::new(most, slots);
        for &ms in runs_ms {
            depth.ran(Duration::from_millis(ms));
        }
        depth.places()
    }

    #[test]
    fn the_offer_follows_how_long_runs_hold_a_slot() {
        // (most, slots, runs in ms, places offered)
        let table: &[(u32, u32, &[u64], u32)] = &[
            // Nothing measured: the unmeasured offer, within `most`.
            (16, 2, &[], UNMEASURED_PLACES),
            (1, 1, &[], 1),
            (0, 2, &[], 0),
            // Quick runs: the whole queue.
            (16, 2, &[0], 16),
            (16, 2, &[1, 1, 2, 1], 16),
            (0, 2, &[1], 0),
            // 50 ms runs on two slots: four start within 100 ms.
            (16, 2, &[50], 4),
            // 100 ms on one slot: one.
            (16, 1, &[100], 1),
            // Longer than the horizon: none.
            (16, 2, &[250], 0),
            (16, 4, &[60_000], 0),
        ];
        for &(most, slots, runs, want) in table {
            assert_eq!(after(most, slots, runs), want, "most {most}, slots {slots}, runs {runs:?}");
        }
    }

    #[test]
    fn one_long_run_closes_the_queue_and_quick_runs_open_it_again() {
        let mut depth = QueueDepth::new(16, 2);
        depth.ran(Duration::from_millis(1));
        assert_eq!(depth.places(), 16);
        depth.ran(Duration::from_secs(30));
        assert_eq!(depth.places(), 0, "a 30 s run among quick ones: the mean is seconds");
        let mut quick_runs = 0;
        while depth.places() < 16 {
            depth.ran(Duration::from_millis(1));
            quick_runs += 1;
            assert!(quick_runs < 100, "{depth:?}");
        }
        // 6,000 ms × 0.8^n ≤ 12.5 ms: about 28 quick runs reopen the whole queue.
        assert!((20..40).contains(&quick_runs), "reopened after {quick_runs} quick runs");
    }
}
