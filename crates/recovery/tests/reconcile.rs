//! The reconciler against the mock downstreams' real ledgers, on SQLite and MariaDB: clean
//! sagas (done, rolled back) produce no finding; a planted orphan lock and a planted double lock
//! (legacy mode, the incident's double deduction) produce one ticket each, and running again
//! opens no more.

mod common;

use std::time::{Duration, Instant};

use common::*;
use midflight_api::client::Downstreams;
use midflight_driver::Outcome;
use midflight_model::{
    Call, LogisticsAnswer, Observation, OrderEvent, Saga, Source, Status, Step, WmsAnswer, request_id,
};
use midflight_recovery::{FindingKind, ReconcileSection, Reconciler, Report};
use midflight_stack::{Faults, MockDownstreams, MockOptions};
use midflight_store::testing::{TestDb, age, execute, until};
use midflight_store::{Checkpoint, Store, TicketState, WMS_LEDGER_STEP, both_engines};

fn reconciler(store: &Store, client: Downstreams) -> Reconciler {
    // Small pages, so the paging of both the ledgers and the table is exercised.
    let section = ReconcileSection { ledger_page_entries: 3, table_page_rows: 2, ..ReconcileSection::default() };
    Reconciler::new(store.clone(), client, section, "recovery:test".to_owned())
}

async fn drive_to_end(store: &Store, client: &Downstreams, order_no: &str, region: &str, offset: i64) -> Saga {
    drive_event_to_end(store, client, event(order_no, "PAID", region), offset).await
}

async fn drive_event_to_end(store: &Store, client: &Downstreams, event: OrderEvent, offset: i64) -> Saga {
    let saga = arrive(store, &[event], offset, 30_000).await.remove(0);
    let outcome = driver(store, client.clone(), "c1", settings()).drive(saga.clone(), Instant::now()).await;
    assert!(matches!(outcome, Outcome::Finished(_)), "{outcome:?}");
    store.get(&saga.biz_id).await.expect("get").expect("row")
}

async fn finds_planted_orphan_and_double_lock(db: &TestDb) {
    let mocks = MockDownstreams::start(MockOptions::default()).await;
    let client = mocks.client();
    for i in 0..3 {
        let done = drive_to_end(&db.store, &client, &format!("O-{i}"), "CN-ZJ", i + 1).await;
        assert_eq!(done.status, Status::Done);
    }
    let rolled_back = drive_to_end(&db.store, &client, "O-XX", "XX", 10).await;
    assert_eq!(rolled_back.status, Status::RolledBack);
    let clean = reconciler(&db.store, client.clone()).run_once().await.expect("reconcile");
    assert_eq!((clean.findings_total(), clean.sagas_checked), (0, 4), "{clean:#?}");

    // An orphan: a lock under a request id no saga owns, sent straight to the WMS.
    let now = db.store.now_ms().await.expect("clock");
    let source = Source { topic: "orders".into(), partition: 0, offset: 99 };
    let ghost = Saga::received(&event("GHOST", "PAID", "CN-ZJ"), source, now, now + 60_000);
    let answer = client.call(Call::LockStock, &ghost, Duration::from_secs(5)).await;
    assert_eq!(answer, Observation::Wms(WmsAnswer::Locked));
    // A double lock: in legacy mode the WMS deduplicates on its own key, so the incident's
    // re-consumer, repeating LockStock for a finished saga, deducts a second time.
    mocks.set_wms_faults(Faults { legacy_mode: true, ..Faults::default() }).await;
    let doubled = drive_to_end(&db.store, &client, "O-LEGACY", "CN-ZJ", 20).await;
    assert_eq!(doubled.status, Status::Done);
    let again = client.call(Call::LockStock, &doubled, Duration::from_secs(5)).await;
    assert_eq!(again, Observation::Wms(WmsAnswer::Locked), "legacy mode locks again");

    let report = reconciler(&db.store, client.clone()).run_once().await.expect("reconcile");
    assert_findings(&report);
    assert_eq!((report.tickets_opened, report.tickets_already_open), (2, 0), "{report:#?}");
    let orphan_key = format!("orphan:{}", request_id(&ghost.biz_id, Step::Wms));
    for key in [orphan_key.as_str(), doubled.biz_id.as_str()] {
        let tickets = db.store.tickets_of(key).await.expect("tickets");
        assert_eq!(tickets.len(), 1, "{key}: {tickets:#?}");
        assert_eq!((tickets[0].step.as_str(), tickets[0].state), (WMS_LEDGER_STEP, TicketState::Open));
    }
    let double_ticket = db.store.tickets_of(&doubled.biz_id).await.expect("tickets").remove(0);
    assert_eq!(double_ticket.evidence["in_force"].as_array().map(Vec::len), Some(2), "{}", double_ticket.evidence);
    assert_eq!(double_ticket.evidence["saga"]["status"], "DONE");

    // A second run (here by another process) opens nothing new.
    let other = db.another_store().await;
    let second = reconciler(&other, client.clone()).run_once().await.expect("reconcile");
    assert_findings(&second);
    assert_eq!((second.tickets_opened, second.tickets_already_open), (0, 2), "{second:#?}");
    assert_eq!(db.store.open_ticket_count().await.expect("count"), 2);

    // An operator accepts the orphan (closes its ticket): the next run leaves it closed.
    let finding = db.store.open_finding(&orphan_key, WMS_LEDGER_STEP).await.expect("read").expect("a finding");
    let closed =
        db.store.close_ticket(&orphan_key, WMS_LEDGER_STEP, &finding, "alice", "reversed by hand in the wms console");
    assert!(closed.await.expect("close").is_applied());
    let third = reconciler(&db.store, client).run_once().await.expect("reconcile");
    assert_eq!((third.tickets_opened, third.tickets_resolved_before, third.tickets_already_open), (0, 1, 1));
    assert_eq!(db.store.open_ticket_count().await.expect("count"), 1);
}
both_engines!(planted_orphan_and_double_lock, finds_planted_orphan_and_double_lock);

fn assert_findings(report: &Report) {
    let mut found: Vec<(FindingKind, Step, Option<&str>)> =
        report.findings.iter().map(|f| (f.kind, f.step, f.biz_id.as_deref())).collect();
    found.sort_by_key(|(kind, _, _)| kind.as_str());
    assert_eq!(
        found,
        vec![(FindingKind::DoubleEffect, Step::Wms, Some("O-LEGACY:PAID")), (FindingKind::Orphan, Step::Wms, None)],
        "{report:#?}"
    );
    assert_eq!((report.orphans, report.double_effects, report.findings_total()), (1, 1, 2));
}

/// Saga rows the store cannot read (edited by hand: a negative version, a status no code
/// knows) are stepped over: the pass completes, counts them, neither judges their effects nor
/// calls them orphans, and still finds the orphan planted beside them, on the pages after them.
async fn unreadable_rows_do_not_stop_a_pass(db: &TestDb) {
    let mocks = MockDownstreams::start(MockOptions::default()).await;
    let client = mocks.client();
    let mut sagas = Vec::new();
    for i in 0..5 {
        sagas.push(drive_to_end(&db.store, &client, &format!("O-{i}"), "CN-ZJ", i + 1).await);
    }
    for (saga, set) in [(&sagas[0], "version = -1"), (&sagas[2], "status = 'BOGUS'")] {
        execute(&db.store, &format!("UPDATE saga SET {set} WHERE biz_id = '{}'", saga.biz_id)).await;
    }
    let now = db.store.now_ms().await.expect("clock");
    let source = Source { topic: "orders".into(), partition: 0, offset: 99 };
    let ghost = Saga::received(&event("O-9", "PAID", "CN-ZJ"), source, now, now + 60_000);
    let answer = client.call(Call::LockStock, &ghost, Duration::from_secs(5)).await;
    assert_eq!(answer, Observation::Wms(WmsAnswer::Locked));

    let report = reconciler(&db.store, client.clone()).run_once().await.expect("the pass completes");
    assert_eq!((report.unreadable, report.sagas_checked), (2, 3), "{report:#?}");
    let found: Vec<(FindingKind, Option<&str>)> =
        report.findings.iter().map(|f| (f.kind, f.biz_id.as_deref())).collect();
    assert_eq!(found, vec![(FindingKind::Orphan, None)], "only the planted orphan: {report:#?}");
    assert_eq!(report.findings[0].request_id, request_id(&ghost.biz_id, Step::Wms));

    // The periodic passes too, when a new entry names the unreadable saga: a second lock, as a
    // legacy re-consumer would send it.
    let periodic = reconciler(&db.store, client.clone());
    periodic.run_incremental().await.expect("the first (full) pass");
    mocks.set_wms_faults(Faults { legacy_mode: true, ..Faults::default() }).await;
    let again = client.call(Call::LockStock, &sagas[0], Duration::from_secs(5)).await;
    assert_eq!(again, Observation::Wms(WmsAnswer::Locked));
    let next = periodic.run_incremental().await.expect("the pass completes");
    assert_eq!((next.new_entries, next.unreadable), (1, 1), "{next:#?}");
}
both_engines!(reconcile_steps_over_unreadable_rows, unreadable_rows_do_not_stop_a_pass);

/// Periodic passes read what changed since the last one. The first, with no checkpoint, is a
/// full pass; one after nothing changed reads no entry and judges no saga; one after changes
/// to sagas finished hours before (a second lock of a DONE saga, a lock of a ROLLED_BACK one,
/// both as a legacy re-consumer would send them), a lock no saga owns, a saga finished since
/// or hours before whose lock was reversed by hand, and one marked DONE that no ledger names
/// finds them all, reading only their entries; the next passes, even once those sagas are
/// hours old,
/// judges the open findings again (their count goes on) and reads no new entry.
async fn incremental_passes_judge_what_changed(db: &TestDb) {
    const HOUR_MS: i64 = 3_600_000;
    let mocks = MockDownstreams::start(MockOptions::default()).await;
    let client = mocks.client();
    let done = drive_to_end(&db.store, &client, "O-0", "CN-ZJ", 1).await;
    let old_done = drive_to_end(&db.store, &client, "O-1", "CN-ZJ", 2).await;
    let rolled_back = drive_to_end(&db.store, &client, "O-XX", "XX", 3).await;
    let untouched = drive_to_end(&db.store, &client, "O-4", "CN-ZJ", 6).await;
    assert_eq!((done.status, rolled_back.status), (Status::Done, Status::RolledBack));
    for saga in [&done.biz_id, &old_done.biz_id, &rolled_back.biz_id, &untouched.biz_id] {
        let status = db.store.get(saga).await.expect("get").expect("row").status;
        age(&db.store, saga, status, 3 * HOUR_MS).await;
    }
    let reconciler = reconciler(&db.store, client.clone());
    let first = reconciler.run_incremental().await.expect("first pass");
    assert!(!first.incremental && first.findings_total() == 0, "a full pass: {first:#?}");
    assert_eq!(first.sagas_checked, 4);
    let (wms_end, logistics_end) = (first.wms_entries, first.logistics_entries);
    let checkpoint = db.store.reconcile_checkpoint("periodic").await.expect("read").expect("written");
    assert_eq!((checkpoint.wms_seq, checkpoint.logistics_seq), (wms_end, logistics_end), "{first:#?}");

    let quiet = reconciler.run_incremental().await.expect("quiet pass");
    assert!(quiet.incremental, "{quiet:#?}");
    assert_eq!((quiet.new_entries, quiet.wms_entries, quiet.sagas_checked, quiet.findings_total()), (0, 0, 0, 0));

    mocks.set_wms_faults(Faults { legacy_mode: true, ..Faults::default() }).await;
    for saga in [&done, &rolled_back] {
        let again = client.call(Call::LockStock, saga, Duration::from_secs(5)).await;
        assert_eq!(again, Observation::Wms(WmsAnswer::Locked), "legacy mode locks again");
    }
    mocks.set_wms_faults(Faults::default()).await;
    let now = db.store.now_ms().await.expect("clock");
    let source = Source { topic: "orders".into(), partition: 0, offset: 99 };
    let ghost = Saga::received(&event("GHOST", "PAID", "CN-ZJ"), source, now, now + 60_000);
    let answer = client.call(Call::LockStock, &ghost, Duration::from_secs(5)).await;
    assert_eq!(answer, Observation::Wms(WmsAnswer::Locked));
    let recent = drive_to_end(&db.store, &client, "O-2", "CN-ZJ", 4).await;
    for saga in [&recent, &old_done] {
        let reversed = client.call(Call::ReverseLock, saga, Duration::from_secs(5)).await;
        assert!(matches!(reversed, Observation::Wms(_)), "{reversed:?}");
    }
    // A saga marked DONE by hand that never called anyone: nothing in either ledger names it,
    // so only the read of what finished since can find it.
    let unsent = arrive(&db.store, &[event("O-3", "PAID", "CN-ZJ")], 5, 30_000).await.remove(0);
    age(&db.store, &unsent.biz_id, Status::Done, 0).await;
    // A row written in the very millisecond a pass begins is judged by the next pass (it may
    // still change): let the clock move past these writes first.
    let last_write = db.store.get(&unsent.biz_id).await.expect("get").expect("row").updated_at_ms;
    until("the clock to pass the last write", || async { db.store.now_ms().await.expect("clock") > last_write }).await;

    let changed = reconciler.run_incremental().await.expect("pass after changes");
    let mut found: Vec<(&str, Option<&str>)> =
        changed.findings.iter().map(|f| (f.kind.as_str(), f.biz_id.as_deref())).collect();
    found.sort();
    let mut expected = vec![
        (FindingKind::Orphan.as_str(), None),
        (FindingKind::DoubleEffect.as_str(), Some(done.biz_id.as_str())),
        (FindingKind::MissingEffect.as_str(), Some(recent.biz_id.as_str())),
        (FindingKind::MissingEffect.as_str(), Some(old_done.biz_id.as_str())),
        (FindingKind::MissingEffect.as_str(), Some(unsent.biz_id.as_str())),
        (FindingKind::MissingEffect.as_str(), Some(unsent.biz_id.as_str())),
        (FindingKind::EffectAfterRollback.as_str(), Some(rolled_back.biz_id.as_str())),
    ];
    expected.sort();
    assert_eq!(found, expected, "{changed:#?}");
    assert_eq!(changed.sagas_checked, 2, "only the sagas finished since: {changed:#?}");
    // The new entries: two legacy locks, the orphan, O-2's lock, its reversal and its shipment,
    // O-1's reversal.
    assert_eq!(changed.new_entries, 7, "{changed:#?}");
    assert_eq!(changed.tickets_opened, 7);
    // Every WMS entry but O-4's lock: only the ids the changes name, with their older entries.
    assert_eq!(changed.wms_entries, wms_end + 6 - 1, "{changed:#?}");

    let again = reconciler.run_incremental().await.expect("next pass");
    assert_eq!((again.new_entries, again.findings_total(), again.tickets_already_open), (0, 7, 7), "{again:#?}");
    let moved = db.store.reconcile_checkpoint("periodic").await.expect("read").expect("written");
    assert!(moved.wms_seq == wms_end + 6 && moved.logistics_seq == logistics_end + 1, "{moved:?}");
    // Once the sagas finished since have left the window, their open findings still count.
    for saga in [&recent.biz_id, &unsent.biz_id] {
        age(&db.store, saga, Status::Done, 3 * HOUR_MS).await;
    }
    let later = reconciler.run_incremental().await.expect("a later pass");
    // The five sagas with open findings, read by biz_id; none finished since.
    assert_eq!((later.sagas_checked, later.findings_total(), later.tickets_already_open), (5, 7, 7), "{later:#?}");
}
both_engines!(incremental_reconciliation, incremental_passes_judge_what_changed);

/// A downstream may show an entry after later ones (numbered when its write began, committed
/// after theirs). The periodic passes read the `ledger_reread_entries` sequence numbers behind
/// their checkpoint again and judge what the pass that set it did not see there (kept with the
/// checkpoint): an orphan lock that appears behind the checkpoint is found at the next pass,
/// counted late once, and a pass of another process (a fresh reconciler) judges nothing there
/// again. One that appears exactly `ledger_reread_entries` behind is found; one further behind
/// is not read again, and a full pass finds it.
async fn late_ledger_entries_are_judged(db: &TestDb) {
    let mocks = MockDownstreams::start(MockOptions::default()).await;
    let client = mocks.client();
    // Sagas finished hours ago, so a pass reads their entries only when the ledger names them.
    let finish = |n: i64| {
        let client = client.clone();
        async move {
            let saga = drive_to_end(&db.store, &client, &format!("O-{n}"), "CN-ZJ", n + 1).await;
            age(&db.store, &saga.biz_id, saga.status, 3 * 3_600_000).await;
        }
    };
    finish(0).await;
    let section = ReconcileSection { ledger_page_entries: 3, ledger_reread_entries: 4, ..ReconcileSection::default() };
    let reconciler = |section: &ReconcileSection| {
        Reconciler::new(db.store.clone(), client.clone(), section.clone(), "recovery:test".into())
    };
    let first = reconciler(&section).run_incremental().await.expect("first pass");
    assert_eq!((first.incremental, first.wms_entries, first.findings_total()), (false, 1, 0), "{first:#?}");

    // An orphan lock (WMS entry 2) stays out of sight while O-1's lock (3) shows.
    let now = db.store.now_ms().await.expect("clock");
    let source = Source { topic: "orders".into(), partition: 0, offset: 99 };
    let ghost =
        |n: usize| Saga::received(&event(&format!("GHOST-{n}"), "PAID", "CN-ZJ"), source.clone(), now, now + 60_000);
    let lock = |n: usize| {
        let (client, saga) = (client.clone(), ghost(n));
        async move {
            let answer = client.call(Call::LockStock, &saga, Duration::from_secs(5)).await;
            assert_eq!(answer, Observation::Wms(WmsAnswer::Locked));
        }
    };
    lock(0).await;
    mocks.hold_wms_entry(2).await;
    finish(1).await;
    let before = reconciler(&section).run_incremental().await.expect("pass before the entry shows");
    // Only O-1's lock is folded on the WMS side: entry 1, seen by the first pass, is skipped.
    assert_eq!(
        (before.new_entries, before.wms_entries, before.late_entries, before.reread_entries, before.findings_total()),
        (2, 1, 0, 0, 0),
        "{before:#?}"
    );
    let checkpoint = db.store.reconcile_checkpoint("periodic").await.expect("read").expect("written");
    assert_eq!((checkpoint.wms_seq, checkpoint.wms_unseen.as_deref()), (3, Some("0|2")), "{checkpoint:?}");

    mocks.release_wms_entry(2).await;
    let after = reconciler(&section).run_incremental().await.expect("pass after the entry shows");
    assert_eq!(
        (after.new_entries, after.late_entries, after.late_depth_max, after.reread_entries),
        (0, 1, 1, 0),
        "{after:#?}"
    );
    assert_eq!((after.orphans, after.tickets_opened), (1, 1), "{after:#?}");
    // Another reconciler (as in another process) judges nothing behind the checkpoint again:
    // only the open finding's entry is read.
    let quiet = reconciler(&section).run_incremental().await.expect("a quiet pass");
    assert_eq!(
        (quiet.late_entries, quiet.reread_entries, quiet.wms_entries, quiet.tickets_already_open),
        (0, 0, 1, 1),
        "{quiet:#?}"
    );

    // An orphan lock (entry 4) that shows once the checkpoint is four sagas' locks past it
    // (5 to 8), exactly four behind: found.
    lock(1).await;
    mocks.hold_wms_entry(4).await;
    for n in 2..6 {
        finish(n).await;
    }
    let moved = reconciler(&section).run_incremental().await.expect("pass past the held entry");
    assert_eq!((moved.new_entries, moved.late_entries, moved.orphans), (8, 0, 1), "{moved:#?}");
    mocks.release_wms_entry(4).await;
    let deepest = reconciler(&section).run_incremental().await.expect("pass after it shows");
    assert_eq!((deepest.late_entries, deepest.late_depth_max, deepest.orphans), (1, 4, 2), "{deepest:#?}");
    // The whole stretch deep: the share the metric exports is 1.
    assert_eq!(deepest.reread_stretch, section.ledger_reread_entries);
    assert_eq!(deepest.reread_stretch, 4);

    // One (entry 9) that shows five behind (10 to 14): not read again; a full pass finds it.
    lock(2).await;
    mocks.hold_wms_entry(9).await;
    for n in 6..11 {
        finish(n).await;
    }
    reconciler(&section).run_incremental().await.expect("pass past the held entry");
    mocks.release_wms_entry(9).await;
    let missed = reconciler(&section).run_incremental().await.expect("pass after it shows");
    assert_eq!((missed.late_entries, missed.orphans), (0, 2), "only the first two orphans, still open: {missed:#?}");
    let full = reconciler(&section).run_once().await.expect("full pass");
    assert_eq!((full.orphans, full.tickets_opened), (3, 1), "{full:#?}");
}
both_engines!(reconcile_judges_late_ledger_entries, late_ledger_entries_are_judged);

async fn ledger_too_large_is_an_error(db: &TestDb) {
    let mocks = MockDownstreams::start(MockOptions::default()).await;
    let client = mocks.client();
    for i in 0..3 {
        drive_to_end(&db.store, &client, &format!("O-{i}"), "CN-ZJ", i + 1).await;
    }
    let section = ReconcileSection { ledger_entries_max: 2, ..ReconcileSection::default() };
    let error = Reconciler::new(db.store.clone(), client.clone(), section, "test".into()).run_once().await;
    let error = error.expect_err("a ledger over the limit is not reconciled in part");
    assert!(error.to_string().contains("ledger_entries_max"), "{error}");
    assert_eq!(db.store.open_ticket_count().await.expect("count"), 0);
    for saga in db.store.page("", 10).await.expect("page") {
        age(&db.store, &saga.biz_id, saga.status, 3_600_000).await;
    }

    execute(&db.store, "UPDATE outbox SET published_at_ms = 1").await;

    // The periodic passes start from the ledgers' current ends instead, and judge what comes
    // after (here an orphan lock) and the sagas finished before, a share a pass (here one: a
    // table page of one row). Nothing read again behind the checkpoint: at most an eighth of
    // ledger_entries_max.
    let periodic_section = ReconcileSection {
        ledger_entries_max: 2,
        ledger_page_entries: 2,
        ledger_reread_entries: 0,
        table_page_rows: 1,
        ..ReconcileSection::default()
    };
    let periodic = Reconciler::new(db.store.clone(), client.clone(), periodic_section.clone(), "test".into());
    let first = periodic.run_incremental().await.expect("starts from the ends");
    assert!(first.incremental && first.behind && first.findings_total() == 0, "{first:#?}");
    assert_eq!(first.sagas_checked, 0, "{first:#?}");
    let checkpoint = db.store.reconcile_checkpoint("periodic").await.expect("read").expect("written");
    assert_eq!((checkpoint.wms_seq, checkpoint.logistics_seq, checkpoint.since_ms), (3, 3, 0));
    // The purge (here a horizon of half an hour) keeps every saga no pass has judged yet.
    let purge = |since_ms| db.store.purge_finished(1_800_000, Some(since_ms), 500);
    assert_eq!(purge(checkpoint.since_ms).await.expect("purge").sagas, 0, "nothing judged yet");
    let now = db.store.now_ms().await.expect("clock");
    let source = Source { topic: "orders".into(), partition: 0, offset: 99 };
    let ghost = Saga::received(&event("GHOST", "PAID", "CN-ZJ"), source.clone(), now, now + 60_000);
    assert_eq!(client.call(Call::LockStock, &ghost, Duration::from_secs(5)).await, Observation::Wms(WmsAnswer::Locked));
    // The ledgers' history is never folded whole again: a bound of four entries holds the
    // passes below (a saga or two and the orphan each).
    let section = ReconcileSection { ledger_entries_max: 4, ..periodic_section.clone() };
    let periodic = Reconciler::new(db.store.clone(), client.clone(), section, "test".into());
    let (mut passes, mut new_entries, mut opened, mut judged, mut purged) = (0, 0, 0, 0, 0);
    loop {
        let next = periodic.run_incremental().await.expect("next pass");
        passes += 1;
        (new_entries, opened, judged) =
            (new_entries + next.new_entries, opened + next.tickets_opened, judged + next.sagas_checked);
        assert_eq!(next.findings_total(), next.orphans, "the orphan, found again while open: {next:#?}");
        // What the checkpoint lets the purge delete has been judged by a pass.
        let at = db.store.reconcile_checkpoint("periodic").await.expect("read").expect("written");
        purged += purge(at.since_ms).await.expect("purge").sagas;
        assert!(purged <= judged, "{purged} purged, {judged} judged after pass {passes}: {at:?}");
        if !next.behind {
            break;
        }
        assert!(passes < 10, "{next:#?}");
    }
    assert_eq!((new_entries, opened, purged), (1, 1, 3), "the orphan once; the three old sagas judged and purged");

    // A backlog past a pass's bound (here two entries a ledger) is taken in steps: each pass
    // says it is behind, the next goes on from there, and every orphan is found once.
    for n in 0..5 {
        let ghost = Saga::received(&event(&format!("GHOST-{n}"), "PAID", "CN-ZJ"), source.clone(), now, now + 60_000);
        assert_eq!(
            client.call(Call::LockStock, &ghost, Duration::from_secs(5)).await,
            Observation::Wms(WmsAnswer::Locked)
        );
    }
    let section = ReconcileSection {
        ledger_entries_max: 16,
        ledger_page_entries: 2,
        ledger_reread_entries: 0,
        ..ReconcileSection::default()
    };
    let stepwise = Reconciler::new(db.store.clone(), client.clone(), section, "test".into());
    let (mut passes, mut opened) = (0, 0);
    loop {
        let pass = stepwise.run_incremental().await.expect("a pass through the backlog");
        passes += 1;
        opened += pass.tickets_opened;
        if !pass.behind {
            break;
        }
        assert!(passes < 10, "{pass:#?}");
    }
    assert_eq!((passes, opened), (3, 5), "two passes behind, then the last");
    let at = db.store.reconcile_checkpoint("periodic").await.expect("read").expect("written");
    assert_eq!(at.wms_seq, 9, "{at:?}");
}
both_engines!(reconcile_refuses_an_oversized_ledger, ledger_too_large_is_an_error);

/// An incremental pass judges an effect under the derived id of a saga that never recorded
/// that step's intent as a full pass does: an orphan (here a shipment made under the request id
/// of a saga the WMS turned down, which rolled back before any shipment intent).
async fn an_effect_no_intent_named_is_an_orphan(db: &TestDb) {
    let stock = [("SKU-0001".to_owned(), 1_000), ("SKU-0009".to_owned(), 0)].into_iter().collect();
    let mocks = MockDownstreams::start(MockOptions { stock, ..MockOptions::default() }).await;
    let client = mocks.client();
    drive_to_end(&db.store, &client, "O-1", "CN-ZJ", 1).await;
    let first = reconciler(&db.store, client.clone()).run_incremental().await.expect("first pass");
    assert_eq!(first.findings_total(), 0, "{first:#?}");
    let mut refused = event("O-REJ", "PAID", "CN-ZJ");
    refused.lines[0].sku = "SKU-0009".into();
    let rejected = drive_event_to_end(&db.store, &client, refused, 2).await;
    assert_eq!((rejected.status, rejected.logistics_request_id.as_deref()), (Status::RolledBack, None));
    let shipped = client.call(Call::CreateShipment, &rejected, Duration::from_secs(5)).await;
    assert!(matches!(shipped, Observation::Logistics(LogisticsAnswer::Created { .. })), "{shipped:?}");
    let last_write = db.store.get(&rejected.biz_id).await.expect("get").expect("row").updated_at_ms;
    until("the clock to pass the last write", || async { db.store.now_ms().await.expect("clock") > last_write }).await;

    let next = reconciler(&db.store, client).run_incremental().await.expect("next pass");
    let found: Vec<(FindingKind, Step, Option<&str>)> =
        next.findings.iter().map(|f| (f.kind, f.step, f.biz_id.as_deref())).collect();
    assert_eq!(found, [(FindingKind::Orphan, Step::Logistics, None)], "{next:#?}");
    assert_eq!(next.findings[0].request_id, request_id(&rejected.biz_id, Step::Logistics));
}
both_engines!(an_incremental_pass_finds_an_effect_no_intent_named, an_effect_no_intent_named_is_an_orphan);

/// The effects of purged sagas are judged by their business rows, which are kept: one lock
/// and one shipment of a shipped order are the saga's (`owned_by_purged`), a second lock is a
/// double effect, a lock in force after a reversal an effect after rollback. An effect no saga
/// ever owned is an orphan, and so is one under the derived id of a saga whose row still
/// exists but never recorded it, or of a purged saga whose business row is gone too.
async fn purged_sagas_effects_are_judged_by_their_business_rows(db: &TestDb) {
    const HOUR_MS: i64 = 3_600_000;
    let stock = [("SKU-0001".to_owned(), 1_000), ("SKU-0009".to_owned(), 0)].into_iter().collect();
    let mocks = MockDownstreams::start(MockOptions { stock, ..MockOptions::default() }).await;
    let client = mocks.client();
    let done = [
        drive_to_end(&db.store, &client, "O-OLD-0", "CN-ZJ", 1).await,
        drive_to_end(&db.store, &client, "O-OLD-1", "CN-ZJ", 2).await,
    ];
    let reversed = drive_to_end(&db.store, &client, "O-OLD-XX", "XX", 3).await;
    assert_eq!((done[0].status, done[1].status, reversed.status), (Status::Done, Status::Done, Status::RolledBack));
    // The incident's second deduction for O-OLD-0, and a lock for O-OLD-XX after its reversal.
    mocks.set_wms_faults(Faults { legacy_mode: true, ..Faults::default() }).await;
    for saga in [&done[0], &reversed] {
        let again = client.call(Call::LockStock, saga, Duration::from_secs(5)).await;
        assert_eq!(again, Observation::Wms(WmsAnswer::Locked));
    }
    mocks.set_wms_faults(Faults::default()).await;
    for saga in done.iter().chain([&reversed]) {
        age(&db.store, &saga.biz_id, saga.status, 72 * HOUR_MS).await;
    }
    execute(&db.store, "UPDATE outbox SET published_at_ms = 1").await;
    let deleted = db.store.purge_finished(48 * HOUR_MS, None, 500).await.expect("purge");
    assert_eq!(deleted.sagas, 3, "{deleted:?}");

    // Kept: a saga the WMS turned down (no stock), rolled back with no shipment recorded; a
    // shipment is then made under its derived request id.
    let mut refused = event("O-REJ", "PAID", "CN-ZJ");
    refused.lines[0].sku = "SKU-0009".into();
    let rejected = drive_event_to_end(&db.store, &client, refused, 4).await;
    assert_eq!(rejected.status, Status::RolledBack);
    let shipped = client.call(Call::CreateShipment, &rejected, Duration::from_secs(5)).await;
    assert!(matches!(shipped, Observation::Logistics(LogisticsAnswer::Created { .. })), "{shipped:?}");
    let now = db.store.now_ms().await.expect("clock");
    let source = Source { topic: "orders".into(), partition: 0, offset: 99 };
    let ghost = Saga::received(&event("GHOST", "PAID", "CN-ZJ"), source, now, now + 60_000);
    let answer = client.call(Call::LockStock, &ghost, Duration::from_secs(5)).await;
    assert_eq!(answer, Observation::Wms(WmsAnswer::Locked));

    let report = reconciler(&db.store, client.clone()).run_once().await.expect("reconcile");
    let mut found: Vec<(FindingKind, Step, Option<&str>)> =
        report.findings.iter().map(|f| (f.kind, f.step, f.biz_id.as_deref())).collect();
    found.sort_by_key(|(kind, step, biz_id)| (kind.as_str(), step.as_str(), biz_id.map(str::to_owned)));
    assert_eq!(
        found,
        [
            (FindingKind::DoubleEffect, Step::Wms, Some(done[0].biz_id.as_str())),
            (FindingKind::EffectAfterRollback, Step::Wms, Some(reversed.biz_id.as_str())),
            (FindingKind::Orphan, Step::Logistics, None),
            (FindingKind::Orphan, Step::Wms, None),
        ],
        "{report:#?}"
    );
    // O-OLD-0's shipment, O-OLD-1's lock and shipment.
    assert_eq!(report.owned_by_purged, 3, "{report:#?}");

    // Without its business row, a purged saga's effects are orphans like any other.
    let sql = format!("DELETE FROM orders WHERE biz_id = '{}'", done[1].biz_id);
    assert_eq!(execute(&db.store, &sql).await, 1);
    let report = reconciler(&db.store, client).run_once().await.expect("reconcile");
    assert_eq!((report.orphans, report.owned_by_purged), (4, 1), "{report:#?}");
}
both_engines!(purged_sagas_are_judged_by_business_rows, purged_sagas_effects_are_judged_by_their_business_rows);

/// With periodic reconciliation on, the purge keeps the finished sagas no pass has judged:
/// every one before a pass has completed, then those whose last lease ended at or after the
/// checkpoint's `since_ms` (what the next pass reads), past the horizon or not. A full periodic
/// pass (`reconcile.incremental` off) moves the checkpoint as an incremental one does.
async fn purge_waits_for_the_reconciliation(db: &TestDb) {
    const HOUR_MS: i64 = 3_600_000;
    let mocks = MockDownstreams::start(MockOptions::default()).await;
    let client = mocks.client();
    let mut sagas = Vec::new();
    for (i, hours) in [40, 30, 0].into_iter().enumerate() {
        let saga = drive_to_end(&db.store, &client, &format!("O-{hours}H"), "CN-ZJ", i as i64 + 1).await;
        assert_eq!(saga.status, Status::Done);
        if hours > 0 {
            age(&db.store, &saga.biz_id, Status::Done, hours * HOUR_MS).await;
        }
        sagas.push(saga.biz_id);
    }
    let [old, younger, recent] = <[String; 3]>::try_from(sagas).expect("three");
    execute(&db.store, "UPDATE outbox SET published_at_ms = 1").await;
    let all = kept(&db.store).await;
    assert_eq!(all.len(), 3);

    // A purge of 24 hours, a round every 20 ms, waiting for the reconciliation.
    let (stats, shutdown, running) = purge_beside(&db.store, None, true, 20);
    until("two rounds without a pass", || async { stats.snapshot().purge_unreconciled >= 2 }).await;
    assert_eq!(kept(&db.store).await, all, "nothing is purged before a pass has judged it");

    // A checkpoint whose pass began 35 hours ago judged the 40-hour saga, not the 30-hour one.
    let now = db.store.now_ms().await.expect("clock");
    let behind = Checkpoint { since_ms: now - 35 * HOUR_MS, ..Checkpoint::default() };
    assert!(db.store.advance_reconcile_checkpoint("periodic", None, &behind).await.expect("checkpoint"));
    until("the 40-hour saga to be purged", || async { !kept(&db.store).await.contains(&old) }).await;
    let waited = stats.snapshot().purge_unreconciled;
    until("two more rounds held back", || async { stats.snapshot().purge_unreconciled >= waited + 2 }).await;
    let mut expected = vec![younger.clone(), recent.clone()];
    expected.sort();
    assert_eq!(kept(&db.store).await, expected, "the 30-hour saga is past the horizon but not judged yet");

    // A full periodic pass judges everything and moves the checkpoint to its start.
    let full = ReconcileSection { incremental: false, ..ReconcileSection::default() };
    let pass = Reconciler::new(db.store.clone(), client, full, "test".into()).run_periodic().await.expect("pass");
    assert!(!pass.incremental, "{pass:#?}");
    assert_eq!((pass.findings_total(), pass.sagas_checked), (0, 2), "{pass:#?}");
    let at = db.store.reconcile_checkpoint("periodic").await.expect("read").expect("written");
    assert!(at.since_ms >= now - 120_000, "moved to the pass's start: {at:?}");
    assert!(at.wms_seq >= 2 && at.logistics_seq >= 2, "the ledgers as the pass read them: {at:?}");
    // Counted once the batch has returned, a moment after its rows are gone.
    until("the 30-hour saga to be purged", || async {
        stats.snapshot().purged_sagas == 2 && !kept(&db.store).await.contains(&younger)
    })
    .await;
    shutdown.cancel();
    running.await.expect("purge task");
    assert_eq!(kept(&db.store).await, vec![recent], "the recent saga is within the horizon");
    assert_eq!(stats.snapshot().purged_sagas, 2);
}
both_engines!(purge_keeps_what_no_pass_has_judged, purge_waits_for_the_reconciliation);

/// A periodic pass that reaches its bound among sagas finished a moment ago (whose lease ends
/// lie ahead of the present) moves the checkpoint only to its start less the margin, and is not
/// behind: a saga finishing after it with an earlier lease end (here as an operator's resolve
/// writes it, the lease ended at once) is still read, and judged, by the next pass.
async fn a_pass_near_the_present_keeps_its_margin(db: &TestDb) {
    let mocks = MockDownstreams::start(MockOptions::default()).await;
    let client = mocks.client();
    for i in 0..3 {
        drive_to_end(&db.store, &client, &format!("O-NOW-{i}"), "CN-ZJ", i + 1).await;
    }
    let saga = drive_to_end(&db.store, &client, "O-RESOLVED", "CN-ZJ", 9).await;
    // Every ledger entry is read by the first pass.
    let first = reconciler(&db.store, client.clone()).run_incremental().await.expect("first pass");
    assert_eq!((first.findings_total(), first.behind), (0, false), "{first:#?}");

    // A share of one saga a pass (an eighth of eight entries), a table page of one row.
    let section = ReconcileSection {
        ledger_entries_max: 8,
        ledger_reread_entries: 0,
        table_page_rows: 1,
        ..ReconcileSection::default()
    };
    let small = Reconciler::new(db.store.clone(), client.clone(), section, "test".into());
    let pass = small.run_incremental().await.expect("pass");
    let at = db.store.reconcile_checkpoint("periodic").await.expect("read").expect("written");
    assert_eq!(at.since_ms, pass.started_at_ms - 60_000, "{at:?} {pass:#?}");
    assert!(!pass.behind && pass.sagas_checked >= 1, "{pass:#?}");

    // Now the saga is set to ROLLED_BACK, its lease ended at once, with its lock and shipment
    // still in force: the next pass finds the effects after rollback. A millisecond back, so the
    // row changed before the pass starts even when both fall in one millisecond of the clock (a
    // row changed in the pass's first millisecond is not settled for it).
    let ended = db.store.now_ms().await.expect("clock") - 1;
    let sql = format!(
        "UPDATE saga SET status = 'ROLLED_BACK', updated_at_ms = {ended}, lease_until_ms = {ended} WHERE biz_id = '{}'",
        saga.biz_id
    );
    assert_eq!(execute(&db.store, &sql).await, 1);
    // Nothing read again behind the checkpoint: only the sagas finished since name the saga.
    let section = ReconcileSection { ledger_reread_entries: 0, ..ReconcileSection::default() };
    let next = Reconciler::new(db.store.clone(), client, section, "test".into()).run_incremental().await;
    let next = next.expect("next pass");
    let found: Vec<(FindingKind, Step, Option<&str>)> =
        next.findings.iter().map(|f| (f.kind, f.step, f.biz_id.as_deref())).collect();
    let after_rollback = |step| (FindingKind::EffectAfterRollback, step, Some(saga.biz_id.as_str()));
    assert_eq!(found, [after_rollback(Step::Wms), after_rollback(Step::Logistics)], "{next:#?}");
}
both_engines!(a_pass_stopped_near_the_present_keeps_its_margin, a_pass_near_the_present_keeps_its_margin);
