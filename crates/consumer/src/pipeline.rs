//! The consumer's main loop: take a batch from Kafka, make it durable in the inbox (one
//! transaction; dead-letter copies delivered first), only then commit its offsets, then hand
//! each row to the scheduler: fresh rows are driven, redelivered rows are left alone unless
//! their lease expired, in which case they go through the same claim as recovery.
//!
//! Flow control: at `in_flight_max` sagas the assigned partitions are paused (fetching stops,
//! `recv` keeps serving rebalances) and resumed at `resume_below`.
//!
//! Shutdown: stop taking messages, stop the drivers (each stops before its next call and
//! releases its lease), release the leases of queued sagas that never started, wait for running
//! sagas up to `shutdown_deadline_ms`, commit what is durable, leave the group.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use midflight_driver::Downstream;
use midflight_model::{Saga, Status};
use midflight_store::{Arrival, Store};
use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::error::KafkaResult;
use tokio_util::sync::CancellationToken;

use crate::config::ConsumerSection;
use crate::counters::Counters;
use crate::error::Error;
use crate::inbox::{self, Incoming, Poison};
use crate::kafka::{Client, Partition, Producer, Throttle};
use crate::scheduler::{Ended, Job, JobKind, Scheduler};

/// Attempts at making one batch durable before `run` gives up (and the process restarts from
/// the last committed offsets). Five attempts with the backoff below ride out ~3 s of trouble.
const BATCH_ATTEMPTS_MAX: u32 = 5;
/// First wait between attempts; doubled each time.
const BATCH_BACKOFF_BASE: Duration = Duration::from_millis(200);
/// Leases of never-started sagas released at once during shutdown.
const RELEASE_CONCURRENCY: usize = 16;

/// Everything the loop owns.
pub(crate) struct Pipeline<D> {
    pub consumer: Client,
    pub producer: Producer,
    pub store: Store,
    pub scheduler: Scheduler<D>,
    pub settings: ConsumerSection,
    pub dead_letter_topic: String,
    pub owner: String,
    pub actor: String,
    pub lease_ms: i64,
    pub counters: Arc<Counters>,
    pub paused: bool,
    /// The rebalance generation the pause state was last applied to.
    pub generation: u64,
    pub errors: Throttle,
}

enum Event {
    Stop,
    Ended(Ended),
    Message(KafkaResult<Incoming>),
}

/// A batch made durable.
struct Durable {
    arrivals: Vec<Arrival>,
    /// When the inbox write that leased the fresh rows was sent.
    leased_at: Instant,
    /// Database-clock reading taken just before the write.
    now_ms: i64,
    parked: HashSet<String>,
    duplicates: u64,
    /// Fresh rows whose order may have an earlier unfinished saga: their drivers ask again
    /// when they start; the others skip the question (one query for the batch instead).
    maybe_blocked: HashSet<String>,
}

impl<D: Downstream> Pipeline<D> {
    /// Runs until `shutdown` is cancelled (`Ok`) or a batch cannot be made durable (`Err`).
    pub(crate) async fn run(&mut self, shutdown: &CancellationToken) -> Result<(), Error> {
        loop {
            self.flow();
            let event = tokio::select! {
                biased;
                () = shutdown.cancelled() => Event::Stop,
                Some(ended) = self.scheduler.join_next() => Event::Ended(ended),
                message = recv(&self.consumer) => Event::Message(message),
            };
            match event {
                Event::Stop => return Ok(()),
                Event::Ended(ended) => self.scheduler.ended(ended),
                Event::Message(Ok(first)) => {
                    let batch = self.collect(first).await;
                    self.accept(batch, shutdown).await?;
                }
                Event::Message(Err(error)) => self.consumer_error(&error),
            }
        }
    }

    /// Gathers more messages after `first`, for up to `batch_linger_ms`, up to `batch_max` or
    /// the room left below `in_flight_max`, whichever is less: a batch never carries the
    /// in-flight count far past its bound (only a message already fetched when the partitions
    /// were paused can).
    async fn collect(&self, first: Incoming) -> Vec<Incoming> {
        let room = self.settings.in_flight_max.saturating_sub(self.scheduler.len());
        let size_max = room.clamp(1, self.settings.batch_max);
        let mut batch = Vec::with_capacity(size_max);
        batch.push(first);
        let linger_until = tokio::time::Instant::now() + Duration::from_millis(self.settings.batch_linger_ms);
        while batch.len() < size_max {
            match tokio::time::timeout_at(linger_until, recv(&self.consumer)).await {
                Ok(Ok(message)) => batch.push(message),
                Ok(Err(error)) => self.consumer_error(&error),
                Err(_) => break,
            }
        }
        Counters::add(&self.counters.received, batch.len() as u64);
        batch
    }

    /// librdkafka reports fetch and broker trouble through `recv`; it retries by itself.
    fn consumer_error(&self, error: &rdkafka::error::KafkaError) {
        if let Some(held_back) = self.errors.admit() {
            tracing::warn!(owner = %self.owner, %error, held_back, "kafka consumer error");
        }
    }

    /// Makes `batch` durable, commits its offsets, and schedules its sagas.
    async fn accept(&mut self, batch: Vec<Incoming>, shutdown: &CancellationToken) -> Result<(), Error> {
        let started = Instant::now();
        let Some(durable) = self.make_durable(&batch, shutdown).await? else { return Ok(()) };
        tracing::debug!(
            messages = batch.len(),
            durable_ms = started.elapsed().as_millis() as u64,
            "batch made durable"
        );
        self.commit(&inbox::next_offsets(&batch));
        Counters::add(&self.counters.batches, 1);
        Counters::add(&self.counters.parked, durable.parked.len() as u64);
        crate::telemetry::arrived(Status::Parked, durable.parked.len());
        Counters::add(&self.counters.duplicates_in_flight, durable.duplicates);
        self.schedule(durable);
        Ok(())
    }

    /// [`Self::try_make_durable`] with bounded retries; `None` if shutdown interrupted them.
    async fn make_durable(&self, batch: &[Incoming], shutdown: &CancellationToken) -> Result<Option<Durable>, Error> {
        let mut attempt = 1;
        loop {
            let error = match self.try_make_durable(batch).await {
                Ok(durable) => return Ok(Some(durable)),
                Err(error) => error,
            };
            let first = &batch[0];
            if attempt >= BATCH_ATTEMPTS_MAX {
                let biz_id = inbox::arrive(first, 0, 0).saga.biz_id;
                return Err(Error::Batch {
                    first: Box::new(first.reference(&biz_id)),
                    messages: batch.len(),
                    attempts: attempt,
                    last: Box::new(error),
                });
            }
            let backoff = BATCH_BACKOFF_BASE * 2_u32.pow(attempt - 1);
            tracing::warn!(
                topic = %first.topic, partition = first.partition, offset = first.offset, messages = batch.len(),
                attempt, %error, "batch not made durable; retrying"
            );
            tokio::select! {
                () = shutdown.cancelled() => return Ok(None),
                () = tokio::time::sleep(backoff) => {}
            }
            attempt += 1;
        }
    }

    /// Parses the batch, delivers dead-letter copies, and inserts the rows in one transaction.
    async fn try_make_durable(&self, batch: &[Incoming]) -> Result<Durable, Error> {
        let now_ms = self.store.now_ms().await?;
        let mut sagas = Vec::with_capacity(batch.len());
        let mut errors = Vec::new();
        let mut duplicates = 0;
        for message in batch {
            let arrived = inbox::arrive(message, now_ms, self.settings.saga_deadline_ms);
            // Our own saga, redelivered while we drive it: its row exists already.
            if self.scheduler.contains(&arrived.saga.biz_id) {
                duplicates += 1;
                continue;
            }
            if let Some(error) = arrived.poison {
                errors.push((message, sagas.len(), error));
            }
            sagas.push(arrived.saga);
        }
        let poison: Vec<Poison<'_>> =
            errors.iter().map(|(message, index, error)| Poison { message, saga: &sagas[*index], error }).collect();
        inbox::dead_letter(&self.producer, &self.dead_letter_topic, &poison).await?;
        let parked = poison.iter().map(|p| p.saga.biz_id.clone()).collect();
        let leased_at = Instant::now();
        let arrivals = self.store.insert_arrivals(&sagas, &self.owner, self.lease_ms, &self.actor).await?;
        let fresh: Vec<&Saga> = arrivals
            .iter()
            .filter_map(|arrival| match arrival {
                Arrival::Fresh(saga) => Some(saga),
                Arrival::Existing(_) => None,
            })
            .collect();
        let maybe_blocked = self.store.maybe_blocked(&fresh).await?;
        Ok(Durable { arrivals, leased_at, now_ms, parked, duplicates, maybe_blocked })
    }

    /// Commits offsets of a durable batch, asynchronously: a failed commit is superseded by
    /// the next one, and by the synchronous commits on revoke and shutdown.
    fn commit(&self, next: &BTreeMap<Partition, i64>) {
        let list = self.consumer.context().made_durable(next);
        if list.count() == 0 {
            return;
        }
        match self.consumer.commit(&list, CommitMode::Async) {
            Ok(()) => Counters::add(&self.counters.commits, 1),
            Err(error) => {
                Counters::add(&self.counters.commit_failures, 1);
                tracing::warn!(owner = %self.owner, %error, "offset commit not sent; the next one carries it");
            }
        }
    }

    fn schedule(&mut self, durable: Durable) {
        let Durable { arrivals, leased_at, now_ms, parked, maybe_blocked, .. } = durable;
        for arrival in arrivals {
            match arrival {
                Arrival::Fresh(saga) => {
                    Counters::add(&self.counters.fresh, 1);
                    crate::telemetry::arrived(Status::Received, 1);
                    tracing::debug!(biz_id = %saga.biz_id, topic = %saga.source.topic, partition = saga.source.partition,
                        offset = saga.source.offset, "saga received");
                    let (biz_id, order_no) = (saga.biz_id.clone(), saga.order_no.clone());
                    self.scheduler.accept(Job {
                        biz_id,
                        order_no,
                        kind: JobKind::Fresh {
                            order_checked: !maybe_blocked.contains(&saga.biz_id),
                            saga: Box::new(saga),
                            leased_at,
                        },
                    });
                }
                Arrival::Existing(saga) if parked.contains(&saga.biz_id) => {}
                Arrival::Existing(saga) => self.redelivered(saga, now_ms),
            }
        }
    }

    /// A message whose row existed: leave it, or claim it if its owner's lease has expired.
    fn redelivered(&mut self, saga: Saga, now_ms: i64) {
        let busy = saga.status.is_terminal() || saga.lease_live(now_ms);
        if busy || self.scheduler.contains(&saga.biz_id) {
            tracing::debug!(biz_id = %saga.biz_id, status = %saga.status, topic = %saga.source.topic,
                partition = saga.source.partition, offset = saga.source.offset, "redelivered saga left alone");
            let counter = if busy { &self.counters.skipped } else { &self.counters.duplicates_in_flight };
            Counters::add(counter, 1);
            return;
        }
        tracing::info!(biz_id = %saga.biz_id, status = %saga.status, "redelivered saga with an expired lease; claiming");
        Counters::add(&self.counters.claims, 1);
        self.scheduler.accept(Job { biz_id: saga.biz_id, order_no: saga.order_no, kind: JobKind::Claim });
    }

    /// Pauses the assignment at `in_flight_max`, resumes it at `resume_below`, and re-pauses
    /// partitions assigned while paused.
    fn flow(&mut self) {
        let in_flight = self.scheduler.len();
        let generation = self.consumer.context().generation();
        let moved = generation != self.generation;
        self.generation = generation;
        if self.paused && in_flight <= self.settings.resume_below {
            self.paused = false;
            tracing::info!(owner = %self.owner, in_flight, "resuming partitions");
            self.apply(false);
        } else if !self.paused && in_flight >= self.settings.in_flight_max {
            self.paused = true;
            Counters::add(&self.counters.pauses, 1);
            tracing::info!(owner = %self.owner, in_flight, "in-flight limit reached; pausing partitions");
            self.apply(true);
        } else if self.paused && moved {
            self.apply(true);
        }
    }

    fn apply(&self, pause: bool) {
        let assignment = self.consumer.context().assignment();
        let result = if pause { self.consumer.pause(&assignment) } else { self.consumer.resume(&assignment) };
        if let Err(error) = result {
            tracing::warn!(owner = %self.owner, pause, %error, "pause or resume failed");
        }
    }

    /// The graceful stop. `stop` is the drivers' token.
    pub(crate) async fn shutdown(mut self, stop: &CancellationToken) {
        stop.cancel();
        self.apply(true);
        let queued = self.scheduler.drain_queued();
        tracing::info!(owner = %self.owner, running = self.scheduler.running(), queued = queued.len(), "shutting down");
        release(&self.store, queued).await;
        let deadline = tokio::time::Instant::now() + Duration::from_millis(self.settings.shutdown_deadline_ms);
        while self.scheduler.running() > 0 {
            match tokio::time::timeout_at(deadline, self.scheduler.join_next()).await {
                Ok(Some(ended)) => self.scheduler.ended(ended),
                Ok(None) => break,
                Err(_) => {
                    tracing::warn!(owner = %self.owner, abandoned = self.scheduler.running(),
                        "shutdown deadline passed; abandoning running sagas to recovery (their leases expire)");
                    self.scheduler.abort_all().await;
                    break;
                }
            }
        }
        let Pipeline { consumer, owner, counters, .. } = self;
        // Committing synchronously and leaving the group block on the network: not on a worker.
        let left = tokio::task::spawn_blocking(move || {
            let durable = consumer.context().durable();
            if durable.count() > 0 {
                let result = consumer.commit(&durable, CommitMode::Sync);
                Counters::add(if result.is_ok() { &counters.commits } else { &counters.commit_failures }, 1);
                if let Err(error) = result {
                    tracing::warn!(owner = %owner, %error, "final offset commit failed; the next owner re-reads and skips existing rows");
                }
            }
            // Dropping the consumer closes it: the revoke callback commits once more, then it leaves.
            drop(consumer);
            tracing::info!(owner = %owner, "left the consumer group");
        });
        if left.await.is_err() {
            tracing::warn!("leaving the consumer group panicked");
        }
    }
}

async fn recv(consumer: &Client) -> KafkaResult<Incoming> {
    consumer.recv().await.map(|message| Incoming::detach(&message))
}

/// Gives up the leases of sagas that were accepted but never started, so recovery need not
/// wait for them to expire.
async fn release(store: &Store, sagas: Vec<Saga>) {
    futures::stream::iter(sagas)
        .for_each_concurrent(RELEASE_CONCURRENCY, |saga| async move {
            debug_assert_eq!(saga.status, Status::Received);
            if let Err(error) = store.release(&saga).await {
                tracing::warn!(biz_id = %saga.biz_id, %error, "lease of a queued saga not released; it expires instead");
            }
        })
        .await;
}
