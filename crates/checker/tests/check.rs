//! The checker on a real run (driver + mocks + store), then on the same snapshot with one
//! violation planted at a time: each planted break must be reported under its invariant, and
//! the clean run must report nothing.

use std::time::{Duration, Instant};

use midflight_api::client::{LedgerEntry, LedgerKind};
use midflight_checker::{Expected, Snapshot, check};
use midflight_driver::{Driver, DriverSettings, Outcome};
use midflight_model::{Address, Line, OrderEvent, RetryPolicy, Rules, Saga, Source, Status, Step, request_id};
use midflight_stack::{MockDownstreams, MockOptions};
use midflight_store::testing::TestDb;
use midflight_store::{Arrival, Transition, both_engines};
use tokio_util::sync::CancellationToken;

fn event(order_no: &str, event_type: &str, region: &str) -> OrderEvent {
    OrderEvent {
        order_no: order_no.into(),
        event_type: event_type.into(),
        lines: vec![Line { sku: "SKU-0001".into(), quantity: 1 }],
        address: Address {
            region: region.into(),
            city: String::new(),
            line: String::new(),
            postal_code: String::new(),
        },
        amount_cents: 100,
    }
}

/// Runs four sagas to DONE (two of one order), one to ROLLED_BACK, parks one poison message.
async fn clean_run(db: &TestDb, mocks: &MockDownstreams) -> (Snapshot, Expected) {
    let store = &db.store;
    let rules =
        Rules { retry: RetryPolicy { backoff_base_ms: 1, backoff_max_ms: 1, attempts_max: 5 }, ..Rules::default() };
    let driver = Driver::new(
        store.clone(),
        mocks.client(),
        rules,
        DriverSettings::default(),
        "c1".into(),
        "consumer:c1".into(),
        CancellationToken::new(),
    );
    let now = store.now_ms().await.expect("clock");
    let events = [
        event("O-1", "PAID", "CN"),
        event("O-2", "PAID", "CN"),
        event("O-3", "PAID", "XX"),
        event("O-1", "REPAID", "CN"),
    ];
    let mut batch: Vec<Saga> = events
        .iter()
        .enumerate()
        .map(|(i, e)| {
            Saga::received(e, Source { topic: "orders".into(), partition: 0, offset: i as i64 }, now, now + 600_000)
        })
        .collect();
    let poison_source = Source { topic: "orders".into(), partition: 0, offset: 9 };
    let error = OrderEvent::parse(b"nope").expect_err("poison");
    batch.push(Saga::parked(poison_source, "nope".into(), &error, now));
    let arrivals = store.insert_arrivals(&batch, "c1", 30_000, "consumer:c1").await.expect("insert");
    for arrival in arrivals {
        if let Arrival::Fresh(saga) = arrival {
            let outcome = driver.drive(saga, Instant::now()).await;
            assert!(matches!(outcome, Outcome::Finished(_)), "{outcome:?}");
        }
    }
    let snapshot = Snapshot::collect(store, &mocks.client(), Duration::from_secs(5)).await.expect("collect");
    let expected =
        Expected { orders: events.iter().map(OrderEvent::biz_id).collect(), poison: vec!["parked:orders:0:9".into()] };
    (snapshot, expected)
}

/// A ledger entry of order O-2.
fn lock(request_id: String, effect_id: &str, seq: u64, kind: LedgerKind) -> LedgerEntry {
    LedgerEntry { seq, kind, request_id, order_no: "O-2".into(), effect_id: effect_id.into(), at_ms: 0 }
}

fn invariants(snapshot: &Snapshot, expected: &Expected) -> Vec<&'static str> {
    let mut found: Vec<&'static str> = check(snapshot, expected).violations.iter().map(|v| v.invariant).collect();
    found.dedup();
    found
}

/// The last row of `biz_id`'s log.
fn last_row(snapshot: &Snapshot, biz_id: &str) -> Transition {
    snapshot.transitions.iter().filter(|t| t.biz_id == biz_id).max_by_key(|t| t.version).cloned().expect("log")
}

/// When O-1's first saga ended.
fn first_end(snapshot: &Snapshot) -> i64 {
    snapshot.transitions.iter().find(|t| t.biz_id == "O-1:PAID" && t.to.is_terminal()).map(|t| t.at_ms).expect("end")
}

/// Moves the start of O-1's second saga to `at_ms`.
fn start_repaid_at(snapshot: &mut Snapshot, at_ms: i64) {
    for t in snapshot.transitions.iter_mut().filter(|t| t.biz_id == "O-1:REPAID" && t.from == Some(Status::Received)) {
        t.at_ms = at_ms;
    }
}

/// When O-1's second saga started.
fn repaid_start(snapshot: &Snapshot) -> i64 {
    let start = snapshot.transitions.iter().find(|t| t.biz_id == "O-1:REPAID" && t.from == Some(Status::Received));
    start.map(|t| t.at_ms).expect("start")
}

/// Rewrites O-1's first saga as one that stopped in MANUAL_REVIEW where its logistics step was
/// confirmed, was sent back to LOGISTICS_REQUESTED by an operator at `back_ms`, and was
/// confirmed and DONE at `done_ms`: a legal chain to the row's status and epoch.
fn paid_sent_back(snapshot: &mut Snapshot, back_ms: i64, done_ms: i64) {
    let done = last_row(snapshot, "O-1:PAID");
    let mut log: Vec<&mut Transition> = snapshot.transitions.iter_mut().filter(|t| t.biz_id == "O-1:PAID").collect();
    log.sort_by_key(|t| t.version);
    let [.., confirmed, last] = &mut log[..] else { panic!("a short log") };
    assert_eq!((confirmed.to, last.to), (Status::LogisticsConfirmed, Status::Done), "the chain this case rewrites");
    confirmed.to = Status::ManualReview;
    (last.from, last.to, last.actor, last.at_ms) =
        (Some(Status::ManualReview), Status::LogisticsRequested, "operator:alice".into(), back_ms);
    let again = Transition {
        version: done.version + 1,
        from: Some(Status::LogisticsRequested),
        to: Status::LogisticsConfirmed,
        at_ms: done_ms,
        ..done.clone()
    };
    let finished = Transition { version: done.version + 2, at_ms: done_ms, ..done };
    snapshot.transitions.extend([again, finished]);
}

/// Rewrites `biz_id`'s log (a DONE saga) as one that stopped in MANUAL_REVIEW where its
/// logistics step was confirmed and was closed as DONE by an operator, and takes its shipment
/// out of the logistics ledger (made by hand, outside our request id).
fn closed_by_hand(snapshot: &mut Snapshot, biz_id: &str) {
    let mut log: Vec<&mut Transition> = snapshot.transitions.iter_mut().filter(|t| t.biz_id == biz_id).collect();
    log.sort_by_key(|t| t.version);
    let [.., confirmed, last] = &mut log[..] else { panic!("a short log") };
    assert_eq!((confirmed.to, last.to), (Status::LogisticsConfirmed, Status::Done), "the chain this case rewrites");
    confirmed.to = Status::ManualReview;
    (last.from, last.actor) = (Some(Status::ManualReview), "operator:alice".into());
    let shipment = request_id(biz_id, Step::Logistics);
    snapshot.logistics_ledger.retain(|entry| entry.request_id != shipment);
}

fn saga_mut<'a>(snapshot: &'a mut Snapshot, biz_id: &str) -> &'a mut Saga {
    snapshot.sagas.iter_mut().find(|s| s.biz_id == biz_id).expect("saga in snapshot")
}

async fn planted_violations_are_found(db: &TestDb) {
    let mocks = MockDownstreams::start(MockOptions::default()).await;
    let (clean, expected) = clean_run(db, &mocks).await;
    let report = check(&clean, &expected);
    assert!(report.ok(), "clean run: {:#?}", report.violations);
    assert_eq!(report.messages, 5);
    assert_eq!(report.by_status.get("DONE"), Some(&3));
    assert_eq!(report.by_status.get("ROLLED_BACK"), Some(&1));
    assert_eq!(report.by_status.get("PARKED"), Some(&1));
    assert_eq!((report.duplicate_effects, report.lost), (0, 0));

    let done = "O-2:PAID";
    type Plant = Box<dyn Fn(&mut Snapshot, &mut Expected)>;
    let cases: Vec<(&str, Plant, Vec<&str>)> = vec![
        (
            "a second lock under our request id",
            Box::new(move |s, _| {
                s.wms_ledger.push(lock(request_id(done, Step::Wms), "L-extra", 10_000, LedgerKind::Apply));
            }),
            vec!["I1", "I3"],
        ),
        (
            "a second lock under a key the WMS made up (the incident)",
            Box::new(|s, _| {
                s.wms_ledger.push(lock("legacy-7".into(), "L-legacy", 10_000, LedgerKind::Apply));
            }),
            vec!["I1"],
        ),
        (
            "a lock under a key no saga sent, for an order whose one saga rolled back",
            Box::new(|s, _| {
                let entry =
                    LedgerEntry { order_no: "O-3".into(), ..lock("K-9".into(), "L-k9", 10_000, LedgerKind::Apply) };
                s.wms_ledger.push(entry);
            }),
            vec!["I1"],
        ),
        (
            "a lock made again under our request id after it was undone",
            Box::new(move |s, _| {
                let request = request_id(done, Step::Wms);
                let first = s
                    .wms_ledger
                    .iter()
                    .find(|e| e.request_id == request && e.kind == LedgerKind::Apply)
                    .map(|e| e.effect_id.clone())
                    .expect("the saga's lock");
                s.wms_ledger.push(lock(request.clone(), &first, 10_000, LedgerKind::Undo));
                s.wms_ledger.push(lock(request, "L-again", 10_001, LedgerKind::Apply));
            }),
            vec!["I1"],
        ),
        (
            "a second lock under our request id, undone since",
            Box::new(move |s, _| {
                let request = request_id(done, Step::Wms);
                s.wms_ledger.push(lock(request.clone(), "L-extra", 10_000, LedgerKind::Apply));
                s.wms_ledger.push(lock(request, "L-extra", 10_001, LedgerKind::Undo));
            }),
            vec!["I1"],
        ),
        (
            "a lock under a key no saga sent, undone since",
            Box::new(|s, _| {
                s.wms_ledger.push(lock("legacy-8".into(), "L-legacy", 10_000, LedgerKind::Apply));
                s.wms_ledger.push(lock("legacy-8".into(), "L-legacy", 10_001, LedgerKind::Undo));
            }),
            vec!["I1"],
        ),
        ("a row missing", Box::new(move |s, _| s.sagas.retain(|x| x.biz_id != done)), vec!["I2"]),
        // Rows whose status is changed here keep their log, which ends elsewhere: I4 as well.
        // The saga's outbox row (its notification) is there too: I3 as well.
        (
            "a row left mid-flight",
            Box::new(move |s, _| saga_mut(s, done).status = Status::WmsRequested),
            vec!["I2", "I3", "I4"],
        ),
        (
            "MANUAL_REVIEW without a ticket",
            Box::new(move |s, _| saga_mut(s, done).status = Status::ManualReview),
            vec!["I2", "I3", "I4"],
        ),
        ("DONE without its outbox row", Box::new(move |s, _| s.outbox.retain(|(b, _)| b != done)), vec!["I3"]),
        (
            "an outbox row and a notification for a rolled-back saga",
            Box::new(|s, _| {
                s.outbox.push(("O-3:PAID".into(), true));
                // Every DONE saga's notification, and one more.
                let mut published: Vec<String> = s.outbox.iter().map(|(b, _)| b.clone()).collect();
                published.push("O-3:PAID".into());
                s.notifications = Some(published);
            }),
            vec!["I3"],
        ),
        (
            "a valid order parked",
            Box::new(|s, _| {
                let saga = saga_mut(s, "O-3:PAID");
                saga.status = Status::Parked;
                saga.last_error = Some("payload invalid".into());
            }),
            vec!["I2", "I4"],
        ),
        ("DONE without a notification", Box::new(|s, _| s.notifications = Some(Vec::new())), vec!["I3"]),
        (
            "ROLLED_BACK with a lock in force",
            Box::new(|s, _| {
                let entry = LedgerEntry {
                    order_no: "O-3".into(),
                    ..lock(request_id("O-3:PAID", Step::Wms), "L-late", 10_000, LedgerKind::Apply)
                };
                s.wms_ledger.push(entry);
            }),
            // Its lock was reversed on the way back: this one is the lock made a second time.
            vec!["I1", "I3"],
        ),
        (
            "a stale epoch's write in the log",
            Box::new(move |s, _| {
                let last = last_row(s, done);
                s.transitions.push(Transition {
                    version: last.version + 1,
                    lease_epoch: 0,
                    from: Some(last.to),
                    to: last.to,
                    reason: "zombie".into(),
                    ..last
                });
            }),
            vec!["I4"],
        ),
        (
            "a takeover that did not raise the epoch",
            Box::new(move |s, _| {
                let last = last_row(s, done);
                s.transitions.push(Transition {
                    version: last.version + 1,
                    from: Some(last.to),
                    actor: "recovery:r1".into(),
                    reason: "takeover".into(),
                    ..last
                });
            }),
            vec!["I4"],
        ),
        (
            "a write under an epoch no takeover gave",
            Box::new(move |s, _| {
                let last =
                    s.transitions.iter_mut().filter(|t| t.biz_id == done).max_by_key(|t| t.version).expect("log");
                last.lease_epoch += 1;
            }),
            vec!["I4"],
        ),
        (
            "a write under the holder's epoch by another actor",
            Box::new(move |s, _| {
                let last = last_row(s, done);
                let row = s.transitions.iter_mut().find(|t| t.biz_id == done && t.version == last.version - 1);
                let row = row.expect("a row before the last");
                assert_eq!(row.lease_epoch, last.lease_epoch, "the case needs two rows under one epoch");
                row.actor = "recovery:zombie".into();
            }),
            vec!["I4"],
        ),
        ("a saga row without a log", Box::new(move |s, _| s.transitions.retain(|t| t.biz_id != done)), vec!["I4"]),
        (
            "a row whose epoch its log never reached",
            Box::new(move |s, _| saga_mut(s, done).lease.epoch += 1),
            vec!["I4"],
        ),
        (
            "a lock after its tombstone",
            Box::new(|s, _| {
                s.wms_ledger.push(lock("T-1".into(), "", 10_000, LedgerKind::Tombstone));
                s.wms_ledger.push(lock("T-1".into(), "L-t", 10_001, LedgerKind::Apply));
            }),
            vec!["I1", "I4"],
        ),
        (
            "two sagas of one order overlapping",
            Box::new(|s, _| {
                let first_end = first_end(s);
                start_repaid_at(s, first_end - 1);
            }),
            vec!["I5"],
        ),
        (
            "two sagas of one order overlapping, a parked one between them",
            Box::new(|s, _| {
                let first_end = first_end(s);
                let mut between = s.sagas.iter().find(|x| x.biz_id == "O-1:REPAID").cloned().expect("saga");
                between.biz_id = "O-1:REFUND".into();
                between.source.offset = 1;
                between.status = Status::Parked;
                s.sagas.push(between);
                let start = s
                    .transitions
                    .iter()
                    .find(|t| t.biz_id == "O-1:REPAID" && t.from == Some(Status::Received))
                    .cloned()
                    .expect("start");
                s.transitions.push(Transition {
                    biz_id: "O-1:REFUND".into(),
                    to: Status::Parked,
                    at_ms: first_end - 2,
                    ..start
                });
                start_repaid_at(s, first_end - 1);
            }),
            vec!["I5"],
        ),
        (
            "an earlier saga of an order sent back to automation after a later one started",
            Box::new(|s, _| {
                let started = repaid_start(s);
                paid_sent_back(s, started + 1, started + 2);
            }),
            vec!["I5"],
        ),
        (
            "an earlier saga of an order sent back before a later one started, ending after",
            Box::new(|s, _| {
                let started = repaid_start(s);
                paid_sent_back(s, started - 1, started + 1);
            }),
            vec!["I5"],
        ),
        (
            "an earlier saga of an order sent back and ended again before a later one started (no violation)",
            Box::new(|s, _| {
                let ended = first_end(s);
                paid_sent_back(s, ended, ended);
            }),
            vec![],
        ),
        (
            "a DONE an operator closed after a shipment made by hand (no violation)",
            Box::new(move |s, _| closed_by_hand(s, done)),
            vec![],
        ),
        (
            "a DONE an operator closed naming another shipment than ours",
            Box::new(move |s, _| {
                let shipment = s.logistics_ledger.iter().find(|e| e.request_id == request_id(done, Step::Logistics));
                let shipment = shipment.cloned().expect("our shipment");
                closed_by_hand(s, done);
                s.logistics_ledger.push(shipment);
                let tracking_no = Some("TRK-BY-HAND".to_owned());
                saga_mut(s, done).tracking_no = tracking_no.clone();
                for order in s.orders.iter_mut().filter(|o| o.biz_id == done) {
                    order.tracking_no = tracking_no.clone();
                }
            }),
            vec!["I3"],
        ),
        (
            "a DONE an operator closed with the order not SHIPPED",
            Box::new(move |s, _| {
                closed_by_hand(s, done);
                for order in s.orders.iter_mut().filter(|o| o.biz_id == done) {
                    order.status = "FULFILLING".to_owned();
                }
            }),
            vec!["I3"],
        ),
        (
            "a DONE an operator closed without its notification",
            Box::new(move |s, _| {
                closed_by_hand(s, done);
                s.outbox.retain(|(id, _)| id != done);
                if let Some(notifications) = &mut s.notifications {
                    notifications.retain(|id| id != done);
                }
            }),
            vec!["I3"],
        ),
        (
            "poison not parked",
            Box::new(|s, _| saga_mut(s, "parked:orders:0:9").status = Status::RolledBack),
            vec!["I4", "I6"],
        ),
        ("poison not dead-lettered", Box::new(|s, _| s.dead_letters = Some(Vec::new())), vec!["I6"]),
        ("an accepted message never inserted", Box::new(|_, e| e.orders.push("O-9:PAID".into())), vec!["I2"]),
    ];
    for (name, plant, want) in cases {
        let (mut snapshot, mut expected) = (clean.clone(), expected.clone());
        plant(&mut snapshot, &mut expected);
        let found = invariants(&snapshot, &expected);
        assert_eq!(found, want, "{name}: {:#?}", check(&snapshot, &expected).violations);
    }

    // Each extra effect counts once: a repeat under our request id is not counted again among
    // its order's effects, nor one under a key no saga sent.
    for (request, effect_id) in [(request_id(done, Step::Wms), "L-extra"), ("legacy-7".to_owned(), "L-legacy")] {
        let mut snapshot = clean.clone();
        snapshot.wms_ledger.push(lock(request.clone(), effect_id, 10_000, LedgerKind::Apply));
        let report = check(&snapshot, &expected);
        assert_eq!(report.duplicate_effects, 1, "{request}: {:#?}", report.violations);
        // Undone since, it was made all the same: still one.
        snapshot.wms_ledger.push(lock(request.clone(), effect_id, 10_001, LedgerKind::Undo));
        let report = check(&snapshot, &expected);
        assert_eq!(report.duplicate_effects, 1, "{request} undone: {:#?}", report.violations);
    }
}
both_engines!(checker_finds_planted_violations, planted_violations_are_found);
