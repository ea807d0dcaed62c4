//! What a periodic reconciliation read of the stretch of a ledger just behind the checkpoint it
//! set. It is kept with the checkpoint (`reconcile_checkpoint`, migration 0009), so the next
//! pass, whichever process runs it, reads that stretch again and judges only the entries that
//! appeared there since: a downstream that numbers an entry when its write begins shows it when
//! the write commits, possibly after later entries.

/// Most runs of unseen sequence numbers a window keeps; past that none is kept, and the next
/// pass judges the whole stretch again.
pub(crate) const UNSEEN_RUNS_MAX: usize = 10_000;

/// Where the stretch of `reread` sequence numbers behind `upto` begins (exclusive): an entry
/// up to `reread` behind `upto` is in it.
pub(crate) fn stretch_start(upto: u64, reread: u64) -> u64 {
    if reread == 0 { upto } else { upto.saturating_sub(reread.saturating_add(1)) }
}

/// The stretch `(after, upto]` of one ledger, and the sequence numbers in it a pass did not see.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Window {
    after: u64,
    upto: u64,
    /// Sorted, disjoint, inclusive runs.
    unseen: Vec<(u64, u64)>,
}

/// How a pass meets an entry behind the checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Met {
    /// The pass that set the checkpoint saw it.
    Seen,
    /// In the stretch, and not there when that pass read it: shown since, behind later ones.
    Late,
    /// Outside what that pass kept (no window, or a longer stretch now).
    Unknown,
}

impl Window {
    /// The window of a read that went from after `start` up to `upto` and met the entries
    /// `seen` (any order). `None` when more than [`UNSEEN_RUNS_MAX`] runs were not seen.
    pub(crate) fn after_read(
        start: u64,
        upto: u64,
        reread: u64,
        seen: impl IntoIterator<Item = u64>,
    ) -> Option<Window> {
        let after = start.max(stretch_start(upto, reread));
        let mut seqs: Vec<u64> = seen.into_iter().filter(|seq| *seq > after && *seq <= upto).collect();
        seqs.sort_unstable();
        seqs.dedup();
        let (mut unseen, mut next) = (Vec::new(), after + 1);
        for seq in seqs {
            if seq > next {
                unseen.push((next, seq - 1));
            }
            next = seq + 1;
        }
        if next <= upto {
            unseen.push((next, upto));
        }
        (unseen.len() <= UNSEEN_RUNS_MAX).then_some(Window { after, upto, unseen })
    }

    /// How `seq` (at most the checkpoint) is met, given the window the checkpoint came with.
    pub(crate) fn met(window: Option<&Window>, seq: u64) -> Met {
        let Some(window) = window else { return Met::Unknown };
        if seq <= window.after || seq > window.upto {
            return Met::Unknown;
        }
        let at = window.unseen.partition_point(|(_, last)| *last < seq);
        match window.unseen.get(at) {
            Some((first, _)) if *first <= seq => Met::Late,
            _ => Met::Seen,
        }
    }

    /// The stored form: `after|first-last,seq,...` (the checkpoint holds `upto`).
    pub(crate) fn encode(&self) -> String {
        let runs: Vec<String> = self
            .unseen
            .iter()
            .map(|(first, last)| if first == last { first.to_string() } else { format!("{first}-{last}") })
            .collect();
        format!("{}|{}", self.after, runs.join(","))
    }

    /// Reads [`Window::encode`]'s form back for a checkpoint at `upto`; `None` when it does not
    /// parse or does not fit `upto` (the next pass then judges the whole stretch again).
    pub(crate) fn decode(text: &str, upto: u64) -> Option<Window> {
        let (after, runs) = text.split_once('|')?;
        let after: u64 = after.parse().ok()?;
        let mut unseen = Vec::new();
        for run in runs.split(',').filter(|run| !run.is_empty()) {
            let (first, last) = run.split_once('-').unwrap_or((run, run));
            let (first, last): (u64, u64) = (first.parse().ok()?, last.parse().ok()?);
            let after_previous = unseen.last().is_none_or(|(_, previous): &(u64, u64)| first > *previous);
            if first > last || first <= after || last > upto || !after_previous {
                return None;
            }
            unseen.push((first, last));
        }
        (after <= upto).then_some(Window { after, upto, unseen })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stretch_holds_entries_up_to_reread_behind() {
        assert_eq!((stretch_start(10, 4), stretch_start(10, 0), stretch_start(3, 4)), (5, 10, 0));
        let window = Window::after_read(0, 10, 4, [6, 8, 10, 2]).expect("kept");
        assert_eq!(window.encode(), "5|7,9");
        let met: Vec<Met> = (4..=11).map(|seq| Window::met(Some(&window), seq)).collect();
        use Met::{Late, Seen, Unknown};
        assert_eq!(met, [Unknown, Unknown, Seen, Late, Seen, Late, Seen, Unknown]);
        assert_eq!(Window::met(None, 8), Unknown);
        // A read that began inside the stretch covers only what it read.
        assert_eq!(Window::after_read(7, 10, 4, [8, 9, 10]).expect("kept").encode(), "7|");
    }

    #[test]
    fn the_stored_form_reads_back_and_bad_forms_are_refused() {
        let window = Window::after_read(100, 130, 50, [101, 102, 105, 106, 107, 130]).expect("kept");
        assert_eq!(window.encode(), "100|103-104,108-129");
        assert_eq!(Window::decode(&window.encode(), 130), Some(window));
        assert_eq!(Window::decode("5|", 10).map(|w| w.encode()), Some("5|".to_owned()));
        for bad in ["", "5", "x|", "5|7-6", "5|4", "5|11", "5|8,7", "11|", "5|7,,x"] {
            assert_eq!(Window::decode(bad, 10), None, "{bad:?}");
        }
    }

    #[test]
    fn too_many_unseen_runs_are_not_kept() {
        let stretch = 2 * UNSEEN_RUNS_MAX as u64 + 2;
        let every_other = (1..=stretch).filter(|seq| seq % 2 == 0);
        assert_eq!(Window::after_read(0, stretch, stretch, every_other), None);
        let fewer = (1..=stretch).filter(|seq| seq % 2 == 0 || *seq < 10);
        assert!(Window::after_read(0, stretch, stretch, fewer).is_some());
    }
}
