//! The outbox relay: claims unpublished outbox rows, publishes each to the notification topic
//! (keyed by biz_id, through the idempotent producer), waits for the acknowledgements, then
//! marks the delivered rows published.
//!
//! Several relays may run, in this process and others: a claim is a conditional UPDATE with an
//! expiry, so two relays never hold the same row at once. Delivery is at least once: a relay
//! that dies between publishing and marking leaves the rows to be claimed and published again
//! after the claim expires; notifications carry the biz_id as their key so readers deduplicate.
//!
//! When every publish of a round fails (Kafka down, the topic refused), the relay waits before
//! the next round, doubling from `idle_ms` to 10 s until a round publishes something again.
//! Failed rows are logged as one line at most every 5 s, with their count since the last;
//! `midflight_consumer_publish_failures_total` counts every failed row.

use std::sync::Arc;
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

/// What one round did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Round {
    /// Rows marked published.
    published: u64,
    /// Rows whose publish failed (their claims expire and another round takes them).
    failed: u64,
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
    /// Woken when this process finishes a saga DONE.
    pub ready: Arc<Notify>,
    /// Cancelled here when the producer hit a fatal error (an idempotent producer that lost
    /// its sequence with a broker): it publishes nothing more, so the process must restart.
    pub fatal: CancellationToken,
}

impl Relay {
    pub(crate) async fn run(self, stop: CancellationToken) {
        tracing::info!(owner = %self.owner, topic = %self.topic, "outbox relay started");
        let mut failures = Failures::default();
        let mut backoff = Backoff::default();
        while !stop.is_cancelled() {
            let round = match self.round(&mut failures).await {
                Ok(round) => round,
                Err(error) => {
                    tracing::warn!(owner = %self.owner, %error, "outbox relay round failed; retrying");
                    Round::default()
                }
            };
            if round.failed > 0
                && let Some(reason) = crate::kafka::fatal_error(rdkafka::producer::Producer::client(&self.producer))
            {
                tracing::error!(owner = %self.owner, %reason, "the producer hit a fatal error; the consumer stops");
                self.fatal.cancel();
                break;
            }
            if let Some(wait) = backoff.after(round, Duration::from_millis(self.settings.idle_ms)) {
                tokio::select! {
                    () = stop.cancelled() => {}
                    () = tokio::time::sleep(wait) => {}
                }
                continue;
            }
            if round.published == 0 {
                let idle = Duration::from_millis(self.settings.idle_ms);
                tokio::select! {
                    () = stop.cancelled() => {}
                    () = self.ready.notified() => {}
                    () = tokio::time::sleep(idle) => {}
                }
            }
            if round.published < self.settings.batch_max as u64 {
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

    /// Claims, publishes and marks one batch. Failed publishes are counted, and logged as one
    /// line for the round (at most one such line per few seconds: an outage fails every row).
    async fn round(&self, failures: &mut Failures) -> Result<Round, midflight_store::Error> {
        let batch = self.settings.batch_max as u64;
        let rows = self.store.claim_outbox(&self.owner, batch, self.settings.claim_ms).await?;
        if rows.is_empty() {
            return Ok(Round::default());
        }
        let (delivered, failed) = self.publish(&rows).await;
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
        Ok(Round { published: marked, failed: failed.len() as u64 })
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
        let (failed, empty) = (Round { published: 0, failed: 3 }, Round::default());
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
        assert_eq!(backoff.after(Round { published: 1, failed: 3 }, idle), None);
        assert_eq!(backoff.after(failed, idle), Some(idle));
        // An idle wait longer than the bound waits the bound.
        assert_eq!(Backoff::default().after(failed, Duration::from_secs(60)), Some(FAILED_ROUND_BACKOFF_MAX));
    }
}
