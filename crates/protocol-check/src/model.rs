//! The checked model: its actions (every step any component may take next) and the
//! `stateright::Model` implementation that ties the components together.
//!
//! A plain `Model` with explicit actions, rather than stateright's actor framework, so that
//! each fault is one named, budgeted action and a counterexample reads as a list of events
//! ("FAULT Pause(C0, m0)", "Claim(Recovery, m0)", "Step(C0, m0)") a person can follow.
//! Actions are split into *progress* (what the system does by itself, including time passing)
//! and *faults* (what the environment does to it, each bounded by [`crate::Bounds`]). The
//! liveness property is stated over that split: see [`crate::properties`].

use midflight_model::{Address, Line, OrderEvent, Rules, Saga, Step, request_id, voucher};
use stateright::{Model, Property};

use crate::config::Config;
use crate::state::{Consumer, Driver, Ghost, Kafka, Packet, Spent, State};
use crate::{drive, kafka, properties, trace};

/// The database clock before the deadline passes.
pub const NOW_BEFORE_DEADLINE_MS: i64 = 1_000;
/// The sagas' deadline.
pub const DEADLINE_MS: i64 = 50_000;
/// The database clock once the deadline has passed.
pub const NOW_AFTER_DEADLINE_MS: i64 = 100_000;

/// One step of one component.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// The partition's owner fetches the message at its position and inserts its RECEIVED row
    /// (insert-if-absent), or takes over an existing row whose lease expired, or leaves a row
    /// that is terminal or leased.
    PollInsert(Driver),
    /// The consumer commits the offset past its fetched message (refused unless it still
    /// owns the partition: Kafka fences commits from an old generation).
    Commit(Driver),
    /// Bug (c): the owner fetches the message and commits its offset first...
    PollCommit(Driver),
    /// ...and only then makes its row durable.
    Insert(Driver),
    /// A driver runs the real planner on its row and does what it says: write the change
    /// with a CAS, and/or send the call.
    Step(Driver, u8),
    /// The synchronous, always-available logistics provider answers a driver's call.
    CallLogistics(Driver, u8),
    /// A driver's WMS call times out after its request or response was lost.
    Timeout(Driver, u8),
    /// The recovery worker takes over a non-terminal row whose lease expired.
    Claim(u8),
    /// The network delivers a packet (to the WMS, or the WMS's answer to the caller).
    Deliver(Packet),
    /// The network delivers a lock request that the WMS rejects (out of stock).
    DeliverRejecting(Packet),
    /// A lease nobody is driving runs out (its holder crashed or released it).
    LeaseRunsOut(u8),
    /// The clock passes the sagas' deadline.
    DeadlinePasses,
    /// Fault: a process crashes and restarts with empty memory.
    Crash(Driver),
    /// Fault: the coordinator evicts the partition's owner (a rebalance).
    Evict(Driver),
    /// Fault: the network loses a packet.
    Drop(Packet),
    /// Fault: a WMS call times out while its request or response is still in flight.
    EarlyTimeout(Driver, u8),
    /// Fault: a driver stalls past its lease; it resumes later as a possible zombie.
    Pause(Driver, u8),
}

impl Action {
    pub const fn is_fault(&self) -> bool {
        matches!(
            self,
            Action::Crash(_) | Action::Evict(_) | Action::Drop(_) | Action::EarlyTimeout(..) | Action::Pause(..)
        )
    }
}

/// The protocol model: configuration plus the fixed inputs (one order event per message).
#[derive(Debug, Clone)]
pub struct ProtocolModel {
    pub config: Config,
    pub rules: Rules,
    events: Vec<OrderEvent>,
    /// Per message and step, the request id and voucher every driver must use (computed once:
    /// they are checked on every call).
    ids: Vec<[(String, String); 2]>,
}

impl ProtocolModel {
    /// Panics if the configuration asks for more messages than the model supports.
    pub fn new(config: Config) -> ProtocolModel {
        assert!(
            (1..=Config::MESSAGES_MAX).contains(&config.messages),
            "the model supports 1..={} messages, not {}",
            Config::MESSAGES_MAX,
            config.messages
        );
        let events: Vec<OrderEvent> = (0..config.messages).map(order_event).collect();
        let ids = events
            .iter()
            .map(|event| {
                let biz_id = event.biz_id();
                [Step::Wms, Step::Logistics].map(|step| (request_id(&biz_id, step), voucher(&biz_id, step)))
            })
            .collect();
        // The careful downstreams docs/design.md asks for: queryable, idempotent on our key,
        // reversible, tombstoning.
        ProtocolModel { config, rules: Rules::default(), events, ids }
    }

    /// Whether `saga` records the deterministic request id and voucher of `step`.
    pub fn records_deterministic_ids(&self, saga: &Saga, msg: u8, step: Step) -> bool {
        let Some(ids) = self.ids.get(usize::from(msg)) else { return false };
        let (recorded, expected) = match step {
            Step::Wms => ((&saga.wms_request_id, &saga.wms_voucher), &ids[0]),
            Step::Logistics => ((&saga.logistics_request_id, &saga.logistics_voucher), &ids[1]),
        };
        recorded.0.as_ref() == Some(&expected.0) && recorded.1.as_ref() == Some(&expected.1)
    }

    pub fn event(&self, msg: u8) -> Option<&OrderEvent> {
        self.events.get(usize::from(msg))
    }

    pub const fn now_ms(state: &State) -> i64 {
        if state.after_deadline { NOW_AFTER_DEADLINE_MS } else { NOW_BEFORE_DEADLINE_MS }
    }

    /// What the system can do by itself from `state`.
    pub fn progress_actions(&self, state: &State, out: &mut Vec<Action>) {
        kafka::progress_actions(self, state, out);
        drive::progress_actions(self, state, out);
        if self.config.deadline_may_pass && !state.after_deadline {
            out.push(Action::DeadlinePasses);
        }
    }

    /// What the environment may still do to it, within the budgets.
    pub fn fault_actions(&self, state: &State, out: &mut Vec<Action>) {
        let bounds = &self.config.bounds;
        if state.spent.total() >= bounds.faults_max {
            return;
        }
        if state.spent.crashes < bounds.crashes_max {
            out.extend(Driver::ALL.into_iter().filter(|&d| has_memory(state, d)).map(Action::Crash));
        }
        if state.spent.evictions < bounds.evictions_max {
            out.push(Action::Evict(state.kafka.owner));
        }
        drive::fault_actions(self, state, out);
    }

    /// No progress action is enabled: the system has stopped by itself.
    pub fn is_quiescent(&self, state: &State) -> bool {
        let mut actions = Vec::new();
        self.progress_actions(state, &mut actions);
        actions.is_empty()
    }
}

/// Whether crashing `driver` would lose anything (a crash of an idle process changes nothing).
fn has_memory(state: &State, driver: Driver) -> bool {
    let fetched = state.consumer(driver).is_some_and(|c| c.fetched.is_some());
    fetched || (0..state.messages()).any(|msg| state.task(driver, msg).is_some())
}

/// The order event of message `msg`: a distinct, valid order per message.
fn order_event(msg: u8) -> OrderEvent {
    OrderEvent {
        order_no: format!("O{}", u32::from(msg) + 1),
        event_type: "PAID".to_owned(),
        lines: vec![Line { sku: "SKU-1".to_owned(), quantity: 1 }],
        address: Address {
            region: "CN-SH".to_owned(),
            city: String::new(),
            line: String::new(),
            postal_code: String::new(),
        },
        amount_cents: 100,
    }
}

impl Model for ProtocolModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let messages = usize::from(self.config.messages);
        let idle = Consumer { position: 0, fetched: None };
        vec![State {
            after_deadline: false,
            kafka: Kafka { owner: Driver::C0, committed: 0 },
            consumers: [idle, idle],
            tasks: vec![None; Driver::ALL.len() * messages],
            rows: vec![None; messages],
            net: Vec::new(),
            wms: Vec::new(),
            shipments: vec![None; messages],
            spent: Spent::default(),
            fresh_keys: 0,
            last: None,
            ghost: Ghost::default(),
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        self.progress_actions(state, actions);
        self.fault_actions(state, actions);
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut next = last.clone();
        next.last = None;
        match action {
            Action::PollInsert(c) => {
                kafka::poll(&mut next, c);
                kafka::insert(self, &mut next, c);
            }
            Action::PollCommit(c) => {
                kafka::poll(&mut next, c);
                kafka::commit(&mut next, c);
            }
            Action::Insert(c) => kafka::insert(self, &mut next, c),
            Action::Commit(c) => kafka::commit(&mut next, c),
            Action::Evict(c) => {
                next.spent.evictions += 1;
                kafka::evict(&mut next, c);
            }
            Action::Crash(driver) => {
                next.spent.crashes += 1;
                kafka::crash(&mut next, driver);
                drive::crash(&mut next, driver);
            }
            Action::Step(driver, msg) => drive::step(self, &mut next, driver, msg),
            Action::CallLogistics(driver, msg) => drive::call_logistics(&mut next, driver, msg),
            Action::Timeout(driver, msg) => drive::timeout(self, &mut next, driver, msg),
            Action::EarlyTimeout(driver, msg) => {
                next.spent.early_timeouts += 1;
                next.abandon_exchange(driver, msg);
                drive::timeout(self, &mut next, driver, msg);
            }
            Action::Claim(msg) => drive::takeover(&mut next, Driver::Recovery, msg),
            Action::Deliver(packet) => drive::deliver(self, &mut next, packet, false),
            Action::DeliverRejecting(packet) => drive::deliver(self, &mut next, packet, true),
            Action::Drop(packet) => {
                next.spent.drops += 1;
                next.take(&packet);
            }
            Action::LeaseRunsOut(msg) => drive::expire(&mut next, msg),
            Action::Pause(_, msg) => {
                next.spent.pauses += 1;
                drive::expire(&mut next, msg);
            }
            Action::DeadlinePasses => next.after_deadline = true,
        }
        Some(next)
    }

    fn format_step(&self, _last: &State, action: Action) -> Option<String> {
        Some(trace::action_label(&action))
    }

    fn properties(&self) -> Vec<Property<Self>> {
        properties::all()
    }
}
