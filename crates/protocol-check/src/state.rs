//! The state of the whole modelled system at one instant: Kafka, the consumers, the drivers'
//! local memory, the saga table, the network and the downstream ledgers, plus ghost fields that
//! only the properties read.
//!
//! Everything is a small value type with a canonical form (sorted vectors for multisets), so two
//! states that mean the same thing hash the same and the checker explores each once. The saga
//! rows are the real [`midflight_model::Saga`]; it has no `Hash`, so [`Snapshot`] hashes every
//! field (destructured exhaustively, so a new field in the model crate breaks this build rather
//! than silently merging distinct states).

use std::hash::{DefaultHasher, Hash, Hasher};
use std::ops::Deref;
use std::sync::Arc;

use midflight_model::{Call, LogisticsAnswer, Observation, Saga, Step, WmsAnswer};

/// Who drives sagas: the two consumer instances and the recovery worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Driver {
    C0,
    C1,
    Recovery,
}

impl Driver {
    pub const ALL: [Driver; 3] = [Driver::C0, Driver::C1, Driver::Recovery];
    pub const CONSUMERS: [Driver; 2] = [Driver::C0, Driver::C1];

    pub const fn index(self) -> usize {
        match self {
            Driver::C0 => 0,
            Driver::C1 => 1,
            Driver::Recovery => 2,
        }
    }

    /// The `owner_id` it writes into the lease columns.
    pub const fn owner_id(self) -> &'static str {
        match self {
            Driver::C0 => "consumer-0",
            Driver::C1 => "consumer-1",
            Driver::Recovery => "recovery",
        }
    }

    /// The other consumer (the one a rebalance hands the partition to).
    pub const fn other(self) -> Driver {
        match self {
            Driver::C0 => Driver::C1,
            _ => Driver::C0,
        }
    }
}

/// A WMS RPC, in an orderable form (the model crate's [`Call`] is not `Ord`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WmsCall {
    Lock,
    Query,
    Reverse,
}

impl WmsCall {
    pub const fn of(call: Call) -> Option<WmsCall> {
        match call {
            Call::LockStock => Some(WmsCall::Lock),
            Call::QueryLock => Some(WmsCall::Query),
            Call::ReverseLock => Some(WmsCall::Reverse),
            Call::CreateShipment | Call::QueryShipment | Call::CancelShipment => None,
        }
    }
}

/// What the WMS answers about one request id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WmsReply {
    NotFound,
    Locked,
    Rejected,
    Reversed,
    Tombstoned,
    NothingToReverse,
}

impl WmsReply {
    pub fn answer(self) -> WmsAnswer {
        match self {
            WmsReply::NotFound => WmsAnswer::NotFound,
            WmsReply::Locked => WmsAnswer::Locked,
            WmsReply::Rejected => WmsAnswer::Rejected { reason: "out of stock".to_owned() },
            WmsReply::Reversed => WmsAnswer::Reversed,
            WmsReply::Tombstoned => WmsAnswer::Tombstoned,
            WmsReply::NothingToReverse => WmsAnswer::NothingToReverse,
        }
    }
}

/// What the logistics provider answers about one request id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LogisticsReply {
    NotFound,
    Created,
    Cancelled,
    Tombstoned,
}

/// The tracking number the ideal logistics provider allocates (one per order).
pub const TRACKING_NO: &str = "TRK-1";

impl LogisticsReply {
    pub fn answer(self) -> LogisticsAnswer {
        match self {
            LogisticsReply::NotFound => LogisticsAnswer::NotFound,
            LogisticsReply::Created => LogisticsAnswer::Created { tracking_no: TRACKING_NO.to_owned() },
            LogisticsReply::Cancelled => LogisticsAnswer::Cancelled,
            LogisticsReply::Tombstoned => LogisticsAnswer::Tombstoned,
        }
    }
}

/// What a driver learned since it last loaded or wrote its row (the planner's observation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Seen {
    Nothing,
    Wms(WmsReply),
    Logistics(LogisticsReply),
    /// A WMS call timed out: its outcome is unknown.
    WmsUnreachable,
}

impl Seen {
    pub fn observation(self) -> Observation {
        match self {
            Seen::Nothing => Observation::Nothing,
            Seen::Wms(reply) => Observation::Wms(reply.answer()),
            Seen::Logistics(reply) => Observation::Logistics(reply.answer()),
            Seen::WmsUnreachable => Observation::Unreachable { step: Step::Wms, error: "timeout".to_owned() },
        }
    }
}

/// A real saga row, hashable, shared between states. Cloning a state must be cheap (the
/// checker clones one per transition) and so must hashing it (it hashes every state it
/// generates), so the row is behind an `Arc` and its digest is computed once, when the row is
/// made, over every field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    saga: Arc<Saga>,
    digest: u64,
}

impl Snapshot {
    pub fn new(saga: Saga) -> Snapshot {
        let digest = digest(&saga);
        Snapshot { saga: Arc::new(saga), digest }
    }
}

impl Deref for Snapshot {
    type Target = Saga;

    fn deref(&self) -> &Saga {
        &self.saga
    }
}

impl Hash for Snapshot {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.digest.hash(state);
    }
}

/// A deterministic digest of every field of a row. Exhaustive on purpose: the checker tells
/// states apart by hash alone, so a field left out would merge distinct states; destructuring
/// makes a new field in the model crate a compile error here.
fn digest(saga: &Saga) -> u64 {
    let Saga {
        biz_id,
        order_no,
        event_type,
        source,
        payload,
        status,
        version,
        wms_request_id,
        wms_voucher,
        wms_locked_at_ms,
        logistics_request_id,
        logistics_voucher,
        tracking_no,
        intent_at_ms,
        attempts,
        next_attempt_at_ms,
        last_error,
        deadline_ms,
        lease,
        trace_context,
        created_at_ms,
        updated_at_ms,
    } = saga;
    // SipHash with fixed zero keys: the same row digests the same in every run and thread.
    let mut hasher = DefaultHasher::new();
    (biz_id, order_no, event_type, payload, status, version).hash(&mut hasher);
    (&source.topic, source.partition, source.offset).hash(&mut hasher);
    (wms_request_id, wms_voucher, wms_locked_at_ms).hash(&mut hasher);
    (logistics_request_id, logistics_voucher, tracking_no).hash(&mut hasher);
    (intent_at_ms, attempts, next_attempt_at_ms, last_error, deadline_ms).hash(&mut hasher);
    (&lease.owner_id, lease.epoch, lease.until_ms).hash(&mut hasher);
    (trace_context, created_at_ms, updated_at_ms).hash(&mut hasher);
    hasher.finish()
}

/// A stored saga row. The lease's expiry is abstracted to a flag: time is not modelled in
/// milliseconds, a lease simply runs out at some point (see `Action::LeaseRunsOut`, `Action::Pause`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Row {
    pub saga: Snapshot,
    pub lease_live: bool,
}

impl Row {
    pub fn epoch(&self) -> u64 {
        self.saga.lease.epoch
    }
}

/// A driver's local memory of one saga it drives. Lost when the process crashes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Task {
    /// The row as this driver last wrote or claimed it (stale if someone took over).
    pub row: Snapshot,
    pub seen: Seen,
    /// The call it is waiting on, if any.
    pub waiting: Option<Call>,
    /// Which WMS key its requests carry: 0 is the deterministic request id; only the
    /// resend-under-a-new-key bug uses others.
    pub key: u8,
}

/// A message a consumer fetched and has not finished with (insert and commit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fetched {
    pub msg: u8,
    pub inserted: bool,
    pub committed: bool,
}

/// One consumer's Kafka-side memory. Lost when the process crashes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Consumer {
    /// Next offset it fetches (meaningful while it owns the partition).
    pub position: u8,
    pub fetched: Option<Fetched>,
}

/// The single partition and the group coordinator's view of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Kafka {
    /// The consumer the partition is assigned to.
    pub owner: Driver,
    /// The committed offset: a consumer that gets the partition resumes here.
    pub committed: u8,
}

/// A packet between a driver and the WMS. The network may drop or reorder any of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Packet {
    /// `reply_to` is `None` once the caller gave up on it (timeout or crash): it may still land.
    Request {
        msg: u8,
        key: u8,
        call: WmsCall,
        reply_to: Option<Driver>,
    },
    Response {
        to: Driver,
        msg: u8,
        reply: WmsReply,
    },
}

impl Packet {
    /// Whether this packet is the live exchange of `driver`'s task for `msg`.
    pub fn belongs_to(&self, driver: Driver, msg: u8) -> bool {
        match *self {
            Packet::Request { msg: m, reply_to, .. } => m == msg && reply_to == Some(driver),
            Packet::Response { to, msg: m, .. } => m == msg && to == driver,
        }
    }

    pub const fn msg(&self) -> u8 {
        match *self {
            Packet::Request { msg, .. } | Packet::Response { msg, .. } => msg,
        }
    }
}

/// The state of one WMS lock record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LockState {
    Locked,
    Rejected,
    Reversed,
    /// A reversal arrived first: a later lock under this id is refused.
    Tombstoned,
}

/// The WMS ledger, keyed by (order, request key). Its `Locked` entries are the ghost count of
/// effective stock deductions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockRecord {
    pub msg: u8,
    pub key: u8,
    pub state: LockState,
}

/// The logistics ledger entry of one order (always-succeeding, synchronous provider).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Shipment {
    Created,
    Cancelled,
    Tombstoned,
}

/// Faults spent so far in this behaviour.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Spent {
    pub crashes: u8,
    pub evictions: u8,
    pub drops: u8,
    pub early_timeouts: u8,
    pub pauses: u8,
}

impl Spent {
    pub const fn total(&self) -> u8 {
        self.crashes + self.evictions + self.drops + self.early_timeouts + self.pauses
    }
}

/// Something worth proving reachable, set by the transition that did it and cleared by the
/// next one (a sticky flag would multiply the state space).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Notable {
    /// A driver's write was refused because someone took the saga over (a bumped epoch).
    ZombieRefused,
    /// A lock landed on a tombstone left by a reversal that arrived first.
    TombstoneRefusedLock,
    /// A takeover while a WMS request or response of that saga was in flight.
    TakeoverDuringRpc,
}

/// Sticky evidence of a broken rule. Always false under the correct protocol, so it adds no
/// states there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Ghost {
    /// The database accepted a transition written under an epoch older than the row's.
    pub stale_write_accepted: bool,
    /// The database accepted a transition out of a terminal status.
    pub terminal_overwritten: bool,
    /// The planner proposed a change that `Change::apply` refused (a model-crate bug).
    pub illegal_change: bool,
    /// A call left while the sender's row was not in the call's intent state, or without the
    /// deterministic request id recorded.
    pub call_without_intent: bool,
}

/// The whole system.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    pub after_deadline: bool,
    pub kafka: Kafka,
    /// Indexed by `Driver::index()` (consumers only).
    pub consumers: [Consumer; 2],
    /// `tasks[driver.index() * messages + msg]`.
    pub tasks: Vec<Option<Task>>,
    /// The saga table: one row per message, once inserted.
    pub rows: Vec<Option<Row>>,
    /// In-flight packets, sorted (a multiset).
    pub net: Vec<Packet>,
    /// The WMS ledger, sorted.
    pub wms: Vec<LockRecord>,
    pub shipments: Vec<Option<Shipment>>,
    pub spent: Spent,
    /// Fresh WMS keys handed out so far (only the resend-under-a-new-key bug uses them).
    pub fresh_keys: u8,
    pub last: Option<Notable>,
    pub ghost: Ghost,
}

impl State {
    pub fn messages(&self) -> u8 {
        // Rows has one slot per message; the model never exceeds Config::MESSAGES_MAX.
        self.rows.len() as u8
    }

    fn slot(&self, driver: Driver, msg: u8) -> usize {
        driver.index() * self.rows.len() + usize::from(msg)
    }

    pub fn task(&self, driver: Driver, msg: u8) -> Option<&Task> {
        self.tasks.get(self.slot(driver, msg)).and_then(Option::as_ref)
    }

    pub fn task_mut(&mut self, driver: Driver, msg: u8) -> Option<&mut Task> {
        let slot = self.slot(driver, msg);
        self.tasks.get_mut(slot).and_then(Option::as_mut)
    }

    pub fn set_task(&mut self, driver: Driver, msg: u8, task: Option<Task>) {
        let slot = self.slot(driver, msg);
        if let Some(entry) = self.tasks.get_mut(slot) {
            *entry = task;
        }
    }

    pub fn row(&self, msg: u8) -> Option<&Row> {
        self.rows.get(usize::from(msg)).and_then(Option::as_ref)
    }

    pub fn row_mut(&mut self, msg: u8) -> Option<&mut Row> {
        self.rows.get_mut(usize::from(msg)).and_then(Option::as_mut)
    }

    pub fn consumer(&self, driver: Driver) -> Option<&Consumer> {
        self.consumers.get(driver.index())
    }

    pub fn consumer_mut(&mut self, driver: Driver) -> Option<&mut Consumer> {
        self.consumers.get_mut(driver.index())
    }

    pub fn send(&mut self, packet: Packet) {
        let at = self.net.partition_point(|p| *p <= packet);
        self.net.insert(at, packet);
    }

    /// Removes one copy of `packet`; false if none was in flight.
    pub fn take(&mut self, packet: &Packet) -> bool {
        match self.net.iter().position(|p| p == packet) {
            Some(at) => {
                self.net.remove(at);
                true
            }
            None => false,
        }
    }

    /// Whether the live exchange of `driver`'s task for `msg` still has a packet in flight.
    pub fn exchange_in_flight(&self, driver: Driver, msg: u8) -> bool {
        self.net.iter().any(|p| p.belongs_to(driver, msg))
    }

    /// The caller gave up on its exchange for `msg`: its request may still land but is answered
    /// to no one; its response, if any, is discarded (the RPC's stream is gone).
    pub fn abandon_exchange(&mut self, driver: Driver, msg: u8) {
        let mut kept = Vec::with_capacity(self.net.len());
        for packet in self.net.drain(..) {
            match packet {
                Packet::Request { msg: m, key, call, reply_to } if m == msg && reply_to == Some(driver) => {
                    kept.push(Packet::Request { msg: m, key, call, reply_to: None });
                }
                Packet::Response { to, msg: m, .. } if m == msg && to == driver => {}
                other => kept.push(other),
            }
        }
        kept.sort();
        self.net = kept;
    }

    pub fn lock(&self, msg: u8, key: u8) -> Option<LockState> {
        self.wms.iter().find(|r| r.msg == msg && r.key == key).map(|r| r.state)
    }

    pub fn set_lock(&mut self, msg: u8, key: u8, state: LockState) {
        self.wms.retain(|r| !(r.msg == msg && r.key == key));
        let record = LockRecord { msg, key, state };
        let at = self.wms.partition_point(|r| *r <= record);
        self.wms.insert(at, record);
    }

    /// Ghost counter: stock deductions in force for this order, whatever key they came under.
    pub fn effective_locks(&self, msg: u8) -> usize {
        self.wms.iter().filter(|r| r.msg == msg && r.state == LockState::Locked).count()
    }

    pub fn shipment(&self, msg: u8) -> Option<Shipment> {
        self.shipments.get(usize::from(msg)).copied().flatten()
    }

    pub fn set_shipment(&mut self, msg: u8, shipment: Shipment) {
        if let Some(slot) = self.shipments.get_mut(usize::from(msg)) {
            *slot = Some(shipment);
        }
    }
}
