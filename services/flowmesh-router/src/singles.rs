//! The single messages retention deletes by their sequence: events of purged workflows that came
//! after their record (a report a week late) and purge records made stale by a newer one.

use std::collections::VecDeque;

/// Sequences waiting to be deleted, oldest first. A round takes at most its share (`take`), and
/// what it could not delete comes back first for the next one (`give_back`): nothing noted is
/// dropped because a round was full or a deletion failed. Only the memory is bounded: `limit`
/// sequences (8 bytes each), past which a sequence is counted as `unnoted` and stays in the log.
#[derive(Debug)]
pub struct Singles {
    seqs: VecDeque<u64>,
    limit: usize,
    unnoted: u64,
}

/// A million sequences, 8 MiB: a fleet re-sending a week-old backlog of reports, many times over.
pub const LIMIT: usize = 1 << 20;

impl Default for Singles {
    fn default() -> Self {
        Singles::with_limit(LIMIT)
    }
}

impl Singles {
    pub fn with_limit(limit: usize) -> Self {
        Singles { seqs: VecDeque::new(), limit, unnoted: 0 }
    }

    /// Notes a sequence to delete; `false` if the queue is full and it was not noted.
    pub fn note(&mut self, seq: u64) -> bool {
        if self.seqs.len() >= self.limit {
            self.unnoted += 1;
            return false;
        }
        self.seqs.push_back(seq);
        true
    }

    /// The oldest `at_most` sequences, for one round.
    pub fn take(&mut self, at_most: usize) -> Vec<u64> {
        let n = at_most.min(self.seqs.len());
        self.seqs.drain(..n).collect()
    }

    /// Sequences a round could not delete: first in line for the next round, in their order.
    /// They were noted once already, so they go back even into a full queue.
    pub fn give_back(&mut self, failed: Vec<u64>) {
        for seq in failed.into_iter().rev() {
            self.seqs.push_front(seq);
        }
    }

    pub fn len(&self) -> usize {
        self.seqs.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }

    /// How many sequences were not noted because the queue was full.
    pub fn unnoted(&self) -> u64 {
        self.unnoted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_noted_sequence_is_taken_once_across_rounds_in_order() {
        let mut singles = Singles::default();
        for seq in 1..=10_000 {
            assert!(singles.note(seq));
        }
        let mut taken = Vec::new();
        let mut rounds = 0;
        while !singles.is_empty() {
            let round = singles.take(4096);
            assert!(round.len() <= 4096);
            taken.extend(round);
            rounds += 1;
        }
        assert_eq!(rounds, 3);
        assert_eq!(taken, (1..=10_000).collect::<Vec<_>>());
        assert!(singles.take(4096).is_empty());
    }

    #[test]
    fn what_a_round_could_not_delete_comes_first_in_the_next() {
        let mut singles = Singles::default();
        (1..=6).for_each(|seq| assert!(singles.note(seq)));
        assert_eq!(singles.take(4), vec![1, 2, 3, 4]);
        singles.note(7);
        singles.give_back(vec![2, 4]);
        assert_eq!(singles.take(10), vec![2, 4, 5, 6, 7]);
    }

    #[test]
    fn a_full_queue_counts_what_it_could_not_note_and_still_takes_back_failures() {
        let mut singles = Singles::with_limit(3);
        assert!(singles.note(1) && singles.note(2) && singles.note(3));
        assert!(!singles.note(4));
        assert_eq!((singles.len(), singles.unnoted()), (3, 1));
        let round = singles.take(2);
        assert_eq!(round, vec![1, 2]);
        assert!(singles.note(5));
        singles.give_back(round);
        assert_eq!(singles.take(10), vec![1, 2, 3, 5]);
    }
}
