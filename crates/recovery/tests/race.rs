//! Races over the same rows, on SQLite and MariaDB, against the mock downstreams:
//!
//! - a recovery worker and a re-consuming consumer (a second driver calling `claim_and_drive`
//!   on the same sagas again and again) both go after 50 abandoned sagas, with WMS latency so
//!   calls are in flight while they race, short leases, and pauses longer than a lease on both
//!   sides (a zombie resuming after a GC pause or a network partition);
//! - two recovery workers over the same table.
//!
//! Each call is checked at the moment it is sent: the sender must hold the row's current epoch
//! in the call's intent state. The transition log must show one epoch holder per transition,
//! and the ledgers exactly one lock and one shipment per saga.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use midflight_api::client::Downstreams;
use midflight_driver::{Downstream, DriverSettings, Outcome};
use midflight_model::{Call, Observation, Saga, Status, Step, request_id};
use midflight_recovery::Worker;
use midflight_stack::{Faults, MethodFaults, MockDownstreams, MockOptions};
use midflight_store::testing::TestDb;
use midflight_store::{Store, both_engines};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

const SAGAS: usize = 50;

/// Short leases so takeovers happen within the test: a call's deadline and margin fit twice.
fn short_leases() -> DriverSettings {
    DriverSettings::new(400, 150, 50)
}

/// How long a paused side sleeps: well past its lease, so the other side takes over meanwhile.
const PAUSE: Duration = Duration::from_millis(900);

/// A downstream that checks, as each call leaves, that its sender holds the saga's current epoch
/// and the row is in the call's intent state, and that sometimes pauses after an answer.
#[derive(Clone)]
struct Checked {
    inner: Downstreams,
    store: Store,
    who: &'static str,
    calls: Arc<AtomicUsize>,
    /// Pause after every `pause_every`-th answer (0: never).
    pause_every: usize,
    violations: Arc<Mutex<Vec<String>>>,
}

impl Checked {
    fn new(inner: Downstreams, store: Store, who: &'static str, pause_every: usize) -> Checked {
        let (calls, violations) = (Arc::default(), Arc::default());
        Checked { inner, store, who, calls, pause_every, violations }
    }

    async fn check(&self, call: Call, saga: &Saga) {
        let row = self.store.get(&saga.biz_id).await.expect("get").expect("row");
        if row.lease.epoch != saga.lease.epoch || row.status != call.intent() {
            self.violations.lock().expect("lock").push(format!(
                "{} sent {} for {} at epoch {} while the row is at epoch {} in {}",
                self.who,
                call.name(),
                saga.biz_id,
                saga.lease.epoch,
                row.lease.epoch,
                row.status
            ));
        }
    }
}

impl Downstream for Checked {
    async fn call(&self, call: Call, saga: &Saga, timeout: Duration) -> Observation {
        self.check(call, saga).await;
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        let answer = self.inner.call(call, saga, timeout).await;
        if self.pause_every > 0 && n.is_multiple_of(self.pause_every) {
            tokio::time::sleep(PAUSE).await;
        }
        answer
    }
}

/// `SAGAS` sagas left in WMS_REQUESTED by a consumer that died mid-call: the first half with the
/// lock applied and its answer lost, the second half with the lock never applied.
async fn abandoned_in_wms_requested(store: &Store, mocks: &MockDownstreams) -> Vec<String> {
    let events: Vec<_> = (0..SAGAS).map(|i| event(&format!("O-{i:03}"), "PAID", "CN-ZJ")).collect();
    let sagas = arrive(store, &events, 1, 30_000).await;
    let dead = driver(store, mocks.client(), "dead-consumer", common::settings());
    for (index, saga) in sagas.iter().enumerate() {
        let faults = if index < SAGAS / 2 {
            MethodFaults { drop_response: 1.0, ..MethodFaults::default() }
        } else {
            MethodFaults { fail_before_apply: 1.0, ..MethodFaults::default() }
        };
        if index == 0 || index == SAGAS / 2 {
            mocks.set_wms_faults(midflight_stack::fault("LockStock", faults)).await;
        }
        let outcome = dead.drive(saga.clone(), Instant::now()).await;
        assert!(matches!(outcome, Outcome::HandedOff), "{outcome:?}");
    }
    mocks.set_wms_faults(latency()).await;
    sagas.into_iter().map(|s| s.biz_id).collect()
}

/// WMS latency: calls are in flight while the two sides race.
fn latency() -> Faults {
    let mut plan = Faults::default();
    for method in ["LockStock", "QueryLock", "ReverseLock"] {
        plan.methods.insert(method.to_owned(), MethodFaults::with_latency(20, 60));
    }
    plan
}

/// The re-consuming consumer: claims and drives every unfinished saga, round after round,
/// several at once. Returns how many of its drives were lost to the other side.
async fn consume_again_and_again(consumer: midflight_driver::Driver<Checked>, ids: Vec<String>) -> usize {
    let mut lost = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let mut open = Vec::new();
        for id in &ids {
            let saga = consumer.store().get(id).await.expect("get").expect("row");
            if !saga.status.is_terminal() {
                open.push(id.clone());
            }
        }
        if open.is_empty() {
            return lost;
        }
        let mut drives = JoinSet::new();
        for id in open {
            let consumer = consumer.clone();
            drives.spawn(async move { consumer.claim_and_drive(&id).await });
        }
        while let Some(outcome) = drives.join_next().await {
            lost += usize::from(matches!(outcome.expect("join"), Some(Outcome::Lost)));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("the consumer's sagas did not finish within a minute")
}

async fn recovery_and_consumer_race(db: &TestDb) {
    let mocks = MockDownstreams::start(MockOptions::default()).await;
    let ids = abandoned_in_wms_requested(&db.store, &mocks).await;

    let recovery_side = Checked::new(mocks.client(), db.store.clone(), "recovery", 11);
    let consumer_side = Checked::new(mocks.client(), db.store.clone(), "consumer", 7);
    let shutdown = CancellationToken::new();
    let worker_store = db.another_store().await;
    let worker =
        Worker::new(worker_store, recovery_side.clone(), rules(), short_leases(), section("r1"), shutdown.clone());
    let stats = worker.stats();
    let running = tokio::spawn(worker.run());
    let consumer = driver(&db.another_store().await, consumer_side.clone(), "consumer-2", short_leases());
    let consumer_lost = consume_again_and_again(consumer, ids.clone()).await;
    let statuses = all_terminal(&db.store, &ids, Duration::from_secs(30)).await;
    shutdown.cancel();
    let worker_stats = running.await.expect("join");

    assert!(statuses.iter().all(|s| *s == Status::Done), "{statuses:?}");
    for side in [&recovery_side, &consumer_side] {
        let violations = side.violations.lock().expect("lock").clone();
        assert!(violations.is_empty(), "calls sent without holding the epoch:\n{}", violations.join("\n"));
    }
    assert!(
        consumer_lost + (worker_stats.lost as usize) > 0,
        "the pauses must make each side lose sagas mid-drive (consumer lost {consumer_lost}, worker {worker_stats:?})"
    );
    assert!(stats.snapshot().claimed > 0, "the worker took part: {worker_stats:?}");
    let takeovers = db.store.takeover_count().await.expect("count");
    eprintln!("race: consumer lost {consumer_lost} drives, worker {worker_stats:?}, {takeovers} takeovers");
    let (wms, logistics) = ledgers(&mocks.client()).await;
    for id in &ids {
        assert_eq!(in_force(&wms, &request_id(id, Step::Wms)), 1, "{id}: one lock");
        assert_eq!(in_force(&logistics, &request_id(id, Step::Logistics)), 1, "{id}: one shipment");
        assert_one_holder_per_transition(&db.store, id).await;
        assert_finished_once(&db.store, id).await;
    }
    let applies = wms.iter().filter(|e| e.kind == midflight_api::client::LedgerKind::Apply).count();
    assert_eq!(applies, SAGAS, "no lock was ever applied twice, even transiently");
}
both_engines!(recovery_worker_races_a_consumer, recovery_and_consumer_race);

async fn two_workers_share_the_table(db: &TestDb) {
    let mocks = MockDownstreams::start(MockOptions { wms_faults: latency(), ..MockOptions::default() }).await;
    let events: Vec<_> = (0..SAGAS * 2).map(|i| event(&format!("O-{i:03}"), "PAID", "CN-ZJ")).collect();
    let ids: Vec<String> = arrive(&db.store, &events, 1, 0).await.into_iter().map(|s| s.biz_id).collect();
    let shutdown = CancellationToken::new();
    let mut workers = JoinSet::new();
    for name in ["r1", "r2"] {
        let store = db.another_store().await;
        let worker = Worker::new(store, mocks.client(), rules(), common::settings(), section(name), shutdown.clone());
        workers.spawn(worker.run());
    }
    let statuses = all_terminal(&db.store, &ids, Duration::from_secs(60)).await;
    shutdown.cancel();
    let mut finished = 0;
    while let Some(stats) = workers.join_next().await {
        finished += stats.expect("join").finished;
    }
    assert!(statuses.iter().all(|s| *s == Status::Done), "{statuses:?}");
    assert_eq!(finished, ids.len() as u64, "every saga finished by exactly one worker");
    let (wms, logistics) = ledgers(&mocks.client()).await;
    assert_eq!((wms.len(), logistics.len()), (ids.len(), ids.len()), "one lock and one shipment each, nothing else");
    for id in &ids {
        assert_finished_once(&db.store, id).await;
        assert_one_holder_per_transition(&db.store, id).await;
    }
}
both_engines!(two_recovery_workers, two_workers_share_the_table);
