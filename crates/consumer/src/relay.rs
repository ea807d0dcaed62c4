//! The outbox relay: claims unpublished outbox rows, publishes each to the notification topic
//! (keyed by biz_id, through the idempotent producer), waits for the acknowledgements, then
//! marks the delivered rows published.
//!
//! Several relays may run, in this process and others: a claim is a conditional UPDATE with an
//! expiry, so two relays never hold the same row at once. Delivery is at least once: a relay
//! that dies between publishing and marking leaves the rows to be claimed and published again
//! after the claim expires; notifications carry the biz_id as their key so readers deduplicate.

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use midflight_store::{OutboxMessage, Store};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::FutureRecord;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::config::RelaySection;
use crate::counters::Counters;
use crate::inbox::TRACEPARENT_HEADER;
use crate::kafka::Producer;

/// How long a publish waits for room in a full producer queue before it counts as failed.
const QUEUE_WAIT: Duration = Duration::from_secs(1);

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
}

impl Relay {
    pub(crate) async fn run(self, stop: CancellationToken) {
        tracing::info!(owner = %self.owner, topic = %self.topic, "outbox relay started");
        while !stop.is_cancelled() {
            let published = match self.round().await {
                Ok(published) => published,
                Err(error) => {
                    tracing::warn!(owner = %self.owner, %error, "outbox relay round failed; retrying");
                    0
                }
            };
            if published == 0 {
                let idle = Duration::from_millis(self.settings.idle_ms);
                tokio::select! {
                    () = stop.cancelled() => {}
                    () = self.ready.notified() => {}
                    () = tokio::time::sleep(idle) => {}
                }
            }
            if published < self.settings.batch_max as u64 {
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

    /// Claims, publishes and marks one batch; returns how many rows it marked published.
    async fn round(&self) -> Result<u64, midflight_store::Error> {
        let batch = self.settings.batch_max as u64;
        let rows = self.store.claim_outbox(&self.owner, batch, self.settings.claim_ms).await?;
        if rows.is_empty() {
            return Ok(0);
        }
        let delivered = self.publish(&rows).await;
        let marked = self.store.mark_published(&self.owner, &delivered).await?;
        Counters::add(&self.counters.published, marked);
        Ok(marked)
    }

    /// Publishes `rows` together and returns the biz_ids that were acknowledged.
    async fn publish(&self, rows: &[OutboxMessage]) -> Vec<String> {
        let sends = rows.iter().map(|row| {
            let mut headers = OwnedHeaders::new_with_capacity(1);
            if let Some(trace) = &row.trace_context {
                headers = headers.insert(Header { key: TRACEPARENT_HEADER, value: Some(trace.as_str()) });
            }
            let record = FutureRecord::to(&self.topic).key(&row.biz_id).payload(&row.payload).headers(headers);
            self.producer.send(record, QUEUE_WAIT)
        });
        let results = join_all(sends).await;
        let mut delivered = Vec::with_capacity(rows.len());
        for (row, result) in rows.iter().zip(results) {
            match result {
                Ok(_) => delivered.push(row.biz_id.clone()),
                Err((error, _)) => {
                    Counters::add(&self.counters.publish_failures, 1);
                    tracing::warn!(biz_id = %row.biz_id, topic = %self.topic, %error, "notification not published; retried after the claim expires");
                }
            }
        }
        delivered
    }
}
