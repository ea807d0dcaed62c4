//! The reconciler: compares both downstream ledgers with the saga table and opens a ticket for
//! every mismatch. It runs periodically inside the recovery worker and on demand through
//! `sagactl reconcile`; several may run at once (tickets are idempotent).
//!
//! One pass: note the database time, read both ledgers in full (bounded by
//! `ledger_entries_max`), then walk the table once. Each saga's stored request ids select its
//! entries; [`crate::ledger::classify`] judges them. Effects left over, under request ids no
//! saga in the walk owned, are looked up again by request id (a saga may have arrived during
//! the walk) and are orphans if still unowned. Sagas changed after the ledgers were read are
//! only judged on what is never right (two effects in force), so a pass racing live traffic
//! reports nothing that is merely in flight.
//!
//! The periodic passes ([`Reconciler::run_incremental`]) read only what changed since the last
//! one, from a checkpoint in the table: the entries recorded since, the sagas finished since
//! and the open findings name a set of request ids, whose entries (old and new) are read by
//! request id and judged by the same rule. Each also reads the stretch of
//! `ledger_reread_entries` sequence numbers behind its checkpoint again and judges the entries
//! there that the pass which set the checkpoint did not see (kept with it, [`crate::window`]):
//! a downstream may show an entry after later ones (numbered when its write began, committed
//! after theirs). A full pass stays for `sagactl reconcile` and for the first periodic pass.
//!
//! A purged saga is gone from the table while its effects stay in the ledgers. Its business
//! row is never purged, though, and request ids derive from biz_ids: an effect under a request
//! id derived from a business row whose saga row is gone is judged against that row's status
//! (SHIPPED or FULFILLING as DONE, REVERSED as ROLLED_BACK), like a saga's; one effect of a
//! shipped order is counted (`owned_by_purged`), not called an orphan, and two, or one after a
//! reversal, are findings. This holds whatever the purge's horizon is or was, and for a
//! `sagactl reconcile` that knows nothing of it.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::time::Duration;

use midflight_api::client::{Downstreams, LedgerEntry};
use midflight_model::{Status, Step};
use midflight_store::{
    Checkpoint, FindingTicket, LOGISTICS_LEDGER_STEP, LedgerView, Store, TicketOutcome, Unreadable, WMS_LEDGER_STEP,
};
use serde::Serialize;

use crate::Error;
use crate::config::ReconcileSection;
use crate::ledger::{Effects, Evidence, FindingKind, Ledger, classify, fingerprint};
use crate::window::{Met, Window, stretch_start};

/// What [`Reconciler::touched`] read of one ledger.
struct Touched {
    ids: HashSet<String>,
    last_seq: u64,
    /// New entries: after the checkpoint.
    entries: u64,
    /// Entries behind the checkpoint in the stretch its window kept, not seen by the pass that
    /// set it.
    late: u64,
    /// How far behind the checkpoint the deepest of those was, in sequence numbers.
    late_depth_max: u64,
    /// Entries behind the checkpoint outside what its window kept, judged again.
    reread: u64,
    /// What this read saw of the stretch the next pass reads again (`None`: too scattered).
    window: Option<Window>,
    /// It stopped at its bound, short of the ledger's end.
    behind: bool,
}

/// What [`Reconciler::finished_since`] read.
#[derive(Default)]
struct Finished {
    views: Vec<LedgerView>,
    unreadable: Vec<Unreadable>,
    /// When a status had more than the bound: where the next pass starts.
    next_since: Option<i64>,
}

/// A pass takes at most `ledger_entries_max` divided by this of new entries of each ledger and
/// of finished sagas of each status, so what it folds (their entries, old and new, by request
/// id) stays well inside `ledger_entries_max`.
pub(crate) const PASS_SHARE: u64 = 8;

/// Name of the periodic passes' checkpoint in `reconcile_checkpoint`.
pub const CHECKPOINT: &str = "periodic";
/// How far before a pass's start the next pass looks for finished sagas: the database clock
/// this process estimates is a reading a few seconds old, so a margin keeps a saga finished
/// just before the start from falling between two passes (judging it twice costs nothing).
const SINCE_MARGIN_MS: i64 = 60_000;
/// Open finding tickets an incremental pass judges again (the newest, should there be more).
const OPEN_FINDINGS_MAX: u64 = 10_000;
/// How an orphan's ticket key begins (`orphan:<request id>`); other keys are biz_ids.
const ORPHAN_KEY_PREFIX: &str = "orphan:";
/// Request ids one ledger listing names (what the downstreams accept).
const REQUEST_IDS_PER_CALL: usize = 500;

/// The checkpoint of a reading of both ledgers to their ends (WMS, logistics: how far, and what
/// was seen of the stretch behind), with the sagas finished before `since_ms` judged.
fn read_whole(
    [(wms_seq, wms_window), (logistics_seq, logistics_window)]: [(u64, Option<Window>); 2],
    since_ms: i64,
) -> Checkpoint {
    Checkpoint {
        wms_seq,
        logistics_seq,
        since_ms,
        wms_unseen: wms_window.map(|w| w.encode()),
        logistics_unseen: logistics_window.map(|w| w.encode()),
    }
}

/// A mismatch found by a pass, and what became of its ticket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub kind: FindingKind,
    #[serde(serialize_with = "step_name")]
    pub step: Step,
    pub request_id: String,
    pub order_no: String,
    /// The owning saga, if any (and its status when the pass read it).
    pub biz_id: Option<String>,
    pub status: Option<Status>,
    /// The downstream's ids of the effects in force (lock ids, tracking numbers).
    pub in_force: Vec<String>,
    #[serde(serialize_with = "ticket_name")]
    pub ticket: TicketOutcome,
}

/// What one pass read, found and did: counters for metrics, and the findings for people.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    /// Database time when the pass began.
    pub started_at_ms: i64,
    /// The pass read only what changed since the checkpoint ([`Reconciler::run_incremental`]).
    pub incremental: bool,
    /// Of an incremental pass, the ledger entries recorded since the checkpoint (both ledgers).
    pub new_entries: u64,
    /// An incremental pass stopped at its bound, short of the present: the next starts at once.
    pub behind: bool,
    /// Of an incremental pass, entries up to `ledger_reread_entries` behind the checkpoint
    /// that were not there when the pass that set it read that stretch: shown after later
    /// entries (a slow commit). Judged now.
    pub late_entries: u64,
    /// How far behind the checkpoint the deepest late entry was, in sequence numbers: near
    /// `ledger_reread_entries`, entries later still may fall outside what is read again.
    pub late_depth_max: u64,
    /// Of an incremental pass, the `ledger_reread_entries` it ran with (0 for a full pass).
    pub reread_stretch: u64,
    /// Of an incremental pass, entries behind the checkpoint outside what the pass that set it
    /// kept of its stretch (a checkpoint from before migration 0009, a stretch too scattered
    /// to keep, or a longer `ledger_reread_entries` now), judged again.
    pub reread_entries: u64,
    pub wms_entries: u64,
    pub logistics_entries: u64,
    pub sagas_checked: u64,
    /// Saga rows the pass could not read (a value no saga can have): stepped over, their
    /// effects neither judged nor called orphans, until a person repairs them.
    pub unreadable: u64,
    pub orphans: u64,
    pub double_effects: u64,
    pub missing_effects: u64,
    pub effects_after_rollback: u64,
    /// Effects in force of sagas purged since, as their business rows expect them: not findings.
    pub owned_by_purged: u64,
    pub tickets_opened: u64,
    pub tickets_reopened: u64,
    pub tickets_already_open: u64,
    pub tickets_resolved_before: u64,
    /// The first `findings_listed_max` findings.
    pub findings: Vec<Finding>,
    /// Findings by kind and by what became of their ticket (the labels of
    /// `midflight_reconciler_findings_total`), all of them, listed or not.
    #[serde(skip)]
    pub by_kind_and_ticket: BTreeMap<(&'static str, &'static str), u64>,
}

impl Report {
    pub fn findings_total(&self) -> u64 {
        self.orphans + self.double_effects + self.missing_effects + self.effects_after_rollback
    }

    fn count(&mut self, finding: Finding, listed_max: usize) {
        let kind_counter = match finding.kind {
            FindingKind::Orphan => &mut self.orphans,
            FindingKind::DoubleEffect => &mut self.double_effects,
            FindingKind::MissingEffect => &mut self.missing_effects,
            FindingKind::EffectAfterRollback => &mut self.effects_after_rollback,
        };
        *kind_counter += 1;
        let ticket_counter = match finding.ticket {
            TicketOutcome::Opened => &mut self.tickets_opened,
            TicketOutcome::Reopened => &mut self.tickets_reopened,
            TicketOutcome::AlreadyOpen => &mut self.tickets_already_open,
            TicketOutcome::ResolvedBefore => &mut self.tickets_resolved_before,
        };
        *ticket_counter += 1;
        let labels = (finding.kind.as_str(), ticket_outcome_name(finding.ticket));
        *self.by_kind_and_ticket.entry(labels).or_default() += 1;
        if self.findings.len() < listed_max {
            self.findings.push(finding);
        }
    }
}

/// Compares the ledgers of `downstreams` with the table of `store`.
#[derive(Debug, Clone)]
pub struct Reconciler {
    store: Store,
    downstreams: Downstreams,
    section: ReconcileSection,
    actor: String,
}

/// The state of one pass.
struct Pass {
    wms: Ledger,
    logistics: Ledger,
    report: Report,
    /// Rows that cannot be read, met so far (each counted once).
    stepped_over: HashSet<String>,
}

impl Reconciler {
    /// `actor` names who opens the tickets (e.g. `recovery:<owner>` or `operator:<name>`).
    pub fn new(store: Store, downstreams: Downstreams, section: ReconcileSection, actor: String) -> Reconciler {
        Reconciler { store, downstreams, section, actor }
    }

    /// One full pass. Fails (opening no further tickets) when a ledger cannot be read whole.
    pub async fn run_once(&self) -> Result<Report, Error> {
        Ok(self.full().await?.0)
    }

    /// A periodic pass: [`Reconciler::run_incremental`], or a full one when
    /// `reconcile.incremental` is off. Either moves the periodic passes' checkpoint, whose
    /// `since_ms` tells the purge which finished sagas have been judged.
    pub async fn run_periodic(&self) -> Result<Report, Error> {
        if self.section.incremental { self.run_incremental().await } else { self.run_full_periodic().await }
    }

    /// A full periodic pass: its reading becomes the checkpoint, as the first incremental
    /// pass's does (so turning `reconcile.incremental` on later starts from it). A ledger read
    /// to an end behind the checkpoint's (it lost entries) leaves that ledger's part as it was.
    async fn run_full_periodic(&self) -> Result<Report, Error> {
        let from = self.store.reconcile_checkpoint(CHECKPOINT).await?;
        let (report, windows) = self.full().await?;
        let mut to = read_whole(windows, report.started_at_ms - SINCE_MARGIN_MS);
        if let Some(from) = &from {
            if to.wms_seq < from.wms_seq {
                (to.wms_seq, to.wms_unseen) = (from.wms_seq, from.wms_unseen.clone());
            }
            if to.logistics_seq < from.logistics_seq {
                (to.logistics_seq, to.logistics_unseen) = (from.logistics_seq, from.logistics_unseen.clone());
            }
        }
        if !self.store.advance_reconcile_checkpoint(CHECKPOINT, from.as_ref(), &to).await? {
            tracing::info!("another pass moved the reconciliation checkpoint first; this one's findings stand");
        }
        Ok(report)
    }

    /// A full pass, and how far it read each ledger (WMS, logistics) with what it saw of the
    /// stretch behind that end.
    async fn full(&self) -> Result<(Report, [(u64, Option<Window>); 2]), Error> {
        let started_at_ms = self.store.now_ms().await?;
        let (wms, wms_window) = self.read_ledger(Step::Wms).await?;
        let (logistics, logistics_window) = self.read_ledger(Step::Logistics).await?;
        let mut pass = Pass {
            wms,
            logistics,
            report: Report { started_at_ms, ..Report::default() },
            stepped_over: HashSet::new(),
        };
        self.walk_table(&mut pass).await?;
        for step in [Step::Wms, Step::Logistics] {
            self.check_unowned(&mut pass, step).await?;
        }
        Ok((self.finish(pass), [wms_window, logistics_window]))
    }

    /// A pass over what changed since the periodic passes' checkpoint (the first one, with no
    /// checkpoint yet, is a full pass): the ledger entries recorded since, the sagas finished
    /// since, and the open findings. Every entry, old or new, of each request id those name is
    /// read (by request id), and each id is judged as a full pass judges it, by the saga that
    /// names it: a new second lock of a saga finished long ago is a double effect, a new lock
    /// of a saga rolled back long ago an effect after rollback, a saga finished since (or long
    /// ago, its lock reversed since) with nothing in force a missing effect, a new effect no
    /// saga names an orphan.
    ///
    /// Bounded: a pass takes at most an eighth of `ledger_entries_max` new entries of each
    /// ledger and as many finished sagas of each status; past that it stops where it got to,
    /// says so (`behind`), and the next pass starts at once from there. Then the checkpoint
    /// moves to what this pass read, by compare-and-set: two workers' passes racing judge some
    /// effects twice (their tickets are idempotent) and skip none.
    pub async fn run_incremental(&self) -> Result<Report, Error> {
        let Some(from) = self.store.reconcile_checkpoint(CHECKPOINT).await? else { return self.run_first().await };
        let started_at_ms = self.store.now_ms().await?;
        let share = (self.section.ledger_entries_max / PASS_SHARE).max(1);
        let window = |text: &Option<String>, upto| text.as_deref().and_then(|text| Window::decode(text, upto));
        let wms_window = window(&from.wms_unseen, from.wms_seq);
        let logistics_window = window(&from.logistics_unseen, from.logistics_seq);
        let wms = self.touched(Step::Wms, from.wms_seq, share, wms_window.as_ref()).await?;
        let logistics = self.touched(Step::Logistics, from.logistics_seq, share, logistics_window.as_ref()).await?;
        let mut finished = self.finished_since(from.since_ms, share).await?;
        // Open findings are judged again at every pass, as a full pass would, so their count
        // goes on (and the alert on it) until a person resolves them: a saga's with the saga
        // (read by biz_id: a missing effect's request id may be in no ledger and no column),
        // an orphan's by its request id.
        let mut ids = [wms.ids, logistics.ids];
        let mut with_findings = BTreeSet::new();
        let steps = [WMS_LEDGER_STEP, LOGISTICS_LEDGER_STEP];
        for (key, step) in self.store.open_ticket_keys_at(&steps, OPEN_FINDINGS_MAX).await? {
            match key.strip_prefix(ORPHAN_KEY_PREFIX) {
                Some(id) => {
                    ids[usize::from(step == LOGISTICS_LEDGER_STEP)].insert(id.to_owned());
                }
                None => {
                    with_findings.insert(key);
                }
            }
        }
        let judged: HashSet<&str> = finished.views.iter().map(|view| view.biz_id.as_str()).collect();
        let with_findings: Vec<String> = with_findings.into_iter().filter(|id| !judged.contains(id.as_str())).collect();
        let found_again = self.store.ledger_views_of(&with_findings).await?;
        finished.views.extend(found_again.views);
        finished.unreadable.extend(found_again.unreadable);
        // Per step, the request ids to judge, and those the sagas read above name (judged with
        // their saga; the rest by the saga found by request id). A saga that never recorded a
        // step's intent names no id there: an effect under the id derived from its biz_id is
        // judged with the rest (an orphan, as a full pass finds it), not skipped with the saga.
        let mut named: [HashSet<String>; 2] = Default::default();
        for view in &finished.views {
            for (index, step) in [Step::Wms, Step::Logistics].into_iter().enumerate() {
                let stored = view.request_id(step);
                let id = stored.map_or_else(|| midflight_model::request_id(&view.biz_id, step), str::to_owned);
                if stored.is_some() {
                    named[index].insert(id.clone());
                }
                ids[index].insert(id);
            }
        }
        let [wms_ids, logistics_ids] = ids;
        let others: [Vec<String>; 2] = [
            wms_ids.iter().filter(|id| !named[0].contains(*id)).cloned().collect(),
            logistics_ids.iter().filter(|id| !named[1].contains(*id)).cloned().collect(),
        ];
        // The next pass looks for finished sagas from where this one stopped, but never from
        // past this pass's start less the margin: a finished row's lease end is up to a lease
        // ahead of its last write, and a saga finishing after this pass with an earlier lease
        // end (a shorter lease, an operator's resolve, a late commit) must still be read by the
        // next one. A pass that stopped past that point has read all it can judge as settled:
        // it is not behind, and the rest is read again at the next interval, as after any pass.
        let settled_ms = started_at_ms - SINCE_MARGIN_MS;
        let next_since = finished.next_since.filter(|next| *next < settled_ms);
        let behind = wms.behind || logistics.behind || next_since.is_some();
        let report = Report {
            started_at_ms,
            incremental: true,
            behind,
            new_entries: wms.entries + logistics.entries,
            late_entries: wms.late + logistics.late,
            late_depth_max: wms.late_depth_max.max(logistics.late_depth_max),
            reread_stretch: self.section.ledger_reread_entries,
            reread_entries: wms.reread + logistics.reread,
            ..Report::default()
        };
        let reread = self.section.ledger_reread_entries;
        if report.late_depth_max.saturating_mul(2) > reread {
            tracing::error!(
                late = report.late_entries,
                depth_max = report.late_depth_max,
                reread,
                "ledger entries appeared more than halfway through the stretch behind the checkpoint that is read \
                 again; one deeper than reconcile.ledger_reread_entries would not be judged: raise it"
            );
        } else if report.late_entries > 0 {
            tracing::warn!(
                late = report.late_entries,
                depth_max = report.late_depth_max,
                reread,
                "ledger entries appeared behind entries read before them (committed out of order); judging them now"
            );
        }
        let mut pass = Pass {
            wms: self.read_entries_of(Step::Wms, wms_ids).await?,
            logistics: self.read_entries_of(Step::Logistics, logistics_ids).await?,
            report,
            stepped_over: HashSet::new(),
        };
        for view in &finished.views {
            pass.report.sagas_checked += 1;
            for step in [Step::Wms, Step::Logistics] {
                self.check_saga(&mut pass, view, step).await?;
            }
        }
        for row in &finished.unreadable {
            self.step_over(&mut pass, row);
        }
        let [wms_others, logistics_others] = others;
        self.check_ids(&mut pass, Step::Wms, wms_others).await?;
        self.check_ids(&mut pass, Step::Logistics, logistics_others).await?;
        let since_ms = next_since.unwrap_or(settled_ms);
        let to = Checkpoint {
            wms_seq: wms.last_seq,
            logistics_seq: logistics.last_seq,
            since_ms,
            wms_unseen: wms.window.map(|w| w.encode()),
            logistics_unseen: logistics.window.map(|w| w.encode()),
        };
        if !self.store.advance_reconcile_checkpoint(CHECKPOINT, Some(&from), &to).await? {
            tracing::info!("another pass moved the reconciliation checkpoint first; this one's findings stand");
        }
        if behind {
            tracing::info!(?to, "reconciliation is behind the traffic; the next pass starts at once");
        }
        Ok(self.finish(pass))
    }

    /// The first incremental pass: a full one, whose reading becomes the checkpoint. When the
    /// ledgers are past `ledger_entries_max` already, none can be read whole, and the
    /// checkpoint starts at their current ends instead, with no saga judged yet: the entries
    /// recorded before are read only where a saga's request id names them (an orphan among
    /// them is not found; a warning says so), and the sagas finished before are judged by the
    /// next passes, a bounded share each, from the oldest on. Until then the purge keeps them.
    async fn run_first(&self) -> Result<Report, Error> {
        let started_at_ms = self.store.now_ms().await?;
        let (report, windows, since_ms) = match self.full().await {
            Ok((report, windows)) => (report, windows, started_at_ms - SINCE_MARGIN_MS),
            Err(Error::LedgerTooLarge { step, limit }) => {
                tracing::warn!(
                    step,
                    limit,
                    "a ledger is past reconcile.ledger_entries_max, so it cannot be reconciled whole; \
                     reconciling from the ledgers' current ends on (an effect recorded before under a request id \
                     no saga names is not found), and the sagas finished before step by step"
                );
                let windows = [self.ledger_end(Step::Wms).await?, self.ledger_end(Step::Logistics).await?];
                (Report { started_at_ms, incremental: true, behind: true, ..Report::default() }, windows, 0)
            }
            Err(error) => return Err(error),
        };
        self.store.advance_reconcile_checkpoint(CHECKPOINT, None, &read_whole(windows, since_ms)).await?;
        Ok(report)
    }

    /// The request ids of `step`'s ledger entries after `after`, at most `max` entries (whole
    /// pages: a page more past it at the most), and of the entries up to
    /// `ledger_reread_entries` behind it that `window` (what the pass that set `after` kept)
    /// does not say were seen.
    async fn touched(&self, step: Step, after: u64, max: u64, window: Option<&Window>) -> Result<Touched, Error> {
        let start = stretch_start(after, self.section.ledger_reread_entries);
        let (mut ids, mut seen) = (HashSet::new(), Vec::new());
        let (mut entries, mut late, mut late_depth_max, mut reread) = (0u64, 0u64, 0u64, 0u64);
        let (last_seq, behind) = self
            .walk_ledger(step, &[], start, |page| {
                for entry in page {
                    seen.push(entry.seq);
                    if entry.seq > after {
                        entries += 1;
                    } else {
                        match Window::met(window, entry.seq) {
                            Met::Seen => continue,
                            Met::Late => {
                                late += 1;
                                late_depth_max = late_depth_max.max(after - entry.seq);
                            }
                            Met::Unknown => reread += 1,
                        }
                    }
                    ids.insert(entry.request_id);
                }
                Ok(entries < max)
            })
            .await?;
        // A ledger that lost entries (purged) does not move the checkpoint back.
        let last_seq = last_seq.max(after);
        let window = Window::after_read(start, last_seq, self.section.ledger_reread_entries, seen);
        Ok(Touched { ids, last_seq, entries, late, late_depth_max, reread, window, behind })
    }

    /// The end of `step`'s ledger, read page by page and kept nowhere: its last sequence number,
    /// and what was seen of the stretch behind it.
    async fn ledger_end(&self, step: Step) -> Result<(u64, Option<Window>), Error> {
        let mut tail = Tail::new(self.section.ledger_reread_entries);
        let (upto, _) = self
            .walk_ledger(step, &[], 0, |page| {
                tail.push(&page);
                Ok(true)
            })
            .await?;
        Ok(tail.end(upto))
    }

    /// `step`'s whole ledger, folded (at most `ledger_entries_max` entries), and how far it
    /// read with what it saw of the stretch behind that end.
    async fn read_ledger(&self, step: Step) -> Result<(Ledger, (u64, Option<Window>)), Error> {
        let (mut ledger, mut tail) = (Ledger::default(), Tail::new(self.section.ledger_reread_entries));
        self.walk_ledger(step, &[], 0, |page| {
            tail.push(&page);
            self.fold_page(step, &mut ledger, &page)
        })
        .await?;
        let end = tail.end(ledger.last_seq);
        Ok((ledger, end))
    }

    /// Every entry of `step`'s ledger under `ids`, folded; at most `ledger_entries_max`.
    async fn read_entries_of(&self, step: Step, ids: HashSet<String>) -> Result<Ledger, Error> {
        let ids: Vec<String> = ids.into_iter().collect();
        let mut ledger = Ledger::default();
        for chunk in ids.chunks(REQUEST_IDS_PER_CALL) {
            self.fold_ledger(step, chunk, &mut ledger).await?;
        }
        Ok(ledger)
    }

    /// Folds `step`'s ledger entries (only those under `ids` when given) into `ledger`, failing
    /// once it would hold more than `ledger_entries_max`.
    async fn fold_ledger(&self, step: Step, ids: &[String], ledger: &mut Ledger) -> Result<(), Error> {
        self.walk_ledger(step, ids, 0, |page| self.fold_page(step, ledger, &page)).await?;
        Ok(())
    }

    /// Folds one page into `ledger`, failing once it would hold more than `ledger_entries_max`.
    fn fold_page(&self, step: Step, ledger: &mut Ledger, page: &[LedgerEntry]) -> Result<bool, Error> {
        let max = self.section.ledger_entries_max;
        if ledger.entries + page.len() as u64 > max {
            return Err(Error::LedgerTooLarge { step: step.as_str(), limit: max });
        }
        ledger.fold(page);
        Ok(true)
    }

    /// Hands `step`'s ledger (only the entries under `ids` when given) to `visit` a page at a
    /// time from after `cursor`, until a short page or a cursor that does not move (the end),
    /// or `visit` answers `false`. Returns the last sequence number reached, and whether it
    /// stopped at `visit`'s word short of the end.
    async fn walk_ledger(
        &self,
        step: Step,
        ids: &[String],
        mut cursor: u64,
        mut visit: impl FnMut(Vec<LedgerEntry>) -> Result<bool, Error>,
    ) -> Result<(u64, bool), Error> {
        let (timeout, page_entries) =
            (Duration::from_millis(self.section.ledger_timeout_ms), self.section.ledger_page_entries);
        loop {
            let (page, next) = match step {
                Step::Wms => self.downstreams.wms_ledger_of(ids, cursor, page_entries, timeout).await?,
                Step::Logistics => self.downstreams.logistics_ledger_of(ids, cursor, page_entries, timeout).await?,
            };
            let (full, progressed) = (page.len() >= page_entries as usize, next > cursor);
            cursor = cursor.max(next);
            let go_on = visit(page)?;
            if !full || !progressed {
                return Ok((cursor, false));
            }
            if !go_on {
                return Ok((cursor, true));
            }
        }
    }

    /// The DONE and ROLLED_BACK sagas last written since `since_ms` (at most `max` of each,
    /// oldest first), and the rows among them that cannot be read.
    async fn finished_since(&self, since_ms: i64, max: u64) -> Result<Finished, Error> {
        let mut finished = Finished::default();
        for status in Status::FINISHED {
            let (mut after, mut read) = (None::<midflight_store::ScanCursor>, 0u64);
            loop {
                let page =
                    self.store.finished_since(status, since_ms, after.as_ref(), self.section.table_page_rows).await?;
                read += (page.views.len() + page.unreadable.len()) as u64;
                finished.views.extend(page.views);
                finished.unreadable.extend(page.unreadable);
                let Some(next) = page.next else { break };
                // Past the bound, a pass stops only once it has read beyond the rows at the
                // checkpoint's `since_ms` itself: the next one starts at the last row's time, so
                // stopping among them would start it where this one started, for ever. (Such a
                // run of one millisecond is read whole: more of them than a pass's share, as
                // only a bulk update writes, fail the pass at `ledger_entries_max`.)
                if read >= max && next.lease_until_ms > since_ms {
                    // The next pass starts at the last one read (rows sharing its time are
                    // judged twice).
                    let since = finished.next_since.map_or(next.lease_until_ms, |s| s.min(next.lease_until_ms));
                    finished.next_since = Some(since);
                    break;
                }
                after = Some(next);
            }
        }
        Ok(finished)
    }

    /// Logs and counts what a finished pass found.
    fn finish(&self, pass: Pass) -> Report {
        let ledger_heap_mib = (pass.wms.heap_bytes() + pass.logistics.heap_bytes()) / (1 << 20);
        let mut report = pass.report;
        report.wms_entries = pass.wms.entries;
        report.logistics_entries = pass.logistics.entries;
        tracing::info!(
            findings = report.findings_total(),
            opened = report.tickets_opened,
            reopened = report.tickets_reopened,
            sagas = report.sagas_checked,
            unreadable = report.unreadable,
            wms_entries = report.wms_entries,
            logistics_entries = report.logistics_entries,
            owned_by_purged = report.owned_by_purged,
            incremental = report.incremental,
            new_entries = report.new_entries,
            behind = report.behind,
            ledger_heap_mib,
            "reconciliation finished"
        );
        report
    }

    async fn walk_table(&self, pass: &mut Pass) -> Result<(), Error> {
        let mut after = String::new();
        loop {
            let page = self.store.ledger_view_page(&after, self.section.table_page_rows).await?;
            for view in &page.views {
                pass.report.sagas_checked += 1;
                for step in [Step::Wms, Step::Logistics] {
                    self.check_saga(pass, view, step).await?;
                }
            }
            for row in &page.unreadable {
                self.step_over(pass, row);
            }
            match page.next_after {
                Some(last) => after = last,
                None => return Ok(()),
            }
        }
    }

    /// A row that cannot be read: its effects are not judged (its status is unknown to the
    /// pass), nor called orphans (their request ids derive from its biz_id).
    fn step_over(&self, pass: &mut Pass, row: &Unreadable) {
        if !pass.stepped_over.insert(row.biz_id.clone()) {
            return;
        }
        pass.report.unreadable += 1;
        for step in [Step::Wms, Step::Logistics] {
            pass.ledger_mut(step).own(&midflight_model::request_id(&row.biz_id, step));
        }
        tracing::error!(biz_id = %row.biz_id, error = %row.error,
            "saga row cannot be read; the reconciliation steps over it and its effects");
    }

    async fn check_saga(&self, pass: &mut Pass, view: &LedgerView, step: Step) -> Result<(), Error> {
        let request_id = view.request_id(step);
        if let Some(id) = request_id {
            pass.ledger_mut(step).own(id);
        }
        let in_force = request_id.map_or(0, |id| pass.ledger(step).in_force(id));
        let settled = view.updated_at_ms < pass.report.started_at_ms;
        let Some(kind) = classify(Some(view.status), settled, in_force) else { return Ok(()) };
        // A DONE saga always recorded its intents; the derived id stands in should one be missing.
        let request_id = request_id.map_or_else(|| midflight_model::request_id(&view.biz_id, step), str::to_owned);
        let effects = pass.ledger(step).by_request.get(&request_id).cloned();
        let effects = effects.unwrap_or_else(|| Effects { order_no: view.order_no.clone(), ..Effects::default() });
        self.report(pass, kind, step, &request_id, &effects, Some(&view.biz_id)).await
    }

    /// Effects in force under request ids no saga of the walk owned: look them up once more
    /// (by the indexed request-id column) before calling them orphans.
    async fn check_unowned(&self, pass: &mut Pass, step: Step) -> Result<(), Error> {
        let unowned: Vec<String> = pass
            .ledger(step)
            .by_request
            .iter()
            .filter(|(_, effects)| !effects.in_force.is_empty() && !effects.owned)
            .map(|(id, _)| id.clone())
            .collect();
        self.check_ids(pass, step, unowned).await
    }

    /// Judges `request_ids`, none of them named by a saga the pass judged already, by their
    /// owner found by request id; failing that as a purged saga's (by its business row) or as
    /// orphans. An owner whose row cannot be read is stepped over.
    async fn check_ids(&self, pass: &mut Pass, step: Step, request_ids: Vec<String>) -> Result<(), Error> {
        if request_ids.is_empty() {
            return Ok(());
        }
        let (late, unreadable) = self.store.owners_of(step, &request_ids).await?;
        let mut stepped_over = HashSet::with_capacity(unreadable.len());
        for row in &unreadable {
            self.step_over(pass, row);
            stepped_over.insert(midflight_model::request_id(&row.biz_id, step));
        }
        let mut owners: HashMap<String, &midflight_model::Saga> = HashMap::with_capacity(late.len());
        for saga in &late {
            owners.entry(saga.request_id(step)).or_insert(saga);
        }
        let ownerless: Vec<&str> = request_ids
            .iter()
            .map(String::as_str)
            .filter(|id| !owners.contains_key(*id) && !stepped_over.contains(*id))
            .collect();
        let purged = self.purged_owners(pass, step, &ownerless).await?;
        for request_id in request_ids {
            if stepped_over.contains(&request_id) {
                continue;
            }
            let owner = owners.get(&request_id).copied();
            let mut effects = pass.ledger(step).by_request.get(&request_id).cloned().unwrap_or_default();
            if let Some((biz_id, status)) = purged.get(&request_id) {
                // A purged saga finished long before the ledgers were read: settled. Judged on
                // effects in force only, as a full pass judges it.
                if effects.in_force.is_empty() {
                    continue;
                }
                match classify(Some(*status), true, effects.in_force.len()) {
                    None => pass.report.owned_by_purged += 1,
                    Some(kind) => self.report(pass, kind, step, &request_id, &effects, Some(biz_id)).await?,
                }
                continue;
            }
            // An owner the pass did not judge yet: settled when its row last changed before the
            // pass began (an incremental pass's owner finished long ago; a full pass's late owner
            // changed during the walk, so it is not).
            let settled = owner.is_some_and(|saga| saga.updated_at_ms < pass.report.started_at_ms);
            let Some(kind) = classify(owner.map(|saga| saga.status), settled, effects.in_force.len()) else { continue };
            if let (Some(saga), true) = (owner, effects.order_no.is_empty()) {
                effects.order_no = saga.order_no.clone();
            }
            let biz_id = owner.map(|saga| saga.biz_id.clone());
            self.report(pass, kind, step, &request_id, &effects, biz_id.as_deref()).await?;
        }
        Ok(())
    }

    /// Of `ownerless` request ids (no saga row names them), the ones derived from a business
    /// row of their order whose saga was purged: its biz_id, and the status its saga ended in
    /// as the business row tells it.
    async fn purged_owners(
        &self,
        pass: &Pass,
        step: Step,
        ownerless: &[&str],
    ) -> Result<HashMap<String, (String, Status)>, Error> {
        let order_nos: BTreeSet<String> = ownerless
            .iter()
            .filter_map(|id| pass.ledger(step).by_request.get(*id))
            .map(|effects| effects.order_no.clone())
            .collect();
        if order_nos.is_empty() {
            return Ok(HashMap::new());
        }
        let order_nos: Vec<String> = order_nos.into_iter().collect();
        let ownerless: HashSet<&str> = ownerless.iter().copied().collect();
        let mut derived: HashMap<String, (String, Status)> = HashMap::new();
        for (biz_id, business_status) in self.store.purged_business_rows(&order_nos).await? {
            // REVERSED: rolled back; SHIPPED, or FULFILLING (an operator closed it by hand): done.
            let status = if business_status == "REVERSED" { Status::RolledBack } else { Status::Done };
            let request_id = midflight_model::request_id(&biz_id, step);
            if ownerless.contains(request_id.as_str()) {
                derived.insert(request_id, (biz_id, status));
            }
        }
        Ok(derived)
    }

    async fn report(
        &self,
        pass: &mut Pass,
        kind: FindingKind,
        step: Step,
        request_id: &str,
        effects: &Effects,
        biz_id: Option<&str>,
    ) -> Result<(), Error> {
        let saga = match biz_id {
            Some(id) => self.store.get(id).await?,
            None => None,
        };
        let ticket = FindingTicket {
            key: biz_id.map_or_else(|| format!("{ORPHAN_KEY_PREFIX}{request_id}"), str::to_owned),
            step: match step {
                Step::Wms => WMS_LEDGER_STEP,
                Step::Logistics => LOGISTICS_LEDGER_STEP,
            },
            reason: reason(kind, step, request_id, &effects.order_no, biz_id),
            fingerprint: fingerprint(kind, &effects.in_force),
            evidence: serde_json::json!({
                "kind": kind.as_str(),
                "step": step.as_str(),
                "request_id": request_id,
                "order_no": effects.order_no,
                "in_force": effects.in_force,
                "entries": effects.entries.iter().map(entry_json).collect::<Vec<_>>(),
                "saga": saga.as_ref().map(midflight_store::saga_json),
                "checked_at_ms": pass.report.started_at_ms,
            }),
        };
        let outcome = self.store.open_finding_ticket(&ticket, &self.actor).await?;
        tracing::warn!(
            kind = kind.as_str(),
            step = step.as_str(),
            request_id,
            biz_id = biz_id.unwrap_or("-"),
            ticket = ?outcome,
            "reconciliation finding"
        );
        let finding = Finding {
            kind,
            step,
            request_id: request_id.to_owned(),
            order_no: effects.order_no.clone(),
            biz_id: biz_id.map(str::to_owned),
            status: saga.map(|s| s.status),
            in_force: effects.in_force.clone(),
            ticket: outcome,
        };
        pass.report.count(finding, self.section.findings_listed_max);
        Ok(())
    }
}

impl Pass {
    fn ledger(&self, step: Step) -> &Ledger {
        match step {
            Step::Wms => &self.wms,
            Step::Logistics => &self.logistics,
        }
    }

    fn ledger_mut(&mut self, step: Step) -> &mut Ledger {
        match step {
            Step::Wms => &mut self.wms,
            Step::Logistics => &mut self.logistics,
        }
    }
}

/// The sequence numbers of the last entries a read of a whole ledger met: enough to cover the
/// stretch of `reread` numbers behind where it ends.
struct Tail {
    reread: u64,
    seqs: VecDeque<u64>,
}

impl Tail {
    fn new(reread: u64) -> Tail {
        Tail { reread, seqs: VecDeque::new() }
    }

    fn push(&mut self, page: &[LedgerEntry]) {
        self.seqs.extend(page.iter().map(|entry| entry.seq));
        let keep = usize::try_from(self.reread.saturating_add(1)).unwrap_or(usize::MAX);
        self.seqs.drain(..self.seqs.len().saturating_sub(keep));
    }

    /// The read ended at `upto`: that, and what it saw of the stretch behind.
    fn end(self, upto: u64) -> (u64, Option<Window>) {
        (upto, Window::after_read(0, upto, self.reread, self.seqs))
    }
}

fn reason(kind: FindingKind, step: Step, request_id: &str, order_no: &str, biz_id: Option<&str>) -> String {
    let (ledger, effect) = match step {
        Step::Wms => ("wms", "stock lock"),
        Step::Logistics => ("logistics", "shipment"),
    };
    let saga = biz_id.unwrap_or("-");
    match kind {
        FindingKind::Orphan => format!(
            "the {ledger} ledger holds a {effect} in force under request id {request_id} (order {order_no}) that no saga owns: \
             reverse it by hand or account for it"
        ),
        FindingKind::DoubleEffect => format!(
            "saga {saga} has more than one {effect} in force under its request id: reverse the extra ones by hand"
        ),
        FindingKind::MissingEffect => {
            format!("saga {saga} is DONE but the {ledger} ledger has no {effect} in force under its request id")
        }
        FindingKind::EffectAfterRollback => format!(
            "saga {saga} is ROLLED_BACK but its {effect} is still in force at the {ledger}: reverse it by hand with the voucher"
        ),
    }
}

fn entry_json(entry: &Evidence) -> serde_json::Value {
    serde_json::json!({
        "seq": entry.seq,
        "kind": format!("{:?}", entry.kind),
        "effect_id": entry.effect_id,
        "at_ms": entry.at_ms,
    })
}

fn step_name<S: serde::Serializer>(step: &Step, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(step.as_str())
}

fn ticket_name<S: serde::Serializer>(outcome: &TicketOutcome, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(ticket_outcome_name(*outcome))
}

/// Every ticket outcome, in the order of [`ticket_outcome_name`].
pub const TICKET_OUTCOMES: [TicketOutcome; 4] =
    [TicketOutcome::Opened, TicketOutcome::AlreadyOpen, TicketOutcome::Reopened, TicketOutcome::ResolvedBefore];

/// The name of a ticket outcome in reports (`opened`, `already_open`, ...).
pub fn ticket_outcome_name(outcome: TicketOutcome) -> &'static str {
    match outcome {
        TicketOutcome::Opened => "opened",
        TicketOutcome::AlreadyOpen => "already_open",
        TicketOutcome::Reopened => "reopened",
        TicketOutcome::ResolvedBefore => "resolved_before",
    }
}
