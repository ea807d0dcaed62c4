//! The outbox relay: publishes unpublished outbox rows to the notification topic (keyed by
//! biz_id, through the idempotent producer), waits for the acknowledgements, then marks the
//! delivered rows published.
//!
//! Its rows come two ways. This process writes the outbox rows of the sagas it finishes already
//! claimed by this relay for a short while ([`HANDOFF_CLAIM_MS`], `Store::with_outbox_claim`),
//! and the scheduler hands the relay their keys ([`Handoff`]): the relay reads those rows by
//! key and publishes them, one read and one mark a round (and an extension of their claims in
//! a round whose delivery runs long). Every `idle_ms` it also scans for rows nobody holds
//! (written by the recovery worker or an operator, released by a relay that stopped, read too
//! late, or whose claim ran out) and claims them, as every relay does.
//!
//! Several relays may run, in this process and others: a claim is a conditional UPDATE with an
//! expiry, so two relays never hold the same row at once. Delivery is at least once: a relay
//! that dies between publishing and marking leaves the rows to be claimed and published again
//! after the claim expires; notifications carry the biz_id as their key so readers deduplicate.
//! A key the handoff had no room for ([`HANDOFF_MAX`]), or held by a process that died, is not
//! lost either: its row waits for its short claim to run out, then a scan takes it.
//!
//! When every publish of a round fails (Kafka down, the topic refused), the relay waits before
//! the next round, doubling from `idle_ms` to 10 s until a round publishes something again.
//! Failed rows are logged as one line at most every 5 s, with their count since the last;
//! `midflight_consumer_publish_failures_total` counts every failed row.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::join_all;
use midflight_store::{OutboxMessage, Store};
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::FutureRecord;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::config::RelaySection;
use crate::counters::Counters;
use crate::inbox::TRACEPARENT_HEADER;
use crate::kafka::{Producer, Throttle};

/// How long a publish waits for room in a full producer queue before it counts as failed.
const QUEUE_WAIT: Duration = Duration::from_secs(1);
/// Longest wait after a round whose every publish failed (Kafka down, a topic refused): the
/// wait doubles from `idle_ms` up to this, and finished sagas do not cut it short.
const FAILED_ROUND_BACKOFF_MAX: Duration = Duration::from_secs(10);

/// Most keys waiting in the handoff; a key offered beyond it is counted
/// (`relay_handoffs_dropped`) and its row published by a scan once its claim runs out.
pub(crate) const HANDOFF_MAX: usize = 10_000;

/// The claim the outbox rows of this process's sagas are written with. Short, so the rows of a
/// process that dies before publishing them wait at most this long for another relay's scan;
/// a handed row is read only with at least half of it left ([`HANDOFF_LEFT_MS`]), and a
/// delivery still running a quarter of it after the read has its claims extended to
/// `consumer.relay.claim_ms` first ([`HANDOFF_EXTEND_AFTER`]), so a slow delivery holds the
/// same claim a scan's would (unless the extension itself fails, which is logged; another relay
/// may then deliver the rows again).
pub(crate) const HANDOFF_CLAIM_MS: i64 = 5_000;
/// The least of its claim a handed row must have left to be read; one with less is left for a
/// scan, which takes it once the claim has run out.
const HANDOFF_LEFT_MS: i64 = HANDOFF_CLAIM_MS / 2;
/// How long after reading handed rows their delivery may run before their claims are extended.
const HANDOFF_EXTEND_AFTER: Duration = Duration::from_millis((HANDOFF_LEFT_MS / 2) as u64);

/// The keys of the notifications this process's sagas finished, claimed at insert for this
/// relay, waiting for it: bounded by [`HANDOFF_MAX`].
#[derive(Debug, Default)]
pub(crate) struct Handoff {
    keys: Mutex<VecDeque<String>>,
    ready: Notify,
}

impl Handoff {
    /// Queues `biz_id` for the relay and wakes it; `false` if the queue was full.
    pub(crate) fn offer(&self, biz_id: String) -> bool {
        {
            let mut keys = self.lock();
            if keys.len() >= HANDOFF_MAX {
                return false;
            }
            keys.push_back(biz_id);
        }
        self.ready.notify_one();
        true
    }

    /// Up to `max` keys, oldest first.
    fn take(&self, max: usize) -> Vec<String> {
        let mut keys = self.lock();
        let n = keys.len().min(max);
        keys.drain(..n).collect()
    }

    /// Puts keys taken back at the front (their round failed before publishing), as far as
    /// there is room; returns how many did not fit.
    fn put_back(&self, taken: Vec<String>) -> usize {
        let mut keys = self.lock();
        let room = HANDOFF_MAX.saturating_sub(keys.len()).min(taken.len());
        let dropped = taken.len() - room;
        for key in taken.into_iter().take(room).rev() {
            keys.push_front(key);
        }
        dropped
    }

    /// Every key still waiting.
    pub(crate) fn take_all(&self) -> Vec<String> {
        self.lock().drain(..).collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<String>> {
        self.keys.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Awaits `work`; if it is still running `after` from now, runs `extend` to its end first and
/// then waits for `work`.
async fn guarded<T>(work: impl Future<Output = T>, after: Duration, extend: impl Future<Output = ()>) -> T {
    tokio::pin!(work);
    tokio::select! {
        biased;
        out = &mut work => return out,
        () = tokio::time::sleep(after) => {}
    }
    extend.await;
    work.await
}

/// Releases the claims of the rows whose keys are still in `handoff` (the relay has stopped,
/// the drives have ended), so other relays publish them at once instead of when the claims
/// run out.
pub(crate) async fn release_left(store: &Store, owner: &str, handoff: &Handoff) {
    let left = handoff.take_all();
    if left.is_empty() {
        return;
    }
    match store.release_outbox(owner, &left).await {
        Ok(released) => {
            tracing::info!(owner, left = left.len(), released, "released the claims of notifications not published")
        }
        Err(error) => tracing::warn!(
            owner,
            left = left.len(),
            %error,
            "cannot release the claims of notifications not published; they are published once the claims run out"
        ),
    }
}

/// Where a round's rows come from.
#[derive(Debug)]
enum Source {
    /// Keys handed over, of rows claimed at insert for this relay.
    Handed(Vec<String>),
    /// Rows nobody holds, found and claimed by this round.
    Scan,
}

/// What one round did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Round {
    /// Rows marked published.
    published: u64,
    /// Rows whose publish failed (their claims expire and another round takes them).
    failed: u64,
    /// Rows read or claimed (a full scan is followed by another at once).
    rows: u64,
}

impl std::ops::AddAssign for Round {
    fn add_assign(&mut self, other: Round) {
        self.published += other.published;
        self.failed += other.failed;
        self.rows += other.rows;
    }
}

/// The backoff after rounds whose every publish failed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Backoff {
    /// The last wait; `None` once a round published something.
    last: Option<Duration>,
}

impl Backoff {
    /// The wait after `round`: twice the last one (from `idle`, at most
    /// [`FAILED_ROUND_BACKOFF_MAX`]) when it failed and published nothing; `None` otherwise.
    /// Only a round that published something starts the doubling over: the round after a
    /// failed one usually finds nothing to claim (the failed rows stay claimed until their
    /// claims expire), and that says nothing about Kafka.
    fn after(&mut self, round: Round, idle: Duration) -> Option<Duration> {
        if round.published > 0 {
            self.last = None;
            return None;
        }
        if round.failed == 0 {
            return None;
        }
        let next = self.last.map_or(idle, |last| last.saturating_mul(2));
        let wait = next.clamp(idle.min(FAILED_ROUND_BACKOFF_MAX), FAILED_ROUND_BACKOFF_MAX);
        self.last = Some(wait);
        Some(wait)
    }
}

/// Failed publishes not yet logged, and how often they may be.
#[derive(Debug, Default)]
struct Failures {
    lines: Throttle,
    /// Rows failed since the last line.
    unlogged: u64,
}

/// What the relay needs; it runs until `stop` is cancelled.
pub(crate) struct Relay {
    pub store: Store,
    pub producer: Producer,
    pub topic: String,
    pub owner: String,
    pub settings: RelaySection,
    pub counters: Arc<Counters>,
    /// The keys of the rows this process's sagas finished, claimed at insert for this relay.
    pub handoff: Arc<Handoff>,
    /// Cancelled here when the producer hit a fatal error (an idempotent producer that lost
    /// its sequence with a broker): it publishes nothing more, so the process must restart.
    pub fatal: CancellationToken,
}

impl Relay {
    pub(crate) async fn run(self, stop: CancellationToken) {
        tracing::info!(owner = %self.owner, topic = %self.topic, "outbox relay started");
        let mut failures = Failures::default();
        let mut backoff = Backoff::default();
        let (batch, idle) = (self.settings.batch_max, Duration::from_millis(self.settings.idle_ms));
        // The first scan at once: rows left by earlier processes and the recovery worker.
        let mut scan_at = tokio::time::Instant::now();
        while !stop.is_cancelled() {
            let mut round = Round::default();
            let handed = self.handoff.take(batch);
            if !handed.is_empty() {
                round += self.logged(self.round(Source::Handed(handed), &mut failures).await);
            }
            if tokio::time::Instant::now() >= scan_at {
                let scanned = self.logged(self.round(Source::Scan, &mut failures).await);
                // A full scan may have left more behind it: the next one at once.
                if scanned.rows < batch as u64 {
                    scan_at = tokio::time::Instant::now() + idle;
                }
                round += scanned;
            }
            if round.failed > 0
                && let Some(reason) = crate::kafka::fatal_error(rdkafka::producer::Producer::client(&self.producer))
            {
                tracing::error!(owner = %self.owner, %reason, "the producer hit a fatal error; the consumer stops");
                self.fatal.cancel();
                break;
            }
            if let Some(wait) = backoff.after(round, idle) {
                tokio::select! {
                    () = stop.cancelled() => {}
                    () = tokio::time::sleep(wait) => {}
                }
                continue;
            }
            if round.rows == 0 {
                tokio::select! {
                    () = stop.cancelled() => {}
                    () = self.handoff.ready.notified() => {}
                    () = tokio::time::sleep_until(scan_at) => {}
                }
            }
            if round.published < batch as u64 {
                // Let the rows of sagas finishing meanwhile join the next round.
                let linger = Duration::from_millis(self.settings.linger_ms);
                tokio::select! {
                    () = stop.cancelled() => {}
                    () = tokio::time::sleep(linger) => {}
                }
            }
        }
        tracing::info!(owner = %self.owner, "outbox relay stopped");
    }

    /// A round's result, its error logged as a round that did nothing.
    fn logged(&self, result: Result<Round, midflight_store::Error>) -> Round {
        result.unwrap_or_else(|error| {
            tracing::warn!(owner = %self.owner, %error, "outbox relay round failed; retrying");
            Round::default()
        })
    }

    /// Reads the handed rows or claims a batch, publishes and marks them. Failed publishes are
    /// counted, and logged as one line for the round (at most one such line per few seconds:
    /// an outage fails every row). Handed keys whose rows could not be read go back to the
    /// handoff for the next round.
    async fn round(&self, source: Source, failures: &mut Failures) -> Result<Round, midflight_store::Error> {
        let handed = matches!(source, Source::Handed(_));
        let rows = match source {
            Source::Handed(keys) => match self.store.read_claimed_outbox(&self.owner, &keys, HANDOFF_LEFT_MS).await {
                Ok(rows) => rows,
                Err(error) => {
                    let dropped = self.handoff.put_back(keys);
                    Counters::add(&self.counters.relay_handoffs_dropped, dropped as u64);
                    return Err(error);
                }
            },
            Source::Scan => {
                let batch = self.settings.batch_max as u64;
                self.store.claim_outbox(&self.owner, batch, self.settings.claim_ms).await?
            }
        };
        if rows.is_empty() {
            return Ok(Round::default());
        }
        let (delivered, failed) = if handed {
            guarded(self.publish(&rows), HANDOFF_EXTEND_AFTER, self.extend(&rows)).await
        } else {
            self.publish(&rows).await
        };
        if let Some((biz_id, error)) = failed.first() {
            failures.unlogged += failed.len() as u64;
            if let Some(rounds) = failures.lines.admit() {
                tracing::warn!(
                    owner = %self.owner,
                    topic = %self.topic,
                    failed = failures.unlogged,
                    rounds = rounds + 1,
                    first_biz_id = %biz_id,
                    %error,
                    "notifications not published since the last such line; each is retried after its claim expires"
                );
                failures.unlogged = 0;
            }
        }
        let marked = self.store.mark_published(&self.owner, &delivered).await?;
        Counters::add(&self.counters.published, marked);
        if handed {
            Counters::add(&self.counters.relay_handed, marked);
        }
        Ok(Round { published: marked, failed: failed.len() as u64, rows: rows.len() as u64 })
    }

    /// Extends the claims of handed `rows` to `claim_ms`: their delivery is taking longer than
    /// their short claim allows for. A failure is logged; the delivery goes on either way (if
    /// a claim then runs out, another relay may publish the row again: at least once).
    async fn extend(&self, rows: &[OutboxMessage]) {
        let keys: Vec<String> = rows.iter().map(|row| row.biz_id.clone()).collect();
        match self.store.extend_outbox_claims(&self.owner, &keys, self.settings.claim_ms).await {
            Ok(extended) => Counters::add(&self.counters.relay_claims_extended, extended),
            Err(error) => tracing::warn!(
                owner = %self.owner,
                rows = keys.len(),
                %error,
                "cannot extend the claims of notifications being delivered; another relay may deliver them again"
            ),
        }
    }

    /// Publishes `rows` together; returns the biz_ids that were acknowledged, and those that
    /// failed with their errors.
    async fn publish(&self, rows: &[OutboxMessage]) -> (Vec<String>, Vec<(String, KafkaError)>) {
        let sends = rows.iter().map(|row| {
            let mut headers = OwnedHeaders::new_with_capacity(1);
            if let Some(trace) = &row.trace_context {
                headers = headers.insert(Header { key: TRACEPARENT_HEADER, value: Some(trace.as_str()) });
            }
            let record = FutureRecord::to(&self.topic).key(&row.biz_id).payload(&row.payload).headers(headers);
            self.producer.send(record, QUEUE_WAIT)
        });
        let results = join_all(sends).await;
        let (mut delivered, mut failed) = (Vec::with_capacity(rows.len()), Vec::new());
        for (row, result) in rows.iter().zip(results) {
            match result {
                Ok(_) => delivered.push(row.biz_id.clone()),
                Err((error, _)) => {
                    Counters::add(&self.counters.publish_failures, 1);
                    failed.push((row.biz_id.clone(), error));
                }
            }
        }
        (delivered, failed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_round_whose_every_publish_failed_backs_off_doubling_to_a_bound() {
        let idle = Duration::from_millis(250);
        let (failed, empty) = (Round { published: 0, failed: 3, rows: 3 }, Round::default());
        let mut backoff = Backoff::default();
        // Each failed round is followed by one that finds its rows still claimed.
        let mut waits = Vec::new();
        for _ in 0..8 {
            waits.push(backoff.after(failed, idle).map(|w| w.as_millis()));
            assert_eq!(backoff.after(empty, idle), None, "an empty round waits as usual");
        }
        let expected = [250, 500, 1_000, 2_000, 4_000, 8_000, 10_000, 10_000].map(Some);
        assert_eq!(waits, expected);
        // Something published, even with failures: no wait, and the doubling starts over.
        assert_eq!(backoff.after(Round { published: 1, failed: 3, rows: 4 }, idle), None);
        assert_eq!(backoff.after(failed, idle), Some(idle));
        // An idle wait longer than the bound waits the bound.
        assert_eq!(Backoff::default().after(failed, Duration::from_secs(60)), Some(FAILED_ROUND_BACKOFF_MAX));
    }

    #[test]
    fn the_handoff_keeps_its_order_and_its_bound() {
        let handoff = Handoff::default();
        for n in 0..HANDOFF_MAX {
            assert!(handoff.offer(format!("B-{n}")), "room for key {n}");
        }
        assert!(!handoff.offer("B-over".to_owned()), "a full handoff refuses");
        let first = handoff.take(3);
        assert_eq!(first, ["B-0", "B-1", "B-2"], "oldest first");
        assert!(handoff.offer("B-new".to_owned()), "room again");
        // Taken keys go back in front, as far as there is room: two of three here.
        assert_eq!(handoff.put_back(first), 1);
        assert_eq!(handoff.take(3), ["B-0", "B-1", "B-3"]);
        let rest = handoff.take_all();
        assert_eq!(rest.len(), HANDOFF_MAX - 3);
        assert_eq!(rest.last().map(String::as_str), Some("B-new"));
        assert!(handoff.take(1).is_empty());
        assert_eq!(handoff.put_back(vec!["B-x".to_owned(), "B-y".to_owned()]), 0);
        assert_eq!(handoff.take(5), ["B-x", "B-y"]);
    }

    #[tokio::test]
    async fn an_offer_wakes_a_relay_that_waits_or_is_about_to() {
        let handoff = Handoff::default();
        // Offered before anyone waits: the next wait returns at once.
        assert!(handoff.offer("B-1".to_owned()));
        tokio::time::timeout(Duration::from_secs(30), handoff.ready.notified()).await.expect("woken by the offer");
        assert_eq!(handoff.take(10), ["B-1"]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn keys_left_in_the_handoff_are_released_for_other_relays() {
        use midflight_store::testing::{Engine, TestDb, arrive_orders, drive_to_done};

        let db = TestDb::fresh(Engine::Sqlite).await.expect("sqlite");
        let store = db.store.with_outbox_claim("relay-a", 60_000).expect("a claimant");
        let sagas = arrive_orders(&store, &["L-0", "L-1", "L-2"]).await;
        let handoff = Handoff::default();
        for saga in sagas.iter().cloned() {
            assert!(handoff.offer(drive_to_done(&store, saga, "consumer:c1", 60_000).await.biz_id));
        }
        assert!(db.store.claim_outbox("relay-b", 10, 60_000).await.expect("claim").is_empty(), "relay-a's rows");
        release_left(&store, "relay-a", &handoff).await;
        assert!(handoff.take(10).is_empty(), "the keys were taken");
        let mut taken: Vec<String> =
            db.store.claim_outbox("relay-b", 10, 60_000).await.expect("claim").into_iter().map(|m| m.biz_id).collect();
        taken.sort_unstable();
        let mut expected: Vec<String> = sagas.iter().map(|s| s.biz_id.clone()).collect();
        expected.sort_unstable();
        assert_eq!(taken, expected, "released: another relay takes them at once");
    }

    #[tokio::test(start_paused = true)]
    async fn a_delivery_that_runs_long_extends_its_claims_first() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let extended = AtomicUsize::new(0);
        let extend = || async {
            extended.fetch_add(1, Ordering::Relaxed);
        };
        let work = |ms: u64| async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            ms
        };
        let after = HANDOFF_EXTEND_AFTER;
        let quick = after.as_millis() as u64 - 1;
        assert_eq!(guarded(work(quick), after, extend()).await, quick);
        assert_eq!(extended.load(Ordering::Relaxed), 0, "a delivery within the short claim extends nothing");
        let started = tokio::time::Instant::now();
        let slow = 4 * after.as_millis() as u64;
        assert_eq!(guarded(work(slow), after, extend()).await, slow, "the delivery's own result");
        assert_eq!(extended.load(Ordering::Relaxed), 1, "extended once");
        assert_eq!(started.elapsed(), Duration::from_millis(slow), "the delivery ran on meanwhile");
        // The claim is extended while at least half of the short claim is left, and to the
        // relay's full claim, which the configuration keeps above the delivery timeout.
        assert!(HANDOFF_LEFT_MS - after.as_millis() as i64 >= HANDOFF_CLAIM_MS / 4);
    }
}
