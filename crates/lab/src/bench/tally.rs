//! The phase's count of DONE sagas, read once a second at a cost that does not grow with the
//! phase.
//!
//! A full `COUNT(*)` of the DONE rows reads every one of them at every sample: one index entry
//! for each message finished so far, so its cost grows with the phase's length (a peak phase
//! of 40 s at this box's rate ends near 70,000 entries a count). Here each sample counts only
//! the rows whose `lease_until_ms` is at or after a start that moves forward, and adds what
//! the earlier samples settled.
//!
//! What it can miss: a saga's last write sets its `lease_until_ms` to that write's
//! database-clock reading plus a lease of zero or more, so a saga finished after a reading has
//! its expiry at or after that reading. Rows whose expiry lies more than [`SETTLE_MS`] before
//! the previous sample's clock are added to the settled total once and never read again. So a
//! DONE row is missed only if its transaction stayed open longer than that between its update
//! and its commit (or the database clock stepped back as far). The drain checks the last count
//! against a full one, and says so if they differ.

use midflight_store::RangeCount;

/// How far behind the database clock of the last sample the settled part ends. Taken to be longer
/// than any group transaction stays open between its compare-and-set and its commit (not
/// measured; the drain's full count would show a miss); a sample reads
/// about this many seconds of finished sagas, plus the seconds since the last sample.
pub const SETTLE_MS: i64 = 10_000;

/// Where the counting stands between two samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DoneTally {
    /// DONE rows whose lease expiry lies before `from_ms`, counted once.
    settled: u64,
    /// Where the next count starts.
    from_ms: i64,
    /// Where the next count's settled part ends (at or after `from_ms`).
    below_ms: i64,
}

impl Default for DoneTally {
    fn default() -> Self {
        DoneTally { settled: 0, from_ms: i64::MIN, below_ms: i64::MIN }
    }
}

impl DoneTally {
    /// The range the next count reads: its start and the bound of its settled part.
    pub fn range(&self) -> (i64, i64) {
        (self.from_ms, self.below_ms)
    }

    /// Takes a count of [`range`](Self::range) and returns the DONE rows in all.
    pub fn add(&mut self, read: RangeCount) -> u64 {
        let done = self.settled + read.from;
        self.settled += read.below;
        self.from_ms = self.below_ms;
        self.below_ms = read.now_ms.saturating_sub(SETTLE_MS).max(self.from_ms);
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts `expiries` (the lease expiries of the DONE rows visible now) over `range` as the
    /// store's statement does.
    fn count(expiries: &[i64], (from_ms, below_ms): (i64, i64), now_ms: i64) -> RangeCount {
        let read: Vec<i64> = expiries.iter().copied().filter(|e| *e >= from_ms).collect();
        RangeCount { from: read.len() as u64, below: read.iter().filter(|e| **e < below_ms).count() as u64, now_ms }
    }

    #[test]
    fn the_tally_equals_a_full_count_at_every_sample() {
        // A saga finishing at clock t gets an expiry from t (a released lease) to t + 30 s.
        let mut tally = DoneTally::default();
        let mut expiries = Vec::new();
        for second in 0..120_i64 {
            let now_ms = 1_000_000 + second * 1_000;
            for n in 0..(second % 7) * 10 {
                expiries.push(now_ms - 999 + n * 7 % 1_000 + if n % 3 == 0 { 30_000 } else { 0 });
            }
            let done = tally.add(count(&expiries, tally.range(), now_ms));
            assert_eq!(done, expiries.len() as u64, "at second {second}");
        }
        assert!(!expiries.is_empty());
    }

    #[test]
    fn a_sample_reads_the_settling_window_not_the_phase() {
        let mut tally = DoneTally::default();
        let mut expiries = Vec::new();
        let mut read_last = 0;
        for second in 0..300_i64 {
            let now_ms = second * 1_000;
            expiries.extend((0..100).map(|n| now_ms - 1_000 + n * 10));
            let read = count(&expiries, tally.range(), now_ms);
            read_last = read.from;
            assert_eq!(tally.add(read), expiries.len() as u64);
        }
        // 100 a second: the settling window, the second before it and the one being counted.
        let window = (SETTLE_MS / 1_000 + 2) as u64 * 100;
        assert!(read_last <= window, "the last sample read {read_last} rows of {}", expiries.len());
    }

    #[test]
    fn a_row_whose_commit_outlasts_the_window_is_the_one_it_misses() {
        // Updated at 80 s, committed only at 101-102 s.
        let late = [80_000];
        let mut tally = DoneTally::default();
        tally.add(count(&[], tally.range(), 100_000));
        assert_eq!(tally.range(), (i64::MIN, 100_000 - SETTLE_MS));
        assert_eq!(tally.add(count(&late, tally.range(), 101_000)), 1, "inside the range read: counted and settled");
        assert_eq!(tally.add(count(&late, tally.range(), 102_000)), 1, "settled: counted once");

        let mut behind = DoneTally::default();
        behind.add(count(&[], behind.range(), 100_000));
        behind.add(count(&[], behind.range(), 101_000));
        assert_eq!(behind.range().0, 100_000 - SETTLE_MS);
        assert_eq!(behind.add(count(&late, behind.range(), 102_000)), 0, "before the range already: missed");
    }
}
