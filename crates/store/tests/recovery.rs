//! The store operations recovery and reconciliation use: the paged recovery scan, lookups by
//! request id, the narrow table pass, and reconciliation tickets. Each body runs on SQLite and
//! on MySQL/MariaDB (see `both_engines!`).

use midflight_model::{Address, Change, Line, OrderEvent, Saga, Source, Status, Step, request_id};
use midflight_store::testing::{TestDb, execute};
use midflight_store::{
    Cas, Checkpoint, Error, FindingTicket, LOGISTICS_LEDGER_STEP, ScanCursor, Store, TicketOutcome, TicketState,
    WMS_LEDGER_STEP, both_engines,
};

const LEASE_MS: i64 = 60_000;

fn event(order_no: &str) -> OrderEvent {
    OrderEvent {
        order_no: order_no.into(),
        event_type: "PAID".into(),
        lines: vec![Line { sku: "SKU-0001".into(), quantity: 1 }],
        address: Address {
            region: "CN-SH".into(),
            city: String::new(),
            line: String::new(),
            postal_code: String::new(),
        },
        amount_cents: 100,
    }
}

/// Inserts RECEIVED rows for `orders` (offsets 1..), leased for `lease_ms`.
async fn arrive(store: &Store, orders: &[&str], lease_ms: i64) -> Vec<Saga> {
    let now = store.now_ms().await.expect("clock");
    let sagas: Vec<Saga> = orders
        .iter()
        .enumerate()
        .map(|(i, order)| {
            let source = Source { topic: "orders".into(), partition: 0, offset: i as i64 + 1 };
            Saga::received(&event(order), source, now, now + 600_000)
        })
        .collect();
    let arrivals = store.insert_arrivals(&sagas, "c1", lease_ms, "consumer:c1").await.expect("insert");
    arrivals.into_iter().map(|a| a.saga().expect("readable").clone()).collect()
}

async fn paged_scan_walks_the_whole_backlog(db: &TestDb) {
    let store = &db.store;
    let orders: Vec<String> = (0..7).map(|i| format!("O-{i}")).collect();
    let names: Vec<&str> = orders.iter().map(String::as_str).collect();
    arrive(store, &names, 0).await;
    arrive(store, &["LIVE"], LEASE_MS).await;
    let mut seen = Vec::new();
    let mut cursor: Option<ScanCursor> = None;
    for _ in 0..10 {
        let page = store.abandoned_after(cursor.as_ref(), 3).await.expect("scan");
        assert!(page.unreadable.is_empty(), "{:?}", page.unreadable);
        seen.extend(page.sagas.iter().map(|s| s.biz_id.clone()));
        assert_eq!(page.next.is_some(), page.sagas.len() == 3, "a next page after a full one only");
        if page.next.is_none() {
            break;
        }
        assert_eq!(page.next, page.sagas.last().map(ScanCursor::after));
        cursor = page.next;
    }
    let mut expected: Vec<String> = orders.iter().map(|o| format!("{o}:PAID")).collect();
    let mut sorted = seen.clone();
    sorted.sort();
    expected.sort();
    assert_eq!(sorted, expected, "every abandoned row once, the live one never: {seen:?}");
    let first = store.abandoned_after(None, 100).await.expect("scan").sagas.len();
    assert_eq!(first, store.abandoned(100).await.expect("scan").len(), "same rows as the unpaged scan");
}
both_engines!(paged_recovery_scan, paged_scan_walks_the_whole_backlog);

async fn unreadable_rows_are_stepped_over(db: &TestDb) {
    let store = &db.store;
    let sagas = arrive(store, &["O-1", "O-2", "O-3", "O-4"], 0).await;
    // Two rows a person edited by hand into values no saga can have, the first of them at the
    // head of the scan's order.
    let sql = |biz_id: &str, set: &str| format!("UPDATE saga SET {set} WHERE biz_id = '{biz_id}'");
    execute(store, &sql(&sagas[1].biz_id, "version = -1, lease_until_ms = lease_until_ms - 1000")).await;
    execute(store, &sql(&sagas[3].biz_id, "attempts = -5")).await;

    let first = store.abandoned_after(None, 2).await.expect("a page with an unreadable row is still read");
    let unreadable: Vec<&str> = first.unreadable.iter().map(|u| u.biz_id.as_str()).collect();
    assert_eq!(unreadable, [sagas[1].biz_id.as_str()]);
    let error = first.unreadable[0].error.to_string();
    assert!(error.contains(&sagas[1].biz_id) && error.contains("negative version -1"), "{error}");
    assert_eq!(first.sagas.len(), 1, "{:?}", first.sagas);
    let next = first.next.expect("a full page has a next page, whatever its last row was");

    let second = store.abandoned_after(Some(&next), 2).await.expect("scan");
    let mut seen: Vec<String> = first.sagas.iter().chain(&second.sagas).map(|s| s.biz_id.clone()).collect();
    seen.sort();
    assert_eq!(seen, [sagas[0].biz_id.clone(), sagas[2].biz_id.clone()], "every readable row once");
    let unreadable: Vec<&str> = second.unreadable.iter().map(|u| u.biz_id.as_str()).collect();
    assert_eq!(unreadable, [sagas[3].biz_id.as_str()]);
    let last = second.next.expect("the second page is full too");
    let third = store.abandoned_after(Some(&last), 2).await.expect("scan");
    assert!(third.sagas.is_empty() && third.unreadable.is_empty() && third.next.is_none(), "{third:?}");
}
both_engines!(recovery_scan_steps_over_unreadable_rows, unreadable_rows_are_stepped_over);

/// The reconciliation checkpoint: absent, inserted once, advanced only from where it is; and
/// the sagas finished since a time, per status, a page at a time, old ones left out.
async fn checkpoint_and_what_finished_since(db: &TestDb) {
    let store = &db.store;
    assert_eq!(store.reconcile_checkpoint("periodic").await.expect("read"), None);
    let first = Checkpoint { wms_seq: 3, logistics_seq: 2, since_ms: 1_000, ..Checkpoint::default() };
    assert!(store.advance_reconcile_checkpoint("periodic", None, &first).await.expect("insert"));
    assert!(!store.advance_reconcile_checkpoint("periodic", None, &first).await.expect("insert again"), "only once");
    assert_eq!(store.reconcile_checkpoint("periodic").await.expect("read"), Some(first.clone()));
    // What the pass did not see goes with the checkpoint, and is not compared.
    let second = Checkpoint {
        wms_seq: 9,
        logistics_seq: 8,
        since_ms: 2_000,
        wms_unseen: Some("3|5,7-8".to_owned()),
        logistics_unseen: None,
    };
    assert!(store.advance_reconcile_checkpoint("periodic", Some(&first), &second).await.expect("advance"));
    let stale = Checkpoint { wms_seq: 5, ..first.clone() };
    assert!(!store.advance_reconcile_checkpoint("periodic", Some(&first), &stale).await.expect("advance"), "moved on");
    assert_eq!(store.reconcile_checkpoint("periodic").await.expect("read"), Some(second));
    assert_eq!(store.reconcile_checkpoint("other").await.expect("read"), None, "names are apart");

    const HOUR_MS: i64 = 3_600_000;
    let sagas = midflight_store::testing::arrive_orders(store, &["F-1", "F-2", "F-3", "F-4", "F-5"]).await;
    for (saga, status, ago_hours) in [
        (&sagas[0], Status::Done, 1),
        (&sagas[1], Status::Done, 3),
        (&sagas[2], Status::RolledBack, 1),
        (&sagas[3], Status::Done, 0),
    ] {
        midflight_store::testing::age(store, &saga.biz_id, status, ago_hours * HOUR_MS).await;
    }
    let since = store.now_ms().await.expect("clock") - 2 * HOUR_MS;
    let mut done = Vec::new();
    let mut after = None;
    loop {
        let page = store.finished_since(Status::Done, since, after.as_ref(), 1).await.expect("page");
        assert!(page.unreadable.is_empty());
        done.extend(page.views.iter().map(|v| v.biz_id.clone()));
        let Some(next) = page.next else { break };
        after = Some(next);
    }
    assert_eq!(done, [sagas[0].biz_id.clone(), sagas[3].biz_id.clone()], "oldest first; the 3-hour one left out");
    let rolled_back = store.finished_since(Status::RolledBack, since, None, 10).await.expect("page");
    let ids: Vec<&str> = rolled_back.views.iter().map(|v| v.biz_id.as_str()).collect();
    assert_eq!((ids, rolled_back.next.is_none()), (vec![sagas[2].biz_id.as_str()], true));
    assert_eq!(rolled_back.views[0].status, Status::RolledBack);
}
both_engines!(reconcile_checkpoint_and_finished_sagas, checkpoint_and_what_finished_since);

async fn request_ids_find_their_saga(db: &TestDb) {
    let store = &db.store;
    let saga = arrive(store, &["O-1"], LEASE_MS).await.remove(0);
    arrive(store, &["O-2"], LEASE_MS).await;
    let now = store.now_ms().await.expect("clock");
    let change = Change {
        record_wms_intent: true,
        ..Change::to(&[Status::DbWritten, Status::WmsRequested], "test: intent recorded")
    };
    let written = store.write(&saga, &change, now, LEASE_MS, "test").await.expect("write").applied().expect("applied");
    let wms_id = request_id(&saga.biz_id, Step::Wms);
    let (found, unreadable) =
        store.owners_of(Step::Wms, &[wms_id.clone(), "mf-wms-unknown".into()]).await.expect("lookup");
    assert!(unreadable.is_empty());
    assert_eq!(found.iter().map(|s| s.biz_id.as_str()).collect::<Vec<_>>(), vec![saga.biz_id.as_str()]);
    assert!(store.owners_of(Step::Logistics, &[wms_id]).await.expect("lookup").0.is_empty(), "steps do not mix");

    let page = store.ledger_view_page("", 10).await.expect("page");
    assert!(page.unreadable.is_empty() && page.next_after.is_none(), "{page:?}");
    let views = page.views;
    assert_eq!(views.len(), 2);
    assert_eq!((views[0].status, views[0].version), (Status::WmsRequested, written.version));
    assert_eq!(views[0].request_id(Step::Wms), written.wms_request_id.as_deref());
    assert_eq!(views[1].request_id(Step::Wms), None);
    assert_eq!(store.ledger_view_page(&views[0].biz_id, 10).await.expect("page").views.len(), 1, "keyset on biz_id");
    let full = store.ledger_view_page("", 1).await.expect("page");
    assert_eq!(full.next_after.as_deref(), Some(views[0].biz_id.as_str()), "a full page names where the next starts");
}
both_engines!(lookup_by_request_id, request_ids_find_their_saga);

fn finding(fingerprint: &str) -> FindingTicket {
    FindingTicket {
        key: "orphan:mf-wms-x".into(),
        step: WMS_LEDGER_STEP,
        reason: "an orphan lock".into(),
        fingerprint: fingerprint.into(),
        evidence: serde_json::json!({ "kind": "orphan", "in_force": ["LCK1"] }),
    }
}

async fn finding_tickets_are_idempotent(db: &TestDb) {
    let store = &db.store;
    let open = |t: FindingTicket| async move { store.open_finding_ticket(&t, "recovery:r1").await.expect("open") };
    assert_eq!(open(finding("orphan:LCK1")).await, TicketOutcome::Opened);
    assert_eq!(open(finding("orphan:LCK1")).await, TicketOutcome::AlreadyOpen);
    assert_eq!(open(finding("orphan:LCK1,LCK2")).await, TicketOutcome::AlreadyOpen, "an open ticket is left alone");
    let tickets = store.tickets_of("orphan:mf-wms-x").await.expect("tickets");
    assert_eq!(tickets.len(), 1);
    assert_eq!(tickets[0].evidence["fingerprint"], "orphan:LCK1");

    let close = |fingerprint: &'static str, operator: &'static str| async move {
        store.close_ticket("orphan:mf-wms-x", WMS_LEDGER_STEP, fingerprint, operator, "reversed by hand").await
    };
    assert_eq!(store.open_finding("orphan:mf-wms-x", WMS_LEDGER_STEP).await.expect("read"), Some("orphan:LCK1".into()));
    assert_eq!(close("orphan:LCK9", "alice").await.expect("close"), Cas::Conflict, "not the finding it holds");
    assert_eq!(close("orphan:LCK1", "alice").await.expect("close"), Cas::Applied(()));
    assert_eq!(close("orphan:LCK1", "bob").await.expect("close"), Cas::Conflict, "closing twice is refused");
    assert_eq!(open(finding("orphan:LCK1")).await, TicketOutcome::ResolvedBefore, "an accepted finding stays closed");
    assert_eq!(open(finding("orphan:LCK3")).await, TicketOutcome::Reopened, "a new finding on the key reopens it");
    let tickets = store.tickets_of("orphan:mf-wms-x").await.expect("tickets");
    assert_eq!((tickets.len(), tickets[0].state), (1, TicketState::Open));
    assert_eq!(tickets[0].resolved_by.as_deref(), Some("alice"), "the last resolution stays visible");
    // A close of the finding first looked at does not accept the one the ticket holds now.
    assert_eq!(close("orphan:LCK1", "bob").await.expect("close"), Cas::Conflict, "reopened with another finding");
    assert_eq!(store.tickets_of("orphan:mf-wms-x").await.expect("tickets")[0].state, TicketState::Open);

    let wrong = store.close_ticket("O-1:PAID", "WMS", "x", "alice", "no").await;
    assert!(matches!(wrong, Err(Error::Invalid(_))), "a saga's review ticket is closed by resolving the saga");
    let other_step = FindingTicket { step: LOGISTICS_LEDGER_STEP, ..finding("orphan:T1") };
    assert_eq!(open(other_step).await, TicketOutcome::Opened, "one ticket per key and step");
}
both_engines!(finding_tickets, finding_tickets_are_idempotent);
