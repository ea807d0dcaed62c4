//! The one resume routine. The consumer (for fresh messages and expired rows it re-receives)
//! and the recovery worker (for abandoned rows it finds) both hand a leased saga to
//! [`Driver::drive`]; there is no second copy of the rules anywhere.
//!
//! The loop: ask the planner, write its change with a CAS, make the call it names, feed the
//! answer back to the planner. A lost CAS stops the loop at once: no further call is made by
//! a driver that no longer owns the saga. The lease is renewed before any call that could
//! outlive it, and every call's deadline is shorter than the lease.
//!
//! Architecture invariant: no database connection or row lock is held while a downstream call
//! is in flight; the store is used between calls only.

mod downstream;
mod settings;
pub mod telemetry;

use std::time::{Duration, Instant};

use midflight_model::{Call, Change, Observation, Plan, Rules, Saga, Status, plan};
use midflight_store::{Cas, Store};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

pub use downstream::Downstream;
pub use settings::DriverSettings;

/// Most downstream calls in a row without a write in between. The planner always writes after
/// a definitive answer; a longer run means a downstream answering nonsense, which is then
/// treated like no answer (counted, backed off, eventually a ticket).
const CALLS_WITHOUT_WRITE_MAX: u32 = 4;

/// What a takeover came to.
#[derive(Debug)]
pub enum Takeover {
    /// Someone else holds the saga or took it first.
    Lost,
    /// The claim's statement failed: nothing was taken over.
    ClaimFailed(midflight_store::Error),
    /// Claimed, and driven to this outcome.
    Drove(Outcome),
}

/// How a drive ended.
#[derive(Debug)]
pub enum Outcome {
    /// The saga reached a terminal status.
    Finished(Status),
    /// A CAS failed: someone else owns the saga now. Nothing more was sent.
    Lost,
    /// The saga waits (backoff after an unreachable downstream, or an earlier saga of its order);
    /// the lease was released and whoever comes later resumes it.
    HandedOff,
    /// Shutdown was requested; the saga is at a durable point and its lease released.
    Stopped,
    /// The store failed; the lease will expire and recovery will resume the saga.
    Failed(midflight_store::Error),
}

/// Drives sagas for one owner (a process incarnation).
#[derive(Debug, Clone)]
pub struct Driver<D> {
    store: Store,
    downstream: D,
    rules: Rules,
    settings: DriverSettings,
    owner: String,
    actor: String,
    shutdown: CancellationToken,
}

/// The first step of a fresh saga (a RECEIVED row its caller is about to insert and lease at
/// `now_ms`), when that step is a write followed by a call: what the inbox may write in the
/// transaction that inserts the row ([`midflight_store::Store::receive`]), so the drive starts
/// at the call ([`Driver::drive_opened`]). The planner decides it, as it decides every step;
/// `None` when the step is anything else (a payload the planner parks, a deadline already
/// passed), which the drive then writes itself.
pub fn opening(saga: &Saga, now_ms: i64, rules: &Rules) -> Option<(Change, Call)> {
    if saga.status != Status::Received {
        return None;
    }
    match plan(saga, &Observation::Nothing, now_ms, rules) {
        Plan::Write { change, then: Some(call) } if !change.release_lease && change.ticket.is_none() => {
            Some((change, call))
        }
        _ => None,
    }
}

/// Per-drive state: the row as last written, how long our lease surely lasts, and the time
/// spent in downstream calls since the last write (the next write records it in the log).
struct Held {
    saga: Saga,
    lease_valid_until: Instant,
    call_ms: Option<u64>,
    /// The caller found no earlier unfinished saga of the order in the transaction that
    /// inserted the row.
    order_checked: bool,
}

impl<D: Downstream> Driver<D> {
    /// `owner` must be unique per process incarnation; `actor` names it in the transition log.
    pub fn new(
        store: Store,
        downstream: D,
        rules: Rules,
        settings: DriverSettings,
        owner: String,
        actor: String,
        shutdown: CancellationToken,
    ) -> Driver<D> {
        Driver { store, downstream, rules, settings, owner, actor, shutdown }
    }

    pub fn owner(&self) -> &str {
        &self.owner
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn settings(&self) -> &DriverSettings {
        &self.settings
    }

    pub fn rules(&self) -> &Rules {
        &self.rules
    }

    /// The biz_id of an earlier unfinished saga of the same order, if `saga` must wait for it.
    /// Only a saga that has not started can be made to wait: once started, its predecessors
    /// were already finished. Terminal states are final for automation, and an operator's
    /// send-back of a MANUAL_REVIEW saga is refused while a later saga of its order is in the
    /// table ([`Store::resolve`]; on MySQL a send-back whose transaction overlaps the inbox
    /// transaction that wrote a later saga's row can still slip through: design.md, Gaps).
    pub async fn blocked_by(&self, saga: &Saga) -> Result<Option<String>, midflight_store::Error> {
        if saga.status != Status::Received {
            return Ok(None);
        }
        self.store.earlier_unfinished(saga).await
    }

    /// Takes over an abandoned saga and drives it; `None` if someone else won the claim.
    pub async fn claim_and_drive(&self, biz_id: &str) -> Option<Outcome> {
        match self.take_over(biz_id).await {
            Takeover::Lost => None,
            Takeover::ClaimFailed(error) => Some(Outcome::Failed(error)),
            Takeover::Drove(outcome) => Some(outcome),
        }
    }

    /// [`Driver::claim_and_drive`], telling a claim whose statement failed from a drive that did.
    pub async fn take_over(&self, biz_id: &str) -> Takeover {
        let started = Instant::now();
        match self.store.claim(biz_id, &self.owner, self.settings.lease_ms, &self.actor).await {
            Ok(Cas::Applied(saga)) => {
                tracing::info!(biz_id, status = %saga.status, epoch = saga.lease.epoch, "saga taken over");
                telemetry::takeover(&self.actor);
                Takeover::Drove(self.drive(saga, started).await)
            }
            Ok(Cas::Conflict) => {
                telemetry::conflict(&self.actor, "claim");
                Takeover::Lost
            }
            Err(error) => {
                tracing::warn!(biz_id, %error, "takeover failed; the saga stays for a later scan");
                telemetry::claim_failed(&self.actor);
                Takeover::ClaimFailed(error)
            }
        }
    }

    /// Drives a saga the caller holds (fresh from the inbox or just claimed) until it finishes,
    /// is lost, handed off or stopped. `leased_at` is when the write that gave the lease was sent.
    /// The drive is one `saga.drive` span in the trace stored on the row.
    pub async fn drive(&self, saga: Saga, leased_at: Instant) -> Outcome {
        self.drive_fresh(saga, leased_at, false).await
    }

    /// [`Driver::drive`] for a fresh inbox row. With `order_checked` the caller asked the store,
    /// in the transaction that inserted the row, whether an earlier saga of its order is unfinished
    /// ([`Store::maybe_blocked`], one query per batch) and the answer was no; the drive then
    /// skips that same question per saga. The answer does not go stale: earlier offsets of a
    /// partition are inserted before later ones, so no earlier saga appears afterwards, and an
    /// earlier saga in MANUAL_REVIEW is not sent back to automation once this row is in the
    /// table ([`Store::resolve`]; on MySQL a send-back whose transaction overlaps this row's
    /// inbox transaction can: design.md, Gaps).
    pub async fn drive_fresh(&self, saga: Saga, leased_at: Instant, order_checked: bool) -> Outcome {
        self.drive_from(saga, leased_at, order_checked, None).await
    }

    /// [`Driver::drive`] for a fresh row whose first step the inbox wrote ([`opening`]): the
    /// row records the intent of `call` and nothing has been sent, so the drive starts by making
    /// `call` (not by asking the downstream what became of it, as it would for an intent found
    /// later). `leased_at` is when the inbox write began (the intent's clock was read just
    /// before); the row's order was checked there. A downstream's in-flight window counts from
    /// the intent's clock, so when the drive starts more than one RPC timeout after `leased_at`
    /// (the batch waited on retries or on the batches before it) it first restarts that clock
    /// with a write of its own, as a resend does.
    pub async fn drive_opened(&self, saga: Saga, leased_at: Instant, call: Call) -> Outcome {
        self.drive_from(saga, leased_at, true, Some(call)).await
    }

    async fn drive_from(&self, saga: Saga, leased_at: Instant, order_checked: bool, call: Option<Call>) -> Outcome {
        let span = telemetry::drive_span(&saga, &self.actor);
        let running = telemetry::Running::start(&self.actor);
        let outcome = self.drive_held(saga, leased_at, order_checked, call).instrument(span.clone()).await;
        running.ended(&outcome, &span);
        outcome
    }

    async fn drive_held(&self, saga: Saga, leased_at: Instant, order_checked: bool, call: Option<Call>) -> Outcome {
        let lease_valid_until = leased_at + self.settings.lease();
        let stale = call.is_some() && leased_at.elapsed() > self.settings.rpc_timeout();
        let mut held = Held { saga, lease_valid_until, call_ms: None, order_checked };
        if stale {
            let reason = "opened intent waited before its first call; restarting its clock";
            match self.restart_intent_clock(&mut held, reason).await {
                Ok(true) => {}
                Ok(false) => return Outcome::Lost,
                Err(error) => {
                    tracing::warn!(biz_id = %held.saga.biz_id, %error, "saga drive failed; the lease will expire");
                    return Outcome::Failed(error);
                }
            }
        }
        match self.run(&mut held, call).await {
            Ok(outcome) => outcome,
            Err(error) => {
                tracing::warn!(biz_id = %held.saga.biz_id, status = %held.saga.status, %error, "saga drive failed; the lease will expire");
                Outcome::Failed(error)
            }
        }
    }

    /// The loop; with `first`, the row records that call's intent and the loop starts by making it.
    async fn run(&self, held: &mut Held, first: Option<Call>) -> Result<Outcome, midflight_store::Error> {
        let earlier = if held.order_checked { None } else { self.blocked_by(&held.saga).await? };
        if let Some(earlier) = earlier {
            tracing::debug!(biz_id = %held.saga.biz_id, earlier, "waiting for an earlier saga of the order");
            return self.release(held).await.map(|_| Outcome::HandedOff);
        }
        if first.is_some() {
            telemetry::opened_step(&held.saga);
        }
        let mut observation = match first {
            Some(call) => match self.call(held, call).await? {
                Some(observation) => observation,
                None => return Ok(self.stop_outcome()),
            },
            None => Observation::Nothing,
        };
        let mut calls_without_write = 0;
        loop {
            let now_ms = self.store.now_ms().await?;
            match plan(&held.saga, &observation, now_ms, &self.rules) {
                Plan::Finished => return Ok(Outcome::Finished(held.saga.status)),
                Plan::Write { change, then } => {
                    if !self.write(held, &change, now_ms).await? {
                        return Ok(Outcome::Lost);
                    }
                    calls_without_write = 0;
                    if change.release_lease {
                        return Ok(Outcome::HandedOff);
                    }
                    observation = match then {
                        Some(call) => match self.call(held, call).await? {
                            Some(observation) => observation,
                            None => return Ok(self.stop_outcome()),
                        },
                        None => Observation::Nothing,
                    };
                }
                Plan::Call(call) => {
                    calls_without_write += 1;
                    if calls_without_write > CALLS_WITHOUT_WRITE_MAX {
                        let error = format!("{} calls without a definitive answer", calls_without_write - 1);
                        observation = Observation::Unreachable { step: call.step(), error };
                        continue;
                    }
                    observation = match self.call(held, call).await? {
                        Some(observation) => observation,
                        None => return Ok(self.stop_outcome()),
                    };
                }
            }
        }
    }

    /// Writes a new start for the in-flight window of the intent the row records (nothing has
    /// been sent under it yet); `false` if the saga was lost meanwhile.
    async fn restart_intent_clock(&self, held: &mut Held, reason: &str) -> Result<bool, midflight_store::Error> {
        let change = Change { restart_intent_clock: true, reason: reason.to_owned(), ..Change::default() };
        let now_ms = self.store.now_ms().await?;
        self.write(held, &change, now_ms).await
    }

    /// Whether `call` would be sent more than an RPC timeout after its intent's clock was read,
    /// to a downstream that does not deduplicate our request id: its in-flight window (after
    /// which a query's "not found" lets a resend go) counts from that clock, so a request sent
    /// late could still land after a resend. The intent is stamped when its write is planned,
    /// and the write may wait (a busy group, a pool, a lock) before the call goes.
    async fn intent_clock_stale(&self, held: &Held, call: Call) -> Result<bool, midflight_store::Error> {
        if !matches!(call, Call::LockStock | Call::CreateShipment) {
            return Ok(false);
        }
        let contract = self.rules.contract(call.step());
        // Only for a downstream that never deduplicates: one with a finite window counts it from
        // its first request, and a restarted clock would make the planner believe in a window
        // that has ended (it asks a person once the window is over).
        let never_deduplicates = contract.idempotent_for_ms.is_none_or(|window| window <= 0);
        let Some(intent_at_ms) = held.saga.intent_at_ms.filter(|_| never_deduplicates) else { return Ok(false) };
        let now_ms = self.store.now_ms().await?;
        let rpc_timeout_ms = i64::try_from(self.settings.rpc_timeout_ms).unwrap_or(i64::MAX);
        Ok(now_ms.saturating_sub(intent_at_ms) > rpc_timeout_ms)
    }

    /// Writes `change` to the held row at `now_ms` (with the time of the call it records, if
    /// any), traced as a step; on success the row and its lease move on. `false` when the row
    /// was no longer ours: someone else owns the saga now, and the drive must stop.
    async fn write(&self, held: &mut Held, change: &Change, now_ms: i64) -> Result<bool, midflight_store::Error> {
        let step = telemetry::StepTrace::start(&held.saga, change);
        let sent = Instant::now();
        let call_ms = held.call_ms.take();
        match self.store.write_timed(&held.saga, change, now_ms, self.settings.lease_ms, &self.actor, call_ms).await? {
            Cas::Conflict => {
                step.conflict(&self.actor);
                tracing::info!(biz_id = %held.saga.biz_id, status = %held.saga.status, "lost the saga to another owner; stopping");
                Ok(false)
            }
            Cas::Applied(next) => {
                step.applied(&held.saga, change);
                log_write(&held.saga, &next, &change.reason);
                held.saga = next;
                held.lease_valid_until = sent + self.settings.lease();
                Ok(true)
            }
        }
    }

    /// Makes `call`, renewing the lease first if the call could outlive it. `None` when the
    /// driver must stop instead (shutdown, or the lease was lost on renewal).
    async fn call(&self, held: &mut Held, call: Call) -> Result<Option<Observation>, midflight_store::Error> {
        debug_assert_eq!(call.intent(), held.saga.status, "a call is only made in its intent state");
        if self.shutdown.is_cancelled() {
            self.release(held).await?;
            return Ok(None);
        }
        if self.intent_clock_stale(held, call).await? {
            let reason = "intent waited more than an RPC timeout before its call; restarting its clock";
            if !self.restart_intent_clock(held, reason).await? {
                return Ok(None);
            }
        }
        let needed = self.settings.rpc_timeout() + self.settings.lease_margin();
        if Instant::now() + needed >= held.lease_valid_until {
            let sent = Instant::now();
            match self.store.renew(&held.saga, self.settings.lease_ms).await? {
                Cas::Applied(next) => {
                    held.saga = next;
                    held.lease_valid_until = sent + self.settings.lease();
                }
                Cas::Conflict => {
                    telemetry::conflict(&self.actor, "renew");
                    tracing::info!(biz_id = %held.saga.biz_id, "lease lost before the call; not sending");
                    return Ok(None);
                }
            }
        }
        let started = Instant::now();
        let rpc = telemetry::rpc_span(call, &held.saga);
        let carried = telemetry::carried(&held.saga, &rpc);
        let observation =
            self.downstream.call(call, &carried, self.settings.rpc_timeout()).instrument(rpc.clone()).await;
        telemetry::called(call, &observation, started.elapsed(), &rpc);
        let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        held.call_ms = Some(held.call_ms.unwrap_or(0).saturating_add(elapsed_ms));
        tracing::debug!(
            biz_id = %held.saga.biz_id,
            call = call.name(),
            answer = %observation.label(),
            elapsed_ms,
            "downstream answered"
        );
        Ok(Some(observation))
    }

    async fn release(&self, held: &mut Held) -> Result<(), midflight_store::Error> {
        if let Cas::Applied(next) = self.store.release(&held.saga).await? {
            held.saga = next;
        }
        Ok(())
    }

    fn stop_outcome(&self) -> Outcome {
        if self.shutdown.is_cancelled() { Outcome::Stopped } else { Outcome::Lost }
    }
}

fn log_write(before: &Saga, after: &Saga, reason: &str) {
    if before.status != after.status {
        tracing::debug!(
            biz_id = %after.biz_id,
            from = %before.status,
            to = %after.status,
            version = after.version,
            epoch = after.lease.epoch,
            reason,
            "saga transition"
        );
    } else if let Some(error) = &after.last_error {
        tracing::info!(biz_id = %after.biz_id, status = %after.status, attempts = after.attempts, error, "saga backing off");
    }
}

/// Helper for callers that wait on a duration derived from settings.
pub fn millis(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}
