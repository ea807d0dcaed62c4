//! The consumer service: consumes order events from Kafka and drives each one's saga through
//! the business write, the WMS lock, the shipment and the notification.
//!
//! Bird's-eye view of one message:
//! 1. [`pipeline`] takes a batch (bounded size; no linger by default: what has arrived) and
//!    [`inbox`] parses each message: valid -> a RECEIVED row, opened to WMS_REQUESTED in the
//!    same transaction unless an earlier saga of its order holds it back (`open_in_inbox`);
//!    poison -> a PARKED row plus a copy on the dead-letter topic.
//! 2. The batch's rows are inserted in one transaction (the durable inbox); only then are its
//!    offsets committed. The table, not the offset, is the record of work.
//! 3. [`scheduler`] drives fresh rows with `midflight_driver::Driver`, the one resume routine
//!    the recovery worker shares, concurrently across orders and one at a time within an order.
//!    A redelivered row is left alone unless its lease expired; then it is claimed through the
//!    same CAS as recovery. The consumer and the recovery worker coordinate only through that
//!    CAS on the saga row: ownership belongs to the row's lease, not to the Kafka partition.
//! 4. [`relay`] publishes outbox rows to the notification topic.
//!
//! Architecture invariants:
//! - An offset is committed only when every message below it has a durable row (and, for
//!   poison, an acknowledged dead-letter copy, or a row saying why the copy can never be
//!   delivered: too large, the topic missing or not writable).
//! - Nothing in a message stops the consumer: its key, payload and headers are read as bytes
//!   (a header name that is not UTF-8 included), and what is not an order is parked.
//! - One process never drives one biz_id twice at once (the scheduler is the in-flight set).
//! - No database connection or row lock is held across a downstream call (the driver's rule);
//!   the pipeline writes between calls only.
//! - This is the only crate that speaks to Kafka in production (besides the embedded test
//!   cluster in `midflight-stack`).

mod config;
mod counters;
mod error;
mod inbox;
mod kafka;
mod pipeline;
mod relay;
mod scheduler;
pub mod telemetry;

use std::sync::Arc;

use midflight_api::client::Downstreams;
use midflight_config::Config;
use midflight_driver::{Downstream, Driver};
use midflight_store::Store;
use rdkafka::consumer::Consumer;
use tokio_util::sync::CancellationToken;

pub use config::{
    BATCH_LINGER_MS_MAX, ConsumerConfig, ConsumerSection, DELIVERY_TIMEOUT_MS_MAX, IN_FLIGHT_CEILING,
    PAUSE_AFTER_MS_MAX, RELAY_LINGER_MS_MAX, RelaySection, SHUTDOWN_DEADLINE_MS_MAX,
};
pub use counters::{Counters, Snapshot};
pub use error::{Error, MessageRef};
pub use inbox::{BIZ_ID_HEADER, ERROR_HEADER, SOURCE_HEADER, TRACEPARENT_HEADER};

/// Connects to the database and the downstreams named in `config`, then runs the consumer
/// until `shutdown` is cancelled.
pub async fn run(config: ConsumerConfig, shutdown: CancellationToken) -> Result<(), Error> {
    check(&config)?;
    let store = Store::connect(&config.database).await?;
    if config.consumer.migrate_on_start {
        store.migrate().await?;
    }
    let downstreams = Downstreams::connect_lazy(&config.wms, &config.logistics)?;
    run_with(config, store, downstreams, Arc::new(Counters::default()), shutdown).await
}

/// Runs the consumer with a store and downstream clients the caller made (tests wrap the
/// downstreams to count calls), publishing what it does to `counters`. The `database`, `wms`
/// and `logistics` sections of `config` are not used.
pub async fn run_with<D: Downstream>(
    config: ConsumerConfig,
    store: Store,
    downstream: D,
    counters: Arc<Counters>,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    check(&config)?;
    let owner = owner_id(&config.consumer.instance);
    let actor = format!("consumer:{owner}");
    let context = kafka::Context::new(&owner, counters.clone());
    let consumer = kafka::consumer(&config.kafka, &owner, context)?;
    let producer = kafka::producer(&config.kafka, &owner, config.consumer.delivery_timeout_ms)?;
    consumer.subscribe(&[config.kafka.order_topic.as_str()]).map_err(Error::kafka("subscribe"))?;
    tracing::info!(owner, topic = %config.kafka.order_topic, group = %config.kafka.group_id, "consumer started");
    telemetry::observe(&counters);
    midflight_driver::telemetry::observe_store(&store);
    midflight_service::readiness().set_ready(true);

    // With a relay here, the outbox rows of the sagas this process finishes are written
    // claimed for it and handed to it by key; without one they are written unclaimed.
    let handoff = config.consumer.relay.enabled.then(|| Arc::new(relay::Handoff::default()));
    let store = if handoff.is_some() { store.with_outbox_claim(&owner, relay::HANDOFF_CLAIM_MS)? } else { store };
    // Stops the drivers (before their next call) and the relay; cancelled by the shutdown path.
    let stop = CancellationToken::new();
    // Kept to report what the store wrote, once everything else has stopped.
    let written = store.clone();
    let driver = Driver::new(
        store.clone(),
        downstream,
        config.rules,
        config.driver.clone(),
        owner.clone(),
        actor.clone(),
        stop.clone(),
    );
    let producer_fatal = CancellationToken::new();
    let relay = handoff.clone().map(|handoff| {
        let relay = relay::Relay {
            store: store.clone(),
            producer: producer.clone(),
            topic: config.kafka.notification_topic.clone(),
            owner: owner.clone(),
            settings: config.consumer.relay.clone(),
            counters: counters.clone(),
            handoff,
            fatal: producer_fatal.clone(),
        };
        tokio::spawn(relay.run(stop.clone()))
    });
    let mut pipeline = pipeline::Pipeline {
        consumer,
        producer,
        store,
        scheduler: scheduler::Scheduler::new(Arc::new(driver), counters.clone(), handoff.clone()),
        settings: config.consumer.clone(),
        dead_letter_topic: config.kafka.dead_letter_topic.clone(),
        owner: owner.clone(),
        actor,
        lease_ms: config.driver.lease_ms,
        counters,
        paused: false,
        full_since: None,
        generation: 0,
        errors: kafka::Throttle::default(),
        pending: std::collections::VecDeque::new(),
        broken: false,
        orphans: Vec::new(),
        producer_fatal,
    };
    let result = pipeline.run(&shutdown).await;
    if let Err(error) = &result {
        tracing::error!(owner, %error, "consumer stopping on an error");
    }
    pipeline.shutdown(&stop).await;
    if let Some(relay) = relay {
        let deadline = std::time::Duration::from_millis(config.consumer.shutdown_deadline_ms);
        if tokio::time::timeout(deadline, relay).await.is_err() {
            tracing::warn!(owner, "outbox relay did not stop in time; its claims expire");
        }
    }
    if let Some(handoff) = &handoff {
        relay::release_left(&written, &owner, handoff).await;
    }
    let stats = written.stats();
    tracing::info!(
        owner,
        write_txns = stats.write_txns,
        transitions = stats.transitions,
        write_batches = stats.batches,
        retried = stats.retried,
        opened_on_insert = stats.opened_on_insert,
        gave_way = stats.gave_way,
        refused = stats.refused,
        "consumer stopped"
    );
    result
}

fn check(config: &ConsumerConfig) -> Result<(), Error> {
    let problems = config.problems();
    if problems.is_empty() { Ok(()) } else { Err(Error::Config { problems }) }
}

/// `instance` plus a random suffix: unique per process incarnation, as the inbox requires.
fn owner_id(instance: &str) -> String {
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    format!("{instance}-{}", &suffix[..12])
}
