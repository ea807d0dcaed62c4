//! The planner tested as tables, and the model's properties tested on random walks.
//!
//! The tables are snapshots (expect-test): every (status, observation) pair is rendered as one
//! line, so a change to any rule shows up as a reviewable diff of the decision table.
//! `UPDATE_EXPECT=1 cargo test -p midflight-model` rewrites them after a deliberate change.

use std::fmt::Write as _;

use expect_test::{Expect, expect, expect_file};
use proptest::prelude::*;

use crate::*;

const NOW: i64 = 1_000_000;
const DEADLINE: i64 = NOW + 600_000;

fn event() -> OrderEvent {
    OrderEvent {
        order_no: "O-1".into(),
        event_type: "PAID".into(),
        lines: vec![Line { sku: "SKU-0001".into(), quantity: 2 }],
        address: Address {
            region: "CN-SH".into(),
            city: "Shanghai".into(),
            line: String::new(),
            postal_code: String::new(),
        },
        amount_cents: 1999,
    }
}

fn source() -> Source {
    Source { topic: "orders".into(), partition: 3, offset: 42 }
}

/// A saga in `status`, as it would be stored after a normal run reached that status.
fn saga_in(status: Status) -> Saga {
    let mut saga = Saga::received(&event(), source(), NOW - 10_000, DEADLINE);
    saga.status = status;
    saga.version = 3;
    saga.lease = Lease { owner_id: Some("c1".into()), epoch: 1, until_ms: NOW + 30_000 };
    let past = |s: Status| Status::ALL.iter().position(|x| *x == s) <= Status::ALL.iter().position(|x| *x == status);
    if past(Status::WmsRequested) {
        saga.wms_request_id = Some(request_id(&saga.biz_id, Step::Wms));
        saga.wms_voucher = Some(voucher(&saga.biz_id, Step::Wms));
    }
    if past(Status::WmsConfirmed) {
        saga.wms_locked_at_ms = Some(NOW - 5_000);
    }
    if past(Status::LogisticsRequested) {
        saga.logistics_request_id = Some(request_id(&saga.biz_id, Step::Logistics));
        saga.logistics_voucher = Some(voucher(&saga.biz_id, Step::Logistics));
    }
    saga.intent_at_ms = Some(NOW - 1_000);
    saga
}

fn describe(plan: &Plan) -> String {
    match plan {
        Plan::Finished => "finished".to_owned(),
        Plan::Call(call) => format!("call {}", call.name()),
        Plan::Write { change, then } => {
            let mut out = String::from("write");
            if !change.path.is_empty() {
                let path: Vec<&str> = change.path.iter().map(|s| s.as_str()).collect();
                write!(out, " -> {}", path.join(" -> ")).ok();
            }
            for (on, label) in [
                (change.record_wms_intent, "+wms-intent"),
                (change.record_logistics_intent, "+logistics-intent"),
                (change.wms_locked, "+wms-locked"),
                (change.tracking_no.is_some(), "+tracking"),
                (change.restart_intent_clock, "+restart-in-flight-clock"),
                (change.notify, "+outbox"),
                (change.release_lease, "+release"),
            ] {
                if on {
                    write!(out, " {label}").ok();
                }
            }
            if let Some(business) = change.business {
                write!(out, " +business:{business:?}").ok();
            }
            if let Some(failure) = &change.failure {
                write!(out, " +retry-in:{}ms", failure.retry_at_ms - NOW).ok();
            }
            if let Some(ticket) = &change.ticket {
                write!(out, " +ticket:{}", ticket.step.as_str()).ok();
            }
            if let Some(call) = then {
                write!(out, " then {}", call.name()).ok();
            }
            out
        }
    }
}

/// Renders the planner's decision for every (status, observation) pair.
fn table(now: i64, rules: &Rules, adjust: impl Fn(&mut Saga)) -> String {
    let mut out = String::new();
    for status in Status::ALL {
        let mut saga = saga_in(status);
        adjust(&mut saga);
        for observation in Observation::examples() {
            let plan = plan(&saga, &observation, now, rules);
            writeln!(out, "{:<20} {:<30} {}", status.as_str(), observation.label(), describe(&plan)).ok();
        }
    }
    out
}

#[test]
fn decision_table_careful_downstreams() {
    expect_file!["../tables/careful.txt"].assert_eq(&table(NOW, &Rules::default(), |_| {}));
}

#[test]
fn decision_table_past_deadline() {
    expect_file!["../tables/past_deadline.txt"].assert_eq(&table(DEADLINE + 1, &Rules::default(), |_| {}));
}

#[test]
fn decision_table_wms_lock_no_longer_reversible() {
    let rules = Rules { wms: Contract { reversible_for_ms: Some(1_000), ..Contract::CAREFUL }, ..Rules::default() };
    expect_file!["../tables/wms_irreversible.txt"].assert_eq(&table(DEADLINE + 1, &rules, |_| {}));
}

#[test]
fn decision_table_legacy_wms() {
    let rules = Rules { wms: Contract::LEGACY, ..Rules::default() };
    expect_file!["../tables/legacy_wms.txt"].assert_eq(&table(NOW, &rules, |_| {}));
}

/// The four cases for an unknown outcome (docs/design.md, "What a downstream must offer"), and what
/// "not found" leads to in each.
#[test]
fn unknown_outcome_follows_the_contract_table() {
    let mut out = String::new();
    for queryable in [true, false] {
        for idempotent in [true, false] {
            let wms = Contract {
                queryable,
                idempotent_for_ms: idempotent.then_some(i64::MAX),
                in_flight_window_ms: 60_000,
                ..Contract::CAREFUL
            };
            let rules = Rules { wms, ..Rules::default() };
            let saga = saga_in(Status::WmsRequested);
            let cases = [
                ("unknown", Observation::Nothing, NOW),
                ("not found, in flight", Observation::Wms(WmsAnswer::NotFound), NOW),
                ("not found, window over", Observation::Wms(WmsAnswer::NotFound), NOW + 60_000),
                ("unknown, past deadline", Observation::Nothing, DEADLINE),
                ("not found, past deadline", Observation::Wms(WmsAnswer::NotFound), DEADLINE),
            ];
            for (label, observation, now) in cases {
                let plan = plan(&saga, &observation, now, &rules);
                let plan = describe(&plan)
                    .replace(&format!("+retry-in:{}ms", NOW - 1_000 + 60_000 - NOW), "+retry-at-window-end");
                writeln!(out, "queryable={queryable:<5} dedup={idempotent:<5} {label:<26} {plan}").ok();
            }
        }
    }
    expect![[r#"
        queryable=true  dedup=true  unknown                    call QueryLock
        queryable=true  dedup=true  not found, in flight       call LockStock
        queryable=true  dedup=true  not found, window over     call LockStock
        queryable=true  dedup=true  unknown, past deadline     call QueryLock
        queryable=true  dedup=true  not found, past deadline   write -> WMS_REVERSING then ReverseLock
        queryable=true  dedup=false unknown                    call QueryLock
        queryable=true  dedup=false not found, in flight       write +release +retry-at-window-end
        queryable=true  dedup=false not found, window over     write +restart-in-flight-clock then LockStock
        queryable=true  dedup=false unknown, past deadline     call QueryLock
        queryable=true  dedup=false not found, past deadline   write -> WMS_REVERSING then ReverseLock
        queryable=false dedup=true  unknown                    call LockStock
        queryable=false dedup=true  not found, in flight       call LockStock
        queryable=false dedup=true  not found, window over     call LockStock
        queryable=false dedup=true  unknown, past deadline     write -> WMS_REVERSING then ReverseLock
        queryable=false dedup=true  not found, past deadline   write -> WMS_REVERSING then ReverseLock
        queryable=false dedup=false unknown                    write -> MANUAL_REVIEW +ticket:WMS
        queryable=false dedup=false not found, in flight       write +release +retry-at-window-end
        queryable=false dedup=false not found, window over     write +restart-in-flight-clock then LockStock
        queryable=false dedup=false unknown, past deadline     write -> MANUAL_REVIEW +ticket:WMS
        queryable=false dedup=false not found, past deadline   write -> WMS_REVERSING then ReverseLock
    "#]]
    .assert_eq(&out);
}

fn check_plan(saga: &Saga, observation: Observation, now: i64, rules: &Rules, expected: Expect) {
    expected.assert_eq(&describe(&plan(saga, &observation, now, rules)));
}

#[test]
fn a_finite_deduplication_window_resends_only_while_both_requests_fall_in_it() {
    // Deduplicates for 100 s; a request may land 60 s after it is sent. The saga's intent clock
    // reads NOW - 1 s (saga_in).
    let wms = Contract { idempotent_for_ms: Some(100_000), ..Contract::CAREFUL };
    let rules = Rules { wms, ..Rules::default() };
    let saga = saga_in(Status::WmsRequested);
    let not_found = || Observation::Wms(WmsAnswer::NotFound);
    // Sent now, the resend lands by NOW + 59 s, within the window the first opened.
    check_plan(&saga, not_found(), NOW, &rules, expect!["call LockStock"]);
    // Sent 40 s in, it may land when the first (landed at once) is forgotten: wait the first out.
    check_plan(&saga, not_found(), NOW + 40_000, &rules, expect!["write +release +retry-in:59000ms"]);
    let non_queryable = Rules { wms: Contract { queryable: false, ..wms }, ..Rules::default() };
    check_plan(
        &saga,
        Observation::Nothing,
        NOW + 40_000,
        &non_queryable,
        expect!["write -> MANUAL_REVIEW +ticket:WMS"],
    );
}

#[test]
fn waiting_out_the_window_counts_toward_a_ticket() {
    // A downstream that answers not found to the query and to every send alike.
    let wms = Contract { idempotent_for_ms: None, ..Contract::CAREFUL };
    let rules = Rules { wms, ..Rules::default() };
    let mut saga = saga_in(Status::WmsRequested);
    saga.attempts = rules.retry.attempts_max - 2;
    check_plan(&saga, Observation::Wms(WmsAnswer::NotFound), NOW, &rules, expect!["write +release +retry-in:59000ms"]);
    saga.attempts = rules.retry.attempts_max - 1;
    check_plan(
        &saga,
        Observation::Wms(WmsAnswer::NotFound),
        NOW,
        &rules,
        expect!["write -> MANUAL_REVIEW +ticket:WMS"],
    );
}

#[test]
fn no_tombstone_means_no_rollback_of_an_unknown_outcome() {
    // Without a tombstone a late request could land after the rollback: keep going forward.
    let rules = Rules { wms: Contract { tombstones: false, ..Contract::CAREFUL }, ..Rules::default() };
    let saga = saga_in(Status::WmsRequested);
    check_plan(&saga, Observation::Wms(WmsAnswer::NotFound), DEADLINE, &rules, expect!["call LockStock"]);
}

#[test]
fn failures_back_off_then_open_a_ticket() {
    let rules = Rules::default();
    let mut saga = saga_in(Status::WmsRequested);
    let unreachable = Observation::Unreachable { step: Step::Wms, error: "deadline exceeded".into() };
    let Plan::Write { change, then: None } = plan(&saga, &unreachable, NOW, &rules) else { panic!("expected a write") };
    let failure = change.failure.clone().expect("a failure is recorded");
    assert!(change.release_lease && change.path.is_empty());
    assert!((375..=500).contains(&(failure.retry_at_ms - NOW)), "first backoff ~0.5 s: {failure:?}");
    assert_eq!(failure.error, "wms unreachable: deadline exceeded");
    let next = change.apply(&saga, NOW).expect("legal");
    assert_eq!((next.attempts, next.version, next.status), (1, 4, Status::WmsRequested));

    saga.attempts = rules.retry.attempts_max - 1;
    check_plan(&saga, unreachable, NOW, &rules, expect!["write -> MANUAL_REVIEW +ticket:WMS"]);
}

#[test]
fn backoff_is_capped_and_jittered_deterministically() {
    let policy = RetryPolicy::default();
    let delays: Vec<i64> = (0..12).map(|n| policy.backoff_ms(n, "O-1:PAID")).collect();
    assert_eq!(delays, (0..12).map(|n| policy.backoff_ms(n, "O-1:PAID")).collect::<Vec<_>>());
    for (n, delay) in delays.iter().enumerate() {
        let raw = (500_i64 << n).min(30_000);
        assert!((raw - raw / 4..=raw).contains(delay), "attempt {n}: {delay} not within 75%..100% of {raw}");
    }
    assert_ne!(policy.backoff_ms(3, "O-1:PAID"), policy.backoff_ms(3, "O-2:PAID"), "jitter spreads sagas");
}

#[test]
fn illegal_transitions_are_typed_errors_naming_the_saga() {
    let saga = saga_in(Status::Received);
    let error = Change::to(&[Status::Done], "skip everything").apply(&saga, NOW).expect_err("illegal");
    assert_eq!(error.to_string(), "saga O-1:PAID: illegal transition RECEIVED -> DONE");
    let done = saga_in(Status::Done);
    assert!(Change::to(&[Status::WmsRequested], "reopen").apply(&done, NOW).is_err());
    assert!(Change::to(&[Status::WmsRequested], "operator retry").apply(&done, NOW).is_err());
    let review = saga_in(Status::ManualReview);
    assert!(Change::to(&[Status::WmsRequested], "operator retry").apply_by_operator(&review, NOW).is_ok());
    assert!(Change::to(&[Status::WmsRequested], "automation").apply(&review, NOW).is_err());
}

#[test]
fn status_names_round_trip() {
    for status in Status::ALL {
        assert_eq!(Status::parse(status.as_str()), Some(status));
    }
    assert_eq!(Status::parse("PROCESSING"), None);
    assert_eq!(Status::TERMINAL.to_vec(), Status::ALL.into_iter().filter(|s| s.is_terminal()).collect::<Vec<_>>());
}

/// Every legal automated edge is used by some plan, so the transition table has no dead rules.
#[test]
fn every_legal_edge_is_planned_somewhere() {
    let mut used = std::collections::BTreeSet::new();
    let variants = [
        (NOW, Rules::default()),
        (DEADLINE + 1, Rules::default()),
        (
            DEADLINE + 1,
            Rules { wms: Contract { reversible_for_ms: Some(1_000), ..Contract::CAREFUL }, ..Rules::default() },
        ),
        (NOW, Rules { wms: Contract::LEGACY, logistics: Contract::LEGACY, ..Rules::default() }),
    ];
    for (now, rules) in &variants {
        for status in Status::ALL {
            for observation in Observation::examples() {
                let mut saga = saga_in(status);
                for attempts in [0, rules.retry.attempts_max] {
                    saga.attempts = attempts;
                    if let Plan::Write { change, .. } = plan(&saga, &observation, *now, rules) {
                        used.extend(change.edges(&saga).into_iter().map(|(from, to, _)| (from, to)));
                    }
                }
            }
        }
        let mut poison = saga_in(Status::Received);
        poison.payload = "{}".into();
        if let Plan::Write { change, .. } = plan(&poison, &Observation::Nothing, *now, rules) {
            used.extend(change.edges(&poison).into_iter().map(|(from, to, _)| (from, to)));
        }
    }
    let legal: std::collections::BTreeSet<_> = Status::ALL
        .into_iter()
        .flat_map(|from| Status::ALL.into_iter().filter(move |&to| from.can_transition(to)).map(move |to| (from, to)))
        .collect();
    let unused: Vec<_> = legal.difference(&used).collect();
    assert!(unused.is_empty(), "legal edges never planned: {unused:?}");
}

fn any_status() -> impl Strategy<Value = Status> {
    prop::sample::select(Status::ALL.to_vec())
}

fn any_observation() -> impl Strategy<Value = Observation> {
    prop::sample::select(Observation::examples())
}

fn any_contract() -> impl Strategy<Value = Contract> {
    (any::<bool>(), any::<bool>(), any::<bool>(), prop::option::of(1..100_000_i64), 1..100_000_i64).prop_map(
        |(queryable, idempotent, tombstones, reversible_for_ms, in_flight_window_ms)| Contract {
            queryable,
            idempotent_for_ms: idempotent.then_some(i64::MAX),
            in_flight_window_ms,
            reversible_for_ms,
            tombstones,
        },
    )
}

fn any_rules() -> impl Strategy<Value = Rules> {
    (any_contract(), any_contract(), 1..10_u32).prop_map(|(wms, logistics, attempts_max)| Rules {
        wms,
        logistics,
        retry: RetryPolicy { attempts_max, ..RetryPolicy::default() },
    })
}

/// A saga in any status with any plausible field values.
fn any_saga() -> impl Strategy<Value = Saga> {
    (any_status(), 0..20_u32, prop::option::of(NOW - 200_000..NOW), any::<bool>()).prop_map(
        |(status, attempts, locked_at, poison)| {
            let mut saga = saga_in(status);
            saga.attempts = attempts;
            saga.wms_locked_at_ms = locked_at;
            if poison {
                saga.payload = "not json".into();
            }
            saga
        },
    )
}

proptest! {
    /// Terminal states absorb: automation never moves a saga out of one.
    #[test]
    fn terminal_states_absorb(status in any_status(), observation in any_observation(), rules in any_rules(), now in 0..i64::MAX / 2) {
        prop_assume!(status.is_terminal());
        prop_assert_eq!(plan(&saga_in(status), &observation, now, &rules), Plan::Finished);
    }

    /// Every non-terminal state has a defined, legal plan for every observation, and every
    /// write strictly increases the version.
    #[test]
    fn every_state_has_a_legal_plan(saga in any_saga(), observation in any_observation(), rules in any_rules(), now in NOW..DEADLINE * 2) {
        let planned = plan(&saga, &observation, now, &rules);
        match &planned {
            Plan::Finished => prop_assert!(saga.status.is_terminal()),
            Plan::Call(call) => prop_assert_eq!(call.intent(), saga.status, "call {:?} outside its intent state", call),
            Plan::Write { change, then } => {
                let next = change.apply(&saga, now).map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert!(next.version > saga.version);
                if let Some(call) = then {
                    prop_assert_eq!(call.intent(), next.status, "call {:?} not preceded by its intent", call);
                }
                prop_assert!(!(change.release_lease && then.is_some()), "released the lease and still calls");
            }
        }
    }

    /// Random runs from RECEIVED: calls happen only in their intent state, confirmed states are
    /// entered only from their intent state, versions only grow, and the version in the log is
    /// contiguous.
    #[test]
    fn random_runs_respect_intent_before_call(
        steps in prop::collection::vec((any_observation(), 0..120_000_i64), 1..60),
        rules in any_rules(),
    ) {
        let mut saga = saga_in(Status::Received);
        saga.version = 0;
        let mut now = NOW;
        let mut pending: Option<Call> = None;
        for (observation, advance) in steps {
            now += advance;
            // An answer only means something for the call that was made; otherwise nothing is learned.
            let observation = match pending.take() {
                Some(call) if observation_fits(call, &observation) => observation,
                _ => Observation::Nothing,
            };
            match plan(&saga, &observation, now, &rules) {
                Plan::Finished => break,
                Plan::Call(call) => {
                    prop_assert_eq!(call.intent(), saga.status);
                    pending = Some(call);
                }
                Plan::Write { change, then } => {
                    let edges = change.edges(&saga);
                    for (index, (from, to, version)) in edges.iter().enumerate() {
                        prop_assert_eq!(*version, saga.version + 1 + index as u64);
                        if *to == Status::WmsConfirmed { prop_assert_eq!(*from, Status::WmsRequested); }
                        if *to == Status::LogisticsConfirmed {
                            prop_assert!(matches!(from, Status::LogisticsRequested | Status::LogisticsCancelling));
                        }
                    }
                    let next = change.apply(&saga, now).map_err(|e| TestCaseError::fail(e.to_string()))?;
                    prop_assert!(next.version > saga.version);
                    if next.status == Status::LogisticsRequested { prop_assert!(next.wms_locked_at_ms.is_some()); }
                    if next.status == Status::Done { prop_assert!(next.tracking_no.is_some() && change.notify); }
                    saga = next;
                    if let Some(call) = then {
                        prop_assert_eq!(call.intent(), saga.status);
                        prop_assert!(saga.wms_request_id.is_some() || call.step() != Step::Wms);
                        prop_assert!(saga.logistics_request_id.is_some() || call.step() != Step::Logistics);
                        pending = Some(call);
                    }
                }
            }
        }
    }
}

/// Whether `observation` is a possible answer to `call`.
fn observation_fits(call: Call, observation: &Observation) -> bool {
    use LogisticsAnswer as L;
    use WmsAnswer as W;
    match (call, observation) {
        (_, Observation::Unreachable { step, .. }) => *step == call.step(),
        (Call::LockStock, Observation::Wms(a)) => matches!(a, W::Locked | W::Rejected { .. } | W::Tombstoned),
        (Call::QueryLock, Observation::Wms(a)) => {
            matches!(a, W::NotFound | W::Locked | W::Rejected { .. } | W::Reversed | W::Tombstoned)
        }
        (Call::ReverseLock, Observation::Wms(a)) => {
            matches!(a, W::Reversed | W::Tombstoned | W::NothingToReverse | W::Irreversible { .. } | W::VoucherMismatch)
        }
        (Call::CreateShipment, Observation::Logistics(a)) => {
            matches!(a, L::Created { .. } | L::Rejected { .. } | L::Tombstoned)
        }
        (Call::QueryShipment, Observation::Logistics(a)) => {
            matches!(a, L::NotFound | L::Created { .. } | L::Rejected { .. } | L::Cancelled | L::Tombstoned)
        }
        (Call::CancelShipment, Observation::Logistics(a)) => {
            matches!(a, L::Cancelled | L::Tombstoned | L::NothingToCancel | L::Irreversible { .. } | L::VoucherMismatch)
        }
        _ => false,
    }
}
