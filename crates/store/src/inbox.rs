//! The durable inbox: a fetched batch becomes RECEIVED (or PARKED) rows in one transaction,
//! and only then may the consumer commit the batch's offsets. The table, not the offset, is
//! the record of work.
//!
//! [`Store::receive`] also writes, in that same transaction, the first step of each fresh row
//! that no earlier unfinished saga of its order holds back (the business row and the WMS
//! intent): a saga then takes three transactions instead of four, and its first call leaves
//! as soon as the batch is durable. On MySQL a batch none of whose rows is in the table yet
//! (the usual case) inserts each such row as its first step leaves it, with no compare-and-set
//! of the row just inserted.

use std::collections::{HashMap, HashSet};

use midflight_model::{Change, Lease, Saga, Status};
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseTransaction, DbBackend, EntityTrait, QueryFilter, Statement, Value,
};

use crate::entity::saga;
use crate::error::{Context, Error};
use crate::row::{self, fit, signed};
use crate::transition::Member;
use crate::{BATCH_ROWS_MAX, Store, dialect, read};

/// What became of one message of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Arrival {
    /// The row is new and leased to the caller (epoch 1): the caller drives it.
    Fresh(Saga),
    /// The row existed already (a redelivery): the caller looks at it and usually leaves it.
    Existing(Saga),
    /// The row existed already and cannot be read (a value no saga can have, left by an edit
    /// by hand or a bad restore): nobody can drive it until a person repairs it. The message
    /// is in the row; the caller leaves it, as the recovery scan does.
    Unreadable { biz_id: String, error: String },
}

impl Arrival {
    /// The row, unless it could not be read.
    pub fn saga(&self) -> Option<&Saga> {
        match self {
            Arrival::Fresh(saga) | Arrival::Existing(saga) => Some(saga),
            Arrival::Unreadable { .. } => None,
        }
    }

    pub fn biz_id(&self) -> &str {
        match self {
            Arrival::Fresh(saga) | Arrival::Existing(saga) => &saga.biz_id,
            Arrival::Unreadable { biz_id, .. } => biz_id,
        }
    }
}

/// What [`Store::receive`] made of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// Every row as it stands after the transaction, in input order. A fresh row that was
    /// opened (its first step written) is in the status that step left it in.
    pub arrivals: Vec<Arrival>,
    /// The fresh rows that may have to wait for an earlier unfinished saga of their order on
    /// their partition ([`Store::maybe_blocked`], asked inside the transaction). None of them
    /// was opened.
    pub maybe_blocked: HashSet<String>,
    /// The fresh rows whose first step was written.
    pub opened: HashSet<String>,
}

/// The arguments of one [`Store::receive`] call, as its tries and paths pass them on.
struct ReceiveArgs<'a, O> {
    sagas: &'a [Saga],
    owner: &'a str,
    lease_ms: i64,
    actor: &'a str,
    now_ms: i64,
    openings: &'a HashMap<String, O>,
}

// Only references and numbers: a copy for each try, whatever `O` is.
impl<O> Clone for ReceiveArgs<'_, O> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<O> Copy for ReceiveArgs<'_, O> {}

const COLUMNS: &str = "biz_id, order_no, event_type, src_topic, src_partition, src_offset, payload, status, version, \
     attempts, next_attempt_at_ms, last_error, deadline_ms, owner_id, lease_epoch, lease_until_ms, trace_context, \
     created_at_ms, updated_at_ms, wms_request_id, wms_voucher, wms_locked_at_ms, logistics_request_id, \
     logistics_voucher, tracking_no, intent_at_ms";
/// The columns before `lease_until_ms` (set from the database clock) and after it.
const COLUMNS_BEFORE_LEASE: usize = 15;
const COLUMNS_AFTER_LEASE: usize = 10;

impl Store {
    /// Inserts new rows (RECEIVED ones leased to `owner` for `lease_ms`, PARKED ones unleased)
    /// and their arrival log rows, ignoring rows whose biz_id exists; returns every row as it now
    /// stands, in input order, marked fresh (ours to drive) or existing.
    ///
    /// A row counts as fresh when it is owned by `owner` at version 0, so an `owner` id must be
    /// unique per process incarnation, and a process must not pass the same biz_id twice while
    /// it still drives the first (the consumer keeps an in-flight set for that).
    pub async fn insert_arrivals(
        &self,
        sagas: &[Saga],
        owner: &str,
        lease_ms: i64,
        actor: &str,
    ) -> Result<Vec<Arrival>, Error> {
        if sagas.is_empty() {
            return Ok(Vec::new());
        }
        Self::check_arrivals(sagas)?;
        let txn = self.begin_arrivals(sagas, owner, lease_ms, actor).await?;
        txn.commit().await.during("commit inbox insert", None)?;
        self.stats.write_committed();
        self.patiently("read inbox rows", || self.classify(&self.db, sagas, owner)).await
    }

    /// A transaction that has inserted `sagas`' rows and their arrival log rows; the caller
    /// commits it.
    async fn begin_arrivals(
        &self,
        sagas: &[Saga],
        owner: &str,
        lease_ms: i64,
        actor: &str,
    ) -> Result<DatabaseTransaction, Error> {
        // A power-of-two number of rows (the one with the shortest payload repeated: a repeat is
        // a conflict, which inserts nothing), so the two statements keep a few shapes that stay
        // prepared on every connection (`dialect::padded` says why). Splitting the batch into
        // power-of-two chunks instead cost a round trip per chunk, which on this box took
        // longer than the padding.
        let rows = dialect::padded_by_least(sagas.iter().map(|saga| (saga, None)).collect(), shortest);
        let (insert, log) = self.arrival_statements(&rows, owner, lease_ms, actor);
        let txn = self.begin("begin inbox insert", None).await?;
        txn.execute_raw(insert).await.during("insert inbox rows", None)?;
        txn.execute_raw(log).await.during("insert arrival log rows", None)?;
        Ok(txn)
    }

    /// A batch within [`BATCH_ROWS_MAX`] of RECEIVED and PARKED rows only.
    fn check_arrivals(sagas: &[Saga]) -> Result<(), Error> {
        if sagas.len() > BATCH_ROWS_MAX {
            return Err(Error::Invalid(format!("batch of {} rows is over the limit of {BATCH_ROWS_MAX}", sagas.len())));
        }
        if let Some(bad) = sagas.iter().find(|s| !matches!(s.status, Status::Received | Status::Parked)) {
            return Err(Error::Invalid(format!(
                "saga {}: only RECEIVED or PARKED rows arrive, not {}",
                bad.biz_id, bad.status
            )));
        }
        Ok(())
    }

    /// [`Store::insert_arrivals`] and more, in the same one transaction: it asks which fresh
    /// rows may wait for an earlier unfinished saga of their order, and writes, for each fresh
    /// row that none holds back and whose biz_id `openings` names, that first change (one
    /// compare-and-set on the row just inserted, or on MySQL usually the row inserted as that
    /// change leaves it; its log rows and its business row), exactly as [`Store::write`] would
    /// write it for the lease holder at `now_ms` (the caller's database-clock reading). The
    /// caller then holds the opened row, leased, and makes the call its change recorded the
    /// intent of.
    ///
    /// The order question is answered inside the transaction, so it sees this batch's own rows
    /// (after the inserts, or counted from the batch when asked before them) and every row
    /// committed before; a batch written beside this one by the same caller is not visible, so
    /// the caller leaves out of `openings` the orders it shares with such batches.
    ///
    /// Called again with the same arguments after a commit whose answer was lost, it finds the
    /// rows that commit opened and reports them opened again (and writes nothing more for them).
    pub async fn receive<O: AsRef<Change>>(
        &self,
        sagas: &[Saga],
        owner: &str,
        lease_ms: i64,
        actor: &str,
        now_ms: i64,
        openings: &HashMap<String, O>,
    ) -> Result<Received, Error> {
        if sagas.is_empty() {
            return Ok(Received { arrivals: Vec::new(), maybe_blocked: HashSet::new(), opened: HashSet::new() });
        }
        Self::check_arrivals(sagas)?;
        let args = ReceiveArgs { sagas, owner, lease_ms, actor, now_ms, openings };
        self.retry_rolled_back(|| self.try_receive(args)).await
    }

    async fn try_receive<O: AsRef<Change>>(&self, args: ReceiveArgs<'_, O>) -> Result<Received, Error> {
        if let Some(received) = self.receive_opened_on_insert(args).await? {
            return Ok(received);
        }
        let ReceiveArgs { sagas, owner, lease_ms, actor, now_ms, openings } = args;
        let txn = self.begin_arrivals(sagas, owner, lease_ms, actor).await?;
        let mut arrivals = self.classify(&txn, sagas, owner).await?;
        let reopened = Self::opened_before(&mut arrivals, owner, now_ms, openings);
        let fresh: Vec<&Saga> = arrivals
            .iter()
            .filter_map(|arrival| match arrival {
                Arrival::Fresh(saga) if !reopened.contains(&saga.biz_id) => Some(saga),
                _ => None,
            })
            .collect();
        let maybe_blocked = self.maybe_blocked_on(&txn, &fresh).await?;
        let mut members = Vec::new();
        for saga in fresh {
            let Some(change) = openings.get(&saga.biz_id).map(AsRef::as_ref) else { continue };
            if maybe_blocked.contains(&saga.biz_id) {
                continue;
            }
            members.push(Member::first_step(saga.clone(), change, now_ms, lease_ms, actor)?);
        }
        // Key order, as every group takes its rows (`group.rs`).
        members.sort_by(|a, b| a.before.biz_id.cmp(&b.before.biz_id));
        if !members.is_empty() {
            let applied = self.compare_and_set_chunks(&txn, &members).await?;
            if applied.as_ref().is_none_or(|applied| applied.iter().any(|ok| !ok)) {
                // Rows this transaction inserted are locked by it: nothing else can have moved them.
                let biz_id = members[0].before.biz_id.clone();
                return Err(Error::Corrupt {
                    biz_id,
                    message: "a row inserted by this inbox transaction changed before its first step".to_owned(),
                });
            }
            self.write_applied(&txn, &members, &vec![true; members.len()]).await?;
        }
        txn.commit().await.during("commit inbox insert", None)?;
        self.stats.write_committed();
        self.stats.transitions_written(members.len() as u64);
        let mut opened_rows: HashMap<String, Saga> =
            members.into_iter().map(|m| (m.before.biz_id.clone(), m.into_written())).collect();
        let mut opened: HashSet<String> = opened_rows.keys().cloned().collect();
        opened.extend(reopened);
        for arrival in &mut arrivals {
            if let Arrival::Fresh(saga) = arrival
                && let Some(next) = opened_rows.remove(&saga.biz_id)
            {
                *saga = next;
            }
        }
        Ok(Received { arrivals, maybe_blocked, opened })
    }

    /// [`Store::receive`] for a batch none of whose rows is in the table yet, the usual case:
    /// the order question is asked first, and each row to be opened is inserted as its first
    /// change leaves it, so no compare-and-set is needed. The result is the same as the general
    /// path's; `None` (its transaction rolled back, nothing written) when this path does not
    /// apply: not MySQL, nothing to open, a biz_id twice in the batch, a row already in the
    /// table, or a row that another transaction inserted meanwhile (missing or not as inserted
    /// on reading the rows back; with MariaDB's `innodb_snapshot_isolation` the insert fails
    /// instead, and the retry finds the row and takes the general path).
    ///
    /// Both questions are asked in the transaction, before the insert, so they see the same
    /// committed rows as each other; this batch's own earlier rows are counted from the batch.
    /// MySQL only: a SQLite transaction that reads before it writes fails at its first write
    /// if another writer committed after its first read (WAL's busy snapshot), where one that
    /// writes first waits its turn, so on SQLite the general path is taken.
    async fn receive_opened_on_insert<O: AsRef<Change>>(
        &self,
        args: ReceiveArgs<'_, O>,
    ) -> Result<Option<Received>, Error> {
        let ReceiveArgs { sagas, owner, lease_ms, actor, now_ms, openings } = args;
        let fresh: Vec<&Saga> = sagas.iter().filter(|saga| saga.status == Status::Received).collect();
        if self.backend != DbBackend::MySql || !fresh.iter().any(|saga| openings.contains_key(&saga.biz_id)) {
            return Ok(None);
        }
        let mut ids = HashSet::with_capacity(sagas.len());
        if !sagas.iter().all(|saga| ids.insert(saga.biz_id.as_str())) {
            return Ok(None);
        }
        let txn = self.begin("begin inbox insert", None).await?;
        let Some(mut first_unfinished) = self.none_stored_then_first_unfinished(&txn, sagas, &fresh).await? else {
            return give_up(txn).await;
        };
        for saga in &fresh {
            let first = first_unfinished.entry(read::order_key(saga)).or_insert(saga.source.offset);
            *first = (*first).min(saga.source.offset);
        }
        let maybe_blocked = read::held_back(&fresh, &first_unfinished);
        let mut members = HashMap::new();
        for saga in &fresh {
            let Some(change) = openings.get(&saga.biz_id).map(AsRef::as_ref) else { continue };
            if maybe_blocked.contains(&saga.biz_id) {
                continue;
            }
            // The row as the general path's insert leaves it, leased to `owner`: the columns
            // that insert does not write are empty.
            let mut before = (*saga).clone();
            before.version = 0;
            before.attempts = 0;
            before.next_attempt_at_ms = 0;
            before.wms_request_id = None;
            before.wms_voucher = None;
            before.wms_locked_at_ms = None;
            before.logistics_request_id = None;
            before.logistics_voucher = None;
            before.tracking_no = None;
            before.intent_at_ms = None;
            before.lease = Lease { owner_id: Some(owner.to_owned()), epoch: 1, until_ms: now_ms + lease_ms };
            members.insert(saga.biz_id.as_str(), Member::first_step(before, change, now_ms, lease_ms, actor)?);
        }
        let rows = dialect::padded_by_least(
            sagas.iter().map(|saga| (saga, members.get(saga.biz_id.as_str()))).collect(),
            shortest,
        );
        let (insert, log) = self.arrival_statements(&rows, owner, lease_ms, actor);
        txn.execute_raw(insert).await.during("insert inbox rows", None)?;
        // A row found but unreadable is not this insert's: the general path reports it.
        let stored = self.stored(&txn, sagas).await?.rows;
        let mut arrivals = Vec::with_capacity(sagas.len());
        for saga in sagas {
            let Some(row) = stored.get(&saga.biz_id) else { return self.give_way(txn).await };
            // Each row as this insert left it, or the path gives up.
            arrivals.push(match members.get(saga.biz_id.as_str()) {
                Some(member)
                    if row.lease.owner_id.as_deref() == Some(owner)
                        && row.lease.epoch == 1
                        && row.version == member.next.version
                        && row.status == member.next.status =>
                {
                    Arrival::Fresh(member.clone().into_written())
                }
                None if saga.status == Status::Received && fresh_row(row, owner) => Arrival::Fresh(row.clone()),
                None if saga.status != Status::Received && row.status == Status::Parked && row.version == 0 => {
                    Arrival::Existing(row.clone())
                }
                _ => return self.give_way(txn).await,
            });
        }
        txn.execute_raw(log).await.during("insert arrival log rows", None)?;
        // Key order, as every group takes its rows (`group.rs`).
        let mut members: Vec<Member> = members.into_values().collect();
        members.sort_by(|a, b| a.before.biz_id.cmp(&b.before.biz_id));
        self.write_applied(&txn, &members, &vec![true; members.len()]).await?;
        txn.commit().await.during("commit inbox insert", None)?;
        self.stats.write_committed();
        self.stats.transitions_written(members.len() as u64);
        self.stats.opened_on_insert(members.len() as u64);
        let opened = members.into_iter().map(|m| m.before.biz_id).collect();
        Ok(Some(Received { arrivals, maybe_blocked, opened }))
    }

    /// [`give_up`] after reading back a row this path did not insert: counted, so a run shows
    /// how often batches race each other for a row.
    async fn give_way(&self, txn: DatabaseTransaction) -> Result<Option<Received>, Error> {
        self.stats.gave_way();
        give_up(txn).await
    }

    /// Rows an earlier try of this same call opened and committed, though the caller saw the
    /// try fail (a commit whose answer was lost): each is leased to `owner` at epoch 1 and
    /// stands exactly as its opening left it at `now_ms`, the reading this call was given.
    /// They are marked fresh again, so the caller drives them instead of leaving its own rows
    /// until their leases expire; their biz_ids are returned.
    fn opened_before<O: AsRef<Change>>(
        arrivals: &mut [Arrival],
        owner: &str,
        now_ms: i64,
        openings: &HashMap<String, O>,
    ) -> HashSet<String> {
        let mut reopened = HashSet::new();
        let mut seen = HashSet::with_capacity(arrivals.len());
        for arrival in arrivals.iter_mut() {
            let first = seen.insert(arrival.biz_id().to_owned());
            let Arrival::Existing(saga) = arrival else { continue };
            let Some(change) = openings.get(&saga.biz_id).map(AsRef::as_ref) else { continue };
            let as_opened = saga.lease.owner_id.as_deref() == Some(owner)
                && saga.lease.epoch == 1
                && saga.status == change.status_after(Status::Received)
                && saga.version == (change.path.len() as u64).max(1)
                && saga.updated_at_ms == now_ms;
            if first && as_opened {
                reopened.insert(saga.biz_id.clone());
                *arrival = Arrival::Fresh(saga.clone());
            }
        }
        reopened
    }

    /// The INSERT of `rows` and the INSERT of their arrival log rows. Each row is an arrival
    /// and, when it is opened on insert, its first change: the row that change leaves is
    /// inserted instead, with that change's lease, while its arrival log row still records the
    /// arrival.
    fn arrival_statements(
        &self,
        rows: &[(&Saga, Option<&Member>)],
        owner: &str,
        lease_ms: i64,
        actor: &str,
    ) -> (Statement, Statement) {
        let now = dialect::now_ms(self.backend);
        let mut templates = Vec::with_capacity(rows.len());
        let mut values: Vec<Value> = Vec::with_capacity(rows.len() * (COLUMNS_BEFORE_LEASE + 1 + COLUMNS_AFTER_LEASE));
        let mut log_rows = Vec::with_capacity(rows.len());
        let mut log_values: Vec<Value> = Vec::with_capacity(rows.len() * 6);
        for &(saga, member) in rows {
            let opened = member.map(|member| &member.next);
            let leased = saga.status == Status::Received;
            // One text for leased and parked rows alike (a parked row's lease is 0), so where a
            // poison message sits in a batch does not make a statement of its own.
            templates.push(format!(
                "({}, CASE WHEN ? THEN {now} + ? ELSE 0 END, {})",
                dialect::placeholders(COLUMNS_BEFORE_LEASE),
                dialect::placeholders(COLUMNS_AFTER_LEASE)
            ));
            // An arrival is version 0 with no attempts; an opened row is as its change left it.
            let row = opened.unwrap_or(saga);
            let (version, attempts) = match opened {
                Some(next) => (signed(next.version), i32::try_from(next.attempts).unwrap_or(i32::MAX)),
                None => (0, 0),
            };
            values.extend([
                saga.biz_id.clone().into(),
                saga.order_no.clone().into(),
                saga.event_type.clone().into(),
                saga.source.topic.clone().into(),
                saga.source.partition.into(),
                saga.source.offset.into(),
                saga.payload.clone().into(),
                row.status.as_str().into(),
                version.into(),
                attempts.into(),
                opened.map_or(0, |next| next.next_attempt_at_ms).into(),
                row.last_error.as_deref().map(|e| fit(e, 1024)).into(),
                saga.deadline_ms.into(),
                leased.then(|| owner.to_owned()).into(),
                i64::from(leased).into(),
            ]);
            values.push(leased.into());
            values.push(if leased { member.map_or(lease_ms, Member::lease_ms) } else { 0 }.into());
            values.extend([
                saga.trace_context.clone().into(),
                saga.created_at_ms.into(),
                row.updated_at_ms.into(),
                opened.and_then(|next| next.wms_request_id.clone()).into(),
                opened.and_then(|next| next.wms_voucher.clone()).into(),
                opened.and_then(|next| next.wms_locked_at_ms).into(),
                opened.and_then(|next| next.logistics_request_id.clone()).into(),
                opened.and_then(|next| next.logistics_voucher.clone()).into(),
                opened.and_then(|next| next.tracking_no.clone()).into(),
                opened.and_then(|next| next.intent_at_ms).into(),
            ]);
            log_rows.push(format!("(?, 0, NULL, ?, ?, ?, ?, {now})"));
            let reason = if leased { "received" } else { "parked: poison input" };
            log_values.extend([
                saga.biz_id.clone().into(),
                saga.status.as_str().into(),
                i64::from(leased).into(),
                actor.into(),
                reason.into(),
            ]);
        }
        let insert = format!(
            "INSERT INTO saga ({COLUMNS}) VALUES {}{}",
            templates.join(", "),
            dialect::on_conflict_do_nothing(self.backend, "biz_id")
        );
        let log = format!(
            "INSERT INTO saga_transition (biz_id, version, from_status, to_status, lease_epoch, actor, reason, at_ms) VALUES {}{}",
            log_rows.join(", "),
            dialect::on_conflict_do_nothing(self.backend, "biz_id")
        );
        (
            Statement::from_sql_and_values(self.backend, insert, values),
            Statement::from_sql_and_values(self.backend, log, log_values),
        )
    }

    /// Reads `sagas`' rows back on `conn` and tells which are fresh (ours to drive).
    async fn classify<C: ConnectionTrait>(&self, conn: &C, sagas: &[Saga], owner: &str) -> Result<Vec<Arrival>, Error> {
        let Stored { rows: by_id, unreadable } = self.stored(conn, sagas).await?;
        let mut out = Vec::with_capacity(sagas.len());
        let mut seen = HashSet::with_capacity(sagas.len());
        for wanted in sagas {
            if let Some(error) = unreadable.get(&wanted.biz_id) {
                out.push(Arrival::Unreadable { biz_id: wanted.biz_id.clone(), error: error.clone() });
                continue;
            }
            let stored = by_id.get(&wanted.biz_id).cloned().ok_or_else(|| Error::Corrupt {
                biz_id: wanted.biz_id.clone(),
                message: "inserted row not found right after the insert".to_owned(),
            })?;
            // The same biz_id twice in one batch: only the first can be fresh.
            let first = seen.insert(wanted.biz_id.clone());
            out.push(if first && fresh_row(&stored, owner) {
                Arrival::Fresh(stored)
            } else {
                Arrival::Existing(stored)
            });
        }
        Ok(out)
    }

    /// `sagas`' rows as `conn` sees them, by biz_id (those it finds), and apart from them the
    /// ones it finds but cannot read, with why.
    async fn stored<C: ConnectionTrait>(&self, conn: &C, sagas: &[Saga]) -> Result<Stored, Error> {
        let ids = dialect::padded(sagas.iter().map(|s| s.biz_id.clone()).collect());
        let stored = saga::Entity::find()
            .filter(saga::Column::BizId.is_in(ids))
            .all(conn)
            .await
            .during("read inbox rows", None)?;
        let mut out = Stored { rows: HashMap::with_capacity(stored.len()), unreadable: HashMap::new() };
        for model in stored {
            let biz_id = model.biz_id.clone();
            match row::to_saga(model) {
                Ok(saga) => {
                    out.rows.insert(biz_id, saga);
                }
                Err(error) => {
                    out.unreadable.insert(biz_id, error.to_string());
                }
            }
        }
        Ok(out)
    }
}

/// What [`Store::stored`] found.
struct Stored {
    rows: HashMap<String, Saga>,
    unreadable: HashMap<String, String>,
}

/// Rolls back a transaction of [`Store::receive`]'s first path, which then leaves the batch
/// to the general one.
async fn give_up(txn: DatabaseTransaction) -> Result<Option<Received>, Error> {
    txn.rollback().await.during("roll back inbox insert", None)?;
    Ok(None)
}

/// A row as this owner's inbox insert leaves an arrival it drives: RECEIVED at version 0,
/// leased to `owner`.
fn fresh_row(stored: &Saga, owner: &str) -> bool {
    stored.lease.owner_id.as_deref() == Some(owner) && stored.version == 0 && stored.status == Status::Received
}

/// A padded inbox row's weight: its payload's length (the padding repeats the lightest row).
fn shortest<T>(row: &(&Saga, T)) -> usize {
    row.0.payload.len()
}

#[cfg(test)]
mod tests {
    use midflight_model::{Saga, Source, Status};

    use crate::testing::{TestDb, order_event};

    /// Where a parked row sits in a batch does not change the inbox statements' text (each
    /// text is a statement prepared on every connection), and a parked row gets no lease.
    async fn parked_rows_keep_the_statement_shape(db: &TestDb) {
        let store = &db.store;
        let now = store.now_ms().await.expect("clock");
        let batch = |parked_at: usize, prefix: &str| -> Vec<Saga> {
            (0..4_i64)
                .map(|n| {
                    let source = Source { topic: "orders".into(), partition: 0, offset: n };
                    let mut saga = Saga::received(&order_event(&format!("{prefix}-{n}")), source, now, now + 600_000);
                    if n as usize == parked_at {
                        saga.status = Status::Parked;
                        saga.last_error = Some("poison".into());
                    }
                    saga
                })
                .collect()
        };
        let (first, second) = (batch(0, "A"), batch(2, "B"));
        let rows_a: Vec<_> = first.iter().map(|saga| (saga, None)).collect();
        let rows_b: Vec<_> = second.iter().map(|saga| (saga, None)).collect();
        let (insert_a, log_a) = store.arrival_statements(&rows_a, "c1", 60_000, "consumer:c1");
        let (insert_b, log_b) = store.arrival_statements(&rows_b, "c1", 60_000, "consumer:c1");
        assert_eq!(insert_a.sql, insert_b.sql);
        assert_eq!(log_a.sql, log_b.sql);
        store.insert_arrivals(&second, "c1", 60_000, "consumer:c1").await.expect("insert");
        for saga in &second {
            let row = store.get(&saga.biz_id).await.expect("get").expect("row");
            if saga.status == Status::Parked {
                assert_eq!((row.status, row.lease.until_ms, row.lease.owner_id.as_deref()), (Status::Parked, 0, None));
            } else {
                assert!(row.lease.until_ms > now + 59_000, "leased for a minute: {row:?}");
            }
        }
    }
    crate::both_engines!(parked_rows_keep_the_inbox_statements_shape, parked_rows_keep_the_statement_shape);
}
