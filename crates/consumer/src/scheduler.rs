//! Which saga runs when: sagas of different orders run concurrently (one tokio task each),
//! sagas of one order run one at a time in the order they arrived (I5). Each order has a queue
//! whose front is running; the next starts only when the one before has ended, whatever the
//! outcome. (If the earlier saga ended unfinished, handed off to recovery, `Driver::drive`
//! sees it in the database and hands the later one off too.)
//!
//! The scheduler is also the in-flight set: a biz_id accepted here is not accepted again until
//! its drive has ended, so a redelivered message is never inserted or driven twice by one
//! process (the inbox would report our own version-0 row as fresh again).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use midflight_driver::{Downstream, Driver, Outcome};
use midflight_model::{Call, Saga};
use tokio::task::{Id, JoinSet};

use crate::counters::Counters;
use crate::relay::Handoff;

/// Work for one saga.
#[derive(Debug)]
pub(crate) struct Job {
    pub biz_id: String,
    pub order_no: String,
    pub kind: JobKind,
}

#[derive(Debug)]
pub(crate) enum JobKind {
    /// A row this process just inserted and holds the lease of (since `leased_at`).
    /// With `order_checked`, no earlier saga of its order was unfinished once the row was in.
    /// With `opened`, the inbox also wrote its first step, the intent of that call, which the
    /// drive makes first.
    Fresh { saga: Box<Saga>, leased_at: Instant, order_checked: bool, opened: Option<Call> },
    /// A redelivered row whose lease expired: claim it through the recovery worker's CAS path.
    Claim,
}

/// How one job ended.
#[derive(Debug)]
pub(crate) struct Ended {
    pub biz_id: String,
    pub order_no: String,
    pub how: How,
}

#[derive(Debug)]
pub(crate) enum How {
    Drove(Outcome),
    /// Someone else won the claim (or the row was no longer claimable).
    ClaimLost,
    /// The task panicked or was aborted at the shutdown deadline; the lease expires.
    Aborted,
}

/// Per-order queues over a set of running drives.
#[derive(Debug)]
pub(crate) struct Scheduler<D> {
    driver: Arc<Driver<D>>,
    counters: Arc<Counters>,
    /// Where the keys of the sagas finished DONE go, when this process runs a relay (their
    /// outbox rows were written claimed for it).
    handoff: Option<Arc<Handoff>>,
    in_flight: HashSet<String>,
    orders: HashMap<String, VecDeque<Job>>,
    tasks: JoinSet<Ended>,
    /// Which job a task runs, so a panicked task still releases its order.
    running: HashMap<Id, (String, String)>,
}

impl<D: Downstream> Scheduler<D> {
    pub(crate) fn new(driver: Arc<Driver<D>>, counters: Arc<Counters>, handoff: Option<Arc<Handoff>>) -> Scheduler<D> {
        Scheduler {
            driver,
            counters,
            handoff,
            in_flight: HashSet::new(),
            orders: HashMap::new(),
            tasks: JoinSet::new(),
            running: HashMap::new(),
        }
    }

    pub(crate) fn driver(&self) -> &Driver<D> {
        &self.driver
    }

    /// Sagas accepted and not yet ended.
    pub(crate) fn len(&self) -> usize {
        self.in_flight.len()
    }

    pub(crate) fn contains(&self, biz_id: &str) -> bool {
        self.in_flight.contains(biz_id)
    }

    /// Accepts a job: it starts now if its order is idle, else after the jobs ahead of it.
    pub(crate) fn accept(&mut self, job: Job) {
        debug_assert!(!self.in_flight.contains(&job.biz_id), "{} accepted twice", job.biz_id);
        self.in_flight.insert(job.biz_id.clone());
        let order_no = job.order_no.clone();
        let queue = self.orders.entry(order_no.clone()).or_default();
        queue.push_back(job);
        if queue.len() == 1 {
            self.start_front(&order_no);
        }
        self.gauge();
    }

    /// The next ended job, or `None` when nothing is running.
    pub(crate) async fn join_next(&mut self) -> Option<Ended> {
        let joined = self.tasks.join_next_with_id().await?;
        Some(match joined {
            Ok((id, ended)) => {
                self.running.remove(&id);
                ended
            }
            Err(error) => {
                let (biz_id, order_no) = self.running.remove(&error.id()).unwrap_or_default();
                if error.is_panic() {
                    tracing::error!(
                        biz_id,
                        order_no,
                        "saga task panicked; its lease will expire and recovery resumes it"
                    );
                }
                Ended { biz_id, order_no, how: How::Aborted }
            }
        })
    }

    /// Books an ended job and starts the next saga of its order, if any.
    pub(crate) fn ended(&mut self, ended: Ended) {
        match &ended.how {
            How::Drove(outcome) => {
                self.counters.ended(outcome);
                if matches!(outcome, Outcome::Finished(midflight_model::Status::Done))
                    && let Some(handoff) = &self.handoff
                    && !handoff.offer(ended.biz_id.clone())
                {
                    Counters::add(&self.counters.relay_handoffs_dropped, 1);
                }
            }
            How::ClaimLost => Counters::add(&self.counters.claims_lost, 1),
            How::Aborted => Counters::add(&self.counters.aborted, 1),
        }
        self.in_flight.remove(&ended.biz_id);
        if let Some(queue) = self.orders.get_mut(&ended.order_no) {
            queue.pop_front();
            if queue.is_empty() {
                self.orders.remove(&ended.order_no);
            } else {
                self.start_front(&ended.order_no);
            }
        }
        self.gauge();
    }

    /// Stops accepting: takes every queued (not started) job out, and returns the fresh rows
    /// among them (opened or not) so the caller can release their leases.
    pub(crate) fn drain_queued(&mut self) -> Vec<Saga> {
        let mut fresh = Vec::new();
        for queue in self.orders.values_mut() {
            // The front of each queue is running; everything behind it never started.
            for job in queue.drain(1..) {
                self.in_flight.remove(&job.biz_id);
                if let JobKind::Fresh { saga, .. } = job.kind {
                    fresh.push(*saga);
                }
            }
        }
        self.gauge();
        fresh
    }

    /// Running drives.
    pub(crate) fn running(&self) -> usize {
        self.tasks.len()
    }

    /// Aborts every running drive (their leases expire; recovery resumes them).
    pub(crate) async fn abort_all(&mut self) {
        Counters::add(&self.counters.aborted, self.tasks.len() as u64);
        self.tasks.shutdown().await;
        self.running.clear();
        self.in_flight.clear();
        self.orders.clear();
        self.gauge();
    }

    fn start_front(&mut self, order_no: &str) {
        let Some(job) = self.orders.get_mut(order_no).and_then(|queue| queue.front_mut()) else { return };
        let kind = std::mem::replace(&mut job.kind, JobKind::Claim);
        let (biz_id, order_no) = (job.biz_id.clone(), job.order_no.clone());
        let driver = self.driver.clone();
        let task_biz_id = biz_id.clone();
        let task_order_no = order_no.clone();
        let handle = self.tasks.spawn(async move {
            let how = match kind {
                JobKind::Fresh { saga, leased_at, opened: Some(call), .. } => {
                    How::Drove(driver.drive_opened(*saga, leased_at, call).await)
                }
                JobKind::Fresh { saga, leased_at, order_checked, opened: None } => {
                    How::Drove(driver.drive_fresh(*saga, leased_at, order_checked).await)
                }
                JobKind::Claim => driver.claim_and_drive(&task_biz_id).await.map_or(How::ClaimLost, How::Drove),
            };
            Ended { biz_id: task_biz_id, order_no: task_order_no, how }
        });
        self.running.insert(handle.id(), (biz_id, order_no));
    }

    fn gauge(&self) {
        Counters::set(&self.counters.in_flight, self.in_flight.len() as u64);
    }
}
