//! Per-call fault decisions, and the one place a mock method's effect is wrapped in them.
//!
//! Every handler of both mocks runs its effect through [`FaultInjector::perform`], so "latency,
//! then maybe refuse, then apply, then maybe lose the answer" is written once. The random draws
//! come from one seeded generator, so a scenario that fixes the seed and the order of its calls
//! sees the same faults every run.

use std::future::Future;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tonic::Status;

use crate::latency;
use crate::plan::FaultPlan;

/// What one call will suffer, drawn before it starts.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// Slept before the effect. Half of the drawn latency, so that a caller's deadline can
    /// expire after the effect has committed, exactly as in the incident.
    pub delay_before: Duration,
    /// Slept after the effect, before answering.
    pub delay_after: Duration,
    /// Refuse with UNAVAILABLE before applying anything, with this message.
    pub refusal: Option<&'static str>,
    /// Apply, then answer UNAVAILABLE instead of the real answer.
    pub drop_response: bool,
}

#[derive(Debug)]
struct State {
    plan: FaultPlan,
    rng: StdRng,
}

/// The fault plan in force and the generator of its random draws.
#[derive(Debug)]
pub struct FaultInjector {
    state: Mutex<State>,
}

impl FaultInjector {
    /// Puts `plan` in force. A zero seed is replaced by one from the clock, and the plan then
    /// reports the seed actually used, so any run can be replayed.
    pub fn new(plan: FaultPlan) -> FaultInjector {
        let (plan, rng) = seeded(plan);
        FaultInjector { state: Mutex::new(State { plan, rng }) }
    }

    /// Replaces the whole plan (and reseeds), returning the plan now in force.
    pub fn set_plan(&self, plan: FaultPlan) -> FaultPlan {
        let (plan, rng) = seeded(plan);
        let mut state = self.lock();
        *state = State { plan: plan.clone(), rng };
        plan
    }

    pub fn plan(&self) -> FaultPlan {
        self.lock().plan.clone()
    }

    pub fn legacy_mode(&self) -> bool {
        self.lock().plan.legacy_mode
    }

    /// The irreversibility window, `None` when locks stay reversible forever.
    pub fn irreversible_after_ms(&self) -> Option<i64> {
        let window_ms = self.lock().plan.irreversible_after_ms;
        // The plan's validation caps the window far below i64::MAX.
        (window_ms > 0).then(|| i64::try_from(window_ms).unwrap_or(i64::MAX))
    }

    /// Draws what the next call of `method` will suffer.
    pub fn decide(&self, method: &str) -> Decision {
        let mut state = self.lock();
        let faults = state.plan.method(method);
        let delay = latency::sample(faults.latency, &mut state.rng);
        let fail_draw: f64 = state.rng.random();
        let drop_draw: f64 = state.rng.random();
        let refusal = if faults.unavailable {
            Some("service unavailable (injected)")
        } else if fail_draw < faults.fail_before_apply {
            Some("failed before apply (injected)")
        } else {
            None
        };
        Decision {
            delay_before: delay / 2,
            delay_after: delay - delay / 2,
            refusal,
            drop_response: drop_draw < faults.drop_response,
        }
    }

    /// Runs `effect` as call of `method` under the plan: latency, refusal, the effect itself,
    /// then possibly a lost response.
    pub async fn perform<T, F>(&self, method: &'static str, effect: F) -> Result<T, Status>
    where
        F: Future<Output = Result<T, Status>> + Send + 'static,
        T: Send + 'static,
    {
        let decision = self.decide(method);
        pause(decision.delay_before).await;
        if let Some(refusal) = decision.refusal {
            tracing::debug!(method, "call refused by fault plan");
            return Err(Status::unavailable(refusal));
        }
        // Spawned so that a caller giving up (deadline, disconnect) does not cancel an effect
        // that has begun: a real downstream finishes what it started, and that is what makes
        // an unknown outcome possible at all.
        let answer = tokio::spawn(effect)
            .await
            .map_err(|error| Status::internal(format!("effect of {method} did not finish: {error}")))?;
        pause(decision.delay_after).await;
        if decision.drop_response {
            tracing::info!(method, applied = answer.is_ok(), "response dropped by fault plan");
            return Err(Status::unavailable("response lost (injected)"));
        }
        answer
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is replaced whole or read; a panic elsewhere cannot leave it half-written.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Sleeps on tokio time, but not at all for a zero delay: a zero `sleep` still waits for the
/// timer wheel's next millisecond tick, which would add up to two milliseconds to every call
/// with latency injection off.
async fn pause(delay: Duration) {
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
}

fn seeded(mut plan: FaultPlan) -> (FaultPlan, StdRng) {
    if plan.seed == 0 {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(1, |since| since.as_nanos());
        // Truncating to the low 64 bits keeps the fast-changing part; `| 1` keeps it non-zero.
        plan.seed = (nanos as u64) | 1;
    }
    let rng = StdRng::seed_from_u64(plan.seed);
    (plan, rng)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::MethodFaults;

    fn injector(faults: MethodFaults, seed: u64) -> FaultInjector {
        let mut plan = FaultPlan { seed, ..FaultPlan::default() };
        plan.methods.insert("LockStock".to_owned(), faults);
        FaultInjector::new(plan)
    }

    #[test]
    fn same_seed_same_decisions() {
        let faults = MethodFaults { drop_response: 0.5, fail_before_apply: 0.3, ..MethodFaults::with_latency(60, 180) };
        let (a, b) = (injector(faults, 9), injector(faults, 9));
        for _ in 0..100 {
            assert_eq!(a.decide("LockStock"), b.decide("LockStock"));
        }
    }

    #[test]
    fn zero_seed_is_replaced_and_reported() {
        let injector = injector(MethodFaults::default(), 0);
        assert_ne!(injector.plan().seed, 0);
    }

    #[test]
    fn probabilities_hit_roughly_their_rate_and_other_methods_are_untouched() {
        let injector = injector(MethodFaults { drop_response: 0.25, ..MethodFaults::default() }, 5);
        let drops = (0..10_000).filter(|_| injector.decide("LockStock").drop_response).count();
        assert!((2_300..2_700).contains(&drops), "{drops}");
        let other = injector.decide("QueryLock");
        assert_eq!((other.drop_response, other.refusal, other.delay_before), (false, None, Duration::ZERO));
    }

    #[tokio::test]
    async fn drop_response_applies_then_fails() {
        let injector = injector(MethodFaults { drop_response: 1.0, ..MethodFaults::default() }, 5);
        let (tx, rx) = tokio::sync::oneshot::channel();
        let status = injector
            .perform("LockStock", async move {
                tx.send(()).map_err(|_| Status::internal("receiver gone"))?;
                Ok(())
            })
            .await
            .expect_err("the response must be lost");
        assert_eq!(status.code(), tonic::Code::Unavailable);
        rx.await.expect("the effect ran");
    }

    #[tokio::test]
    async fn unavailable_refuses_without_applying() {
        let injector = injector(MethodFaults { unavailable: true, ..MethodFaults::default() }, 5);
        let status = injector
            .perform("LockStock", async { Err::<(), _>(Status::internal("the effect must not run")) })
            .await
            .expect_err("refused");
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert!(status.message().contains("unavailable"), "{status:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn latency_is_slept_on_tokio_time() {
        let injector = injector(MethodFaults::with_latency(100, 100), 5);
        let started = tokio::time::Instant::now();
        injector.perform("LockStock", async { Ok(()) }).await.expect("no failure configured");
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(99) && waited <= Duration::from_millis(101), "{waited:?}");
    }
}
