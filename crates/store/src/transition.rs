//! Transitions: one compare-and-set on (version, lease epoch), the transition-log rows, and the
//! writes that must be atomic with the status (business row, outbox row, ticket), in one
//! short transaction, alone or with other sagas' transitions ([`crate::group`]).
//!
//! One path writes both: each member's conditional UPDATE (alone, or sharing one statement with
//! other members of its chunk) decides whether it applied, and only applied members get log
//! rows and fused writes. Rows of the same kind across members share one multi-row statement
//! per chunk of up to [`INSERT_ROWS_MAX`], its row count a power of two (padded where a
//! repeated row changes nothing, split into power-of-two pieces where it would), so a handful
//! of statement shapes stay prepared on each connection whatever the group size.

use std::future::Future;
use std::time::Duration;

use midflight_model::{BusinessWrite, Change, Saga, Status};
use sea_orm::{ConnectionTrait, DatabaseTransaction, Statement, Value};

use crate::error::{Context, Error};
use crate::outbox::InsertClaim;
use crate::row::{fit, signed};
use crate::{Cas, Store, dialect};

/// Who writes, for the transition log: `consumer:<id>`, `recovery:<id>`, `operator:<name>`.
pub type Actor<'a> = &'a str;

/// Most rows of one multi-row INSERT (8 parameters a log row: far below every engine's limit),
/// and most members of one fused compare-and-set.
const INSERT_ROWS_MAX: usize = 64;

/// Tries of one transition transaction that the database keeps rolling back on its own.
const TRANSACTION_TRIES: u32 = 5;

/// The saga columns a transition sets from the row it writes (`Member::next`), in the order of
/// [`cas_values`]; the lease, set from the database clock, is the last value.
const CAS_COLUMNS: [&str; 13] = [
    "status",
    "version",
    "wms_request_id",
    "wms_voucher",
    "wms_locked_at_ms",
    "logistics_request_id",
    "logistics_voucher",
    "tracking_no",
    "intent_at_ms",
    "attempts",
    "next_attempt_at_ms",
    "last_error",
    "updated_at_ms",
];
/// [`CAS_COLUMNS`] and the lease length.
const CAS_VALUES: usize = CAS_COLUMNS.len() + 1;

/// What a member's compare-and-set writes: [`CAS_COLUMNS`] of its next row, then its lease length.
fn cas_values(member: &Member) -> [Value; CAS_VALUES] {
    let next = &member.next;
    [
        next.status.as_str().into(),
        signed(next.version).into(),
        next.wms_request_id.clone().into(),
        next.wms_voucher.clone().into(),
        next.wms_locked_at_ms.into(),
        next.logistics_request_id.clone().into(),
        next.logistics_voucher.clone().into(),
        next.tracking_no.clone().into(),
        next.intent_at_ms.into(),
        i32::try_from(next.attempts).unwrap_or(i32::MAX).into(),
        next.next_attempt_at_ms.into(),
        next.last_error.as_deref().map(|e| fit(e, 1024)).into(),
        next.updated_at_ms.into(),
        member.lease_ms().into(),
    ]
}

/// One saga's transition as the shared write path takes it: the row read, the row to write,
/// the change (for its log rows and fused writes), and what only the writer knows.
#[derive(Debug, Clone)]
pub(crate) struct Member {
    pub before: Saga,
    pub next: Saga,
    pub change: Change,
    pub lease_ms: i64,
    pub actor: String,
    pub call_ms: Option<u64>,
    /// The claim its outbox row, if it writes one, is written with: the writing handle's.
    pub outbox_claim: Option<std::sync::Arc<InsertClaim>>,
}

impl Member {
    /// The row as written, with the lease the write granted (or gave up).
    pub(crate) fn into_written(self) -> Saga {
        let lease_ms = self.lease_ms();
        let mut next = self.next;
        next.lease.until_ms = next.updated_at_ms + lease_ms;
        next
    }

    /// The inbox's first step of a fresh row `before`: `change` applied at `now_ms`, written by
    /// `actor` with a lease of `lease_ms`, after no call.
    pub(crate) fn first_step(
        before: Saga,
        change: &Change,
        now_ms: i64,
        lease_ms: i64,
        actor: &str,
    ) -> Result<Member, Error> {
        let next = change.apply(&before, now_ms)?;
        let actor = actor.to_owned();
        Ok(Member { before, next, change: change.clone(), lease_ms, actor, call_ms: None, outbox_claim: None })
    }

    /// The lease the write grants, from its clock reading. A release with a retry time keeps
    /// the row leased to nobody until then (`lease_until_ms` = the retry time): a saga waiting
    /// out a backoff is outside the recovery scan's index range (`saga_recovery`, by status and
    /// lease expiry) instead of read and stepped over at every page; the claim asks both.
    pub(crate) fn lease_ms(&self) -> i64 {
        if self.change.release_lease {
            self.next.next_attempt_at_ms.saturating_sub(self.next.updated_at_ms).max(0)
        } else {
            self.lease_ms
        }
    }
}

impl Store {
    /// Writes `change` to a saga the caller holds at `before.version` / `before.lease.epoch`.
    /// `now_ms` is the caller's database-clock reading (see [`Store::now_ms`]); the lease is
    /// renewed for `lease_ms` from the database clock, or released if the change says so (to
    /// the present, or, with a retry time, until then: `Member::lease_ms`).
    /// An illegal status edge is an error naming the saga; a lost race is [`Cas::Conflict`].
    pub async fn write(
        &self,
        before: &Saga,
        change: &Change,
        now_ms: i64,
        lease_ms: i64,
        actor: Actor<'_>,
    ) -> Result<Cas<Saga>, Error> {
        self.write_timed(before, change, now_ms, lease_ms, actor, None).await
    }

    /// [`Store::write`] for a change that records a downstream call's answer: `call_ms` (how
    /// long that call took, as the caller measured it) goes into the transition log, so a
    /// timeline separates the downstream's time from ours.
    pub async fn write_timed(
        &self,
        before: &Saga,
        change: &Change,
        now_ms: i64,
        lease_ms: i64,
        actor: Actor<'_>,
        call_ms: Option<u64>,
    ) -> Result<Cas<Saga>, Error> {
        let next = change.apply(before, now_ms)?;
        self.write_next(before, next, change, lease_ms, actor, call_ms).await
    }

    pub(crate) async fn write_next(
        &self,
        before: &Saga,
        next: Saga,
        change: &Change,
        lease_ms: i64,
        actor: Actor<'_>,
        call_ms: Option<u64>,
    ) -> Result<Cas<Saga>, Error> {
        let member = Member {
            before: before.clone(),
            next,
            change: change.clone(),
            lease_ms,
            actor: actor.to_owned(),
            call_ms,
            outbox_claim: self.outbox_claim.clone(),
        };
        if let Some(group) = &self.group {
            return group.submit(member).await;
        }
        let members = std::slice::from_ref(&member);
        if !self.retry_rolled_back(|| self.write_one(members)).await? {
            return Ok(Cas::Conflict);
        }
        Ok(Cas::Applied(member.into_written()))
    }

    /// One transaction writing the single `members[0]`; whether its compare-and-set applied.
    async fn write_one(&self, members: &[Member]) -> Result<bool, Error> {
        let some = members.first().map(|member| member.before.biz_id.as_str());
        let txn = self.begin("begin transition", some).await?;
        let applied = self.compare_and_set_each(&txn, members).await?;
        if !applied.first().copied().unwrap_or(false) {
            txn.rollback().await.during("roll back transition", some)?;
            return Ok(false);
        }
        self.write_applied(&txn, members, &applied).await?;
        txn.commit().await.during("commit transition", some)?;
        self.stats.write_committed();
        self.stats.transitions_written(1);
        Ok(true)
    }

    /// Runs the transaction `attempt` makes, and runs it again (after 5, 10, 20, 40 ms) while
    /// the database rolls it back on its own ([`Error::rolled_back`]: a deadlock with another
    /// group, a lock wait timeout, SQLite busy). Nothing of a rolled-back try was written, and
    /// each try's compare-and-sets decide afresh, so a try is as if it were the first. Without
    /// this a deadlock would fail every member of a group and leave their sagas until their
    /// leases expired.
    pub(crate) async fn retry_rolled_back<T, F, Fut>(&self, mut attempt: F) -> Result<T, Error>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, Error>>,
    {
        let mut tries = 1;
        loop {
            match attempt().await {
                Err(error) if error.rolled_back() && tries < TRANSACTION_TRIES => {
                    self.stats.retried();
                    tracing::debug!(tries, %error, "the database rolled a transition transaction back; trying it again");
                    tokio::time::sleep(Duration::from_millis(5 << (tries - 1))).await;
                    tries += 1;
                }
                result => return result,
            }
        }
    }

    /// The compare-and-sets of `members`, one UPDATE per chunk of up to [`INSERT_ROWS_MAX`]
    /// ([`Self::compare_and_set`]); per member whether it applied, or `None` when a chunk
    /// applied to some of its members only (the caller then rolls `txn` back and decides with
    /// [`Self::compare_and_set_each`] in a new transaction).
    pub(crate) async fn compare_and_set_chunks(
        &self,
        txn: &DatabaseTransaction,
        members: &[Member],
    ) -> Result<Option<Vec<bool>>, Error> {
        let mut applied = Vec::with_capacity(members.len());
        for chunk in members.chunks(INSERT_ROWS_MAX) {
            let Some(decided) = self.compare_and_set(txn, chunk).await? else { return Ok(None) };
            applied.extend(decided);
        }
        Ok(Some(applied))
    }

    /// The compare-and-sets of `members`, one UPDATE each; per member whether it applied.
    pub(crate) async fn compare_and_set_each(
        &self,
        txn: &DatabaseTransaction,
        members: &[Member],
    ) -> Result<Vec<bool>, Error> {
        let mut applied = Vec::with_capacity(members.len());
        for member in members {
            applied.push(self.compare_and_set_one(txn, member).await?);
        }
        Ok(applied)
    }

    /// Inside `txn` (the caller commits), for the members whose compare-and-set applied: their
    /// log rows, business rows, outbox rows and tickets.
    pub(crate) async fn write_applied(
        &self,
        txn: &DatabaseTransaction,
        members: &[Member],
        applied: &[bool],
    ) -> Result<(), Error> {
        let written = written(members, applied);
        for step in self.follow_ups(&written) {
            txn.execute_raw(step.statement).await.during(step.operation, Some(&step.biz_id))?;
        }
        for member in &written {
            if let Some(ticket) = &member.change.ticket {
                self.open_ticket(txn, &member.next, ticket, &member.actor).await?;
            }
        }
        Ok(())
    }

    /// The compare-and-set of `chunk`, per member whether it applied. One member: its own
    /// UPDATE, whose rows affected decides. Several: one UPDATE for all (each row matched by its
    /// biz_id with the version and lease epoch its member read, and given its member's values),
    /// which decides for all of them when it changed every row or none. When it changed some
    /// (`None`), the caller undoes the whole transaction and lets each member's own UPDATE
    /// decide in a new one ([`Self::compare_and_set_each`]): conflicts are rare, and a read-back
    /// could not tell a row this statement wrote from one already written the same way by an
    /// earlier, stale attempt. Undoing the transaction instead of a savepoint taken before the
    /// UPDATE saves the savepoint's round trip in every group that has no conflict.
    async fn compare_and_set(&self, txn: &DatabaseTransaction, chunk: &[Member]) -> Result<Option<Vec<bool>>, Error> {
        if let [member] = chunk {
            return Ok(Some(vec![self.compare_and_set_one(txn, member).await?]));
        }
        let first = chunk.first().map(|m| m.before.biz_id.as_str());
        let changed = txn.execute_raw(self.cas_statement(chunk)).await.during("compare-and-set sagas", first)?;
        let changed = changed.rows_affected();
        Ok((changed == chunk.len() as u64 || changed == 0).then(|| vec![changed > 0; chunk.len()]))
    }

    async fn compare_and_set_one(&self, txn: &DatabaseTransaction, member: &Member) -> Result<bool, Error> {
        let result = txn
            .execute_raw(self.update_statement(member))
            .await
            .during("compare-and-set saga", Some(&member.before.biz_id))?;
        Ok(result.rows_affected() == 1)
    }

    /// The compare-and-set of one member: its UPDATE matches only the version and lease epoch
    /// it read, so one row affected means applied and none means conflict.
    fn update_statement(&self, member: &Member) -> Statement {
        let now = dialect::now_ms(self.backend);
        let assignments: Vec<String> = CAS_COLUMNS.iter().map(|column| format!("{column} = ?")).collect();
        let sql = format!(
            "UPDATE saga SET {}, lease_until_ms = {now} + ? WHERE biz_id = ? AND version = ? AND lease_epoch = ?",
            assignments.join(", ")
        );
        let before = &member.before;
        let mut values: Vec<Value> = cas_values(member).into();
        values.extend([before.biz_id.clone().into(), signed(before.version).into(), signed(before.lease.epoch).into()]);
        Statement::from_sql_and_values(self.backend, sql, values)
    }

    /// The UPDATE of [`Self::compare_and_set`]: the columns of [`update_statement`], each a
    /// `CASE biz_id` over the chunk's members, and a WHERE naming each member's biz_id,
    /// version and lease epoch. The list is padded to a power of two by repeating the last
    /// member (`dialect::padded`), so each connection keeps a handful of these statements
    /// prepared; a repeat's `WHEN` comes after the original's and is never reached, and its row
    /// is changed once, so the rows changed still count members. Padding one statement instead
    /// of splitting the chunk into power-of-two statements saves a savepoint and an UPDATE, two
    /// round trips, per piece.
    ///
    /// [`update_statement`]: Self::update_statement
    fn cas_statement(&self, chunk: &[Member]) -> Statement {
        let chunk = dialect::padded(chunk.iter().collect::<Vec<_>>());
        let now = dialect::now_ms(self.backend);
        let cases = vec!["WHEN ? THEN ?"; chunk.len()].join(" ");
        let assignments: Vec<String> =
            CAS_COLUMNS.iter().map(|column| format!("{column} = CASE biz_id {cases} END")).collect();
        let sql = format!(
            "UPDATE {} SET {}, lease_until_ms = {now} + CASE biz_id {cases} END \
             WHERE biz_id IN ({}) AND CASE biz_id {} END",
            dialect::by_primary_key(self.backend, "saga"),
            assignments.join(", "),
            dialect::placeholders(chunk.len()),
            vec!["WHEN ? THEN version = ? AND lease_epoch = ?"; chunk.len()].join(" "),
        );
        let rows: Vec<[Value; CAS_VALUES]> = chunk.iter().map(|member| cas_values(member)).collect();
        let mut values: Vec<Value> = Vec::with_capacity(chunk.len() * (2 * CAS_VALUES + 4));
        for index in 0..CAS_VALUES {
            for (member, row) in chunk.iter().zip(&rows) {
                values.extend([member.before.biz_id.clone().into(), row[index].clone()]);
            }
        }
        values.extend(chunk.iter().map(|m| Value::from(m.before.biz_id.clone())));
        for member in chunk {
            values.extend([
                member.before.biz_id.clone().into(),
                signed(member.before.version).into(),
                signed(member.before.lease.epoch).into(),
            ]);
        }
        Statement::from_sql_and_values(self.backend, sql, values)
    }

    /// Everything the applied members write besides their compare-and-set and tickets (a
    /// ticket reads the log first, so the caller opens it after these): log rows, business
    /// rows, outbox rows. Rows of one kind share multi-row statements.
    fn follow_ups(&self, written: &[&Member]) -> Vec<FollowUp> {
        let mut steps = Vec::new();
        self.log_rows(written, &mut steps);
        let inserts: Vec<&Saga> =
            written.iter().filter(|m| m.change.business == Some(BusinessWrite::Write)).map(|m| &m.next).collect();
        self.insert_orders(&inserts, &mut steps);
        let fulfilled: Vec<&Saga> =
            written.iter().filter(|m| m.change.business == Some(BusinessWrite::Fulfil)).map(|m| &m.next).collect();
        self.fulfil_orders(&fulfilled, &mut steps);
        for member in written.iter().filter(|m| m.change.business == Some(BusinessWrite::Reverse)) {
            self.reverse_order(&member.next, &mut steps);
        }
        // One set of statements per claim (a group holds one handle's transitions, or a few).
        let mut notified: Vec<&Member> = written.iter().copied().filter(|m| m.change.notify).collect();
        while let Some(first) = notified.first() {
            let claim = first.outbox_claim.clone();
            let (same, rest): (Vec<&Member>, Vec<&Member>) =
                notified.into_iter().partition(|m| m.outbox_claim == claim);
            let sagas: Vec<&Saga> = same.iter().map(|m| &m.next).collect();
            self.insert_outbox(&sagas, claim.as_deref(), &mut steps);
            notified = rest;
        }
        steps
    }

    /// What an operator's close of `next` writes beside its saga row, as automation's close
    /// would: for DONE the business row (inserted first if step 1's write is missing) marked
    /// SHIPPED with `next`'s tracking number, and the notification's outbox row; for
    /// ROLLED_BACK the business row REVERSED.
    pub(crate) fn closing_follow_ups(&self, next: &Saga) -> Vec<FollowUp> {
        let mut steps = Vec::new();
        match next.status {
            Status::Done => {
                self.insert_orders(&[next], &mut steps);
                self.fulfil_orders(&[next], &mut steps);
                // An operator's close is not handed to any relay: its row is left unclaimed.
                self.insert_outbox(&[next], None, &mut steps);
            }
            Status::RolledBack => self.reverse_order(next, &mut steps),
            _ => {}
        }
        steps
    }

    /// Undoes step 1's business row (`BusinessWrite::Reverse`).
    fn reverse_order(&self, saga: &Saga, steps: &mut Vec<FollowUp>) {
        steps.push(FollowUp {
            statement: Statement::from_sql_and_values(
                self.backend,
                "UPDATE orders SET status = 'REVERSED', updated_at_ms = ? WHERE biz_id = ?",
                [saga.updated_at_ms.into(), saga.biz_id.clone().into()],
            ),
            operation: "write business row",
            biz_id: saga.biz_id.clone(),
        });
    }

    /// The log rows of every member's edges.
    fn log_rows(&self, members: &[&Member], steps: &mut Vec<FollowUp>) {
        let mut rows: Vec<[Value; 8]> = Vec::new();
        for member in members {
            for (index, (from, to, version)) in member.change.edges(&member.before).into_iter().enumerate() {
                // The call's time belongs to the first edge (the one recording its answer), so a
                // sum over the log counts each call once.
                let call_ms = if index == 0 { member.call_ms.map(signed) } else { None };
                rows.push([
                    member.before.biz_id.clone().into(),
                    signed(version).into(),
                    from.as_str().into(),
                    to.as_str().into(),
                    signed(member.next.lease.epoch).into(),
                    fit(&member.actor, 160).into(),
                    fit(&member.change.reason, 512).into(),
                    call_ms.into(),
                ]);
            }
        }
        let now = dialect::now_ms(self.backend);
        let first = members.first().map(|m| m.before.biz_id.clone()).unwrap_or_default();
        self.insert_rows(
            (
                "INSERT INTO saga_transition (biz_id, version, from_status, to_status, lease_epoch, actor, reason, at_ms, call_ms) VALUES",
                &format!("(?, ?, ?, ?, ?, ?, ?, {now}, ?)"),
                "",
            ),
            rows,
            Pad::Split,
            ("append transition log", &first),
            steps,
        );
    }

    /// `rows` as multi-row INSERTs of `head`, one `row` template each, then `tail`, each of a
    /// power-of-two row count (so each connection keeps a few statement shapes prepared): see
    /// [`Pad`].
    fn insert_rows<const N: usize>(
        &self,
        (head, row, tail): (&str, &str, &str),
        rows: Vec<[Value; N]>,
        pad: Pad,
        (operation, biz_id): (&'static str, &str),
        steps: &mut Vec<FollowUp>,
    ) {
        for chunk in pad.chunks(rows) {
            let sql = format!("{head} {}{tail}", vec![row; chunk.len()].join(", "));
            let values: Vec<Value> = chunk.into_iter().flatten().collect();
            steps.push(FollowUp {
                statement: Statement::from_sql_and_values(self.backend, sql, values),
                operation,
                biz_id: biz_id.to_owned(),
            });
        }
    }

    /// Step 1's business rows (`BusinessWrite::Write`); a row that exists already is left
    /// alone (the unique biz_id absorbs a repeat).
    fn insert_orders(&self, sagas: &[&Saga], steps: &mut Vec<FollowUp>) {
        let rows: Vec<[Value; 6]> = sagas
            .iter()
            .map(|saga| {
                let amount_cents = saga.order().map(|order| order.amount_cents).unwrap_or(0);
                [
                    saga.biz_id.clone().into(),
                    saga.order_no.clone().into(),
                    saga.event_type.clone().into(),
                    amount_cents.into(),
                    saga.updated_at_ms.into(),
                    saga.updated_at_ms.into(),
                ]
            })
            .collect();
        let first = sagas.first().map(|s| s.biz_id.clone()).unwrap_or_default();
        self.insert_rows(
            (
                "INSERT INTO orders (biz_id, order_no, event_type, status, amount_cents, tracking_no, created_at_ms, updated_at_ms) VALUES",
                "(?, ?, ?, 'FULFILLING', ?, NULL, ?, ?)",
                &dialect::on_conflict_do_nothing(self.backend, "biz_id"),
            ),
            rows,
            Pad::Repeat,
            ("write business row", &first),
            steps,
        );
    }

    /// Marks business rows shipped with their tracking numbers (`BusinessWrite::Fulfil`): one
    /// UPDATE per chunk of up to [`INSERT_ROWS_MAX`], padded like an IN list
    /// ([`dialect::padded`]: a repeated biz_id's `WHEN` is never reached and its row is
    /// updated once), each row's values picked by its biz_id.
    fn fulfil_orders(&self, sagas: &[&Saga], steps: &mut Vec<FollowUp>) {
        for chunk in Pad::Repeat.chunks(sagas.to_vec()) {
            let cases = vec!["WHEN ? THEN ?"; chunk.len()].join(" ");
            let sql = format!(
                "UPDATE {} SET status = 'SHIPPED', tracking_no = CASE biz_id {cases} END, \
                 updated_at_ms = CASE biz_id {cases} END WHERE biz_id IN ({})",
                dialect::by_primary_key(self.backend, "orders"),
                dialect::placeholders(chunk.len())
            );
            let mut values: Vec<Value> = Vec::with_capacity(chunk.len() * 5);
            for saga in &chunk {
                values.extend([saga.biz_id.clone().into(), saga.tracking_no.clone().into()]);
            }
            for saga in &chunk {
                values.extend([saga.biz_id.clone().into(), saga.updated_at_ms.into()]);
            }
            values.extend(chunk.iter().map(|saga| Value::from(saga.biz_id.clone())));
            steps.push(FollowUp {
                statement: Statement::from_sql_and_values(self.backend, sql, values),
                operation: "mark business rows shipped",
                biz_id: chunk.first().map(|s| s.biz_id.clone()).unwrap_or_default(),
            });
        }
    }

    /// The notifications' outbox rows: claimed by `claim`'s relay until `claim_ms` after the
    /// saga's write if given (the relay is handed them when their sagas finish), unclaimed
    /// otherwise.
    fn insert_outbox(&self, sagas: &[&Saga], claim: Option<&InsertClaim>, steps: &mut Vec<FollowUp>) {
        let rows: Vec<[Value; 6]> = sagas
            .iter()
            .map(|saga| {
                let payload = notification(saga);
                let owner = claim.map(|claim| claim.owner.clone());
                let until = claim.map_or(0, |claim| saga.updated_at_ms.saturating_add(claim.claim_ms));
                [
                    saga.biz_id.clone().into(),
                    payload.into(),
                    saga.trace_context.clone().into(),
                    saga.updated_at_ms.into(),
                    owner.into(),
                    until.into(),
                ]
            })
            .collect();
        let first = sagas.first().map(|s| s.biz_id.clone()).unwrap_or_default();
        self.insert_rows(
            (
                "INSERT INTO outbox (biz_id, payload, trace_context, created_at_ms, relay_owner, relay_until_ms, published_at_ms) VALUES",
                "(?, ?, ?, ?, ?, ?, NULL)",
                &dialect::on_conflict_do_nothing(self.backend, "biz_id"),
            ),
            rows,
            Pad::Repeat,
            ("write outbox row", &first),
            steps,
        );
    }
}

/// One statement of a transaction's follow-up writes, with what its error should name.
#[derive(Debug)]
pub(crate) struct FollowUp {
    pub(crate) statement: Statement,
    pub(crate) operation: &'static str,
    pub(crate) biz_id: String,
}

/// The members whose compare-and-set applied.
fn written<'a>(members: &'a [Member], applied: &[bool]) -> Vec<&'a Member> {
    members.iter().zip(applied).filter(|(_, ok)| **ok).map(|(member, _)| member).collect()
}

/// How the rows of one kind are cut into statements of power-of-two row counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pad {
    /// Chunks of up to [`INSERT_ROWS_MAX`] rows, each lengthened by repeating its last row:
    /// for statements where a repeat changes nothing (an INSERT that does nothing on a
    /// conflict, an UPDATE by a list of keys). One statement per chunk.
    Repeat,
    /// Pieces of the largest power of two left (at most [`INSERT_ROWS_MAX`]): for the
    /// transition log, where a repeated row would be a duplicate key, which the log must not
    /// ignore. Up to one statement per bit of the row count.
    Split,
}

impl Pad {
    fn chunks<T: Clone>(self, rows: Vec<T>) -> Vec<Vec<T>> {
        let mut chunks = Vec::new();
        let mut rows = rows.into_iter();
        let mut left = rows.len();
        while left > 0 {
            let size = match self {
                Pad::Repeat => left.min(INSERT_ROWS_MAX),
                Pad::Split => 1 << (usize::BITS - 1 - left.min(INSERT_ROWS_MAX).leading_zeros()),
            };
            let chunk: Vec<T> = rows.by_ref().take(size).collect();
            chunks.push(dialect::padded(chunk));
            left -= size;
        }
        chunks
    }
}

/// A DONE saga's notification, as its outbox row carries it.
fn notification(saga: &Saga) -> String {
    serde_json::json!({
        "kind": "ORDER_SHIPPED",
        "biz_id": saga.biz_id,
        "order_no": saga.order_no,
        "event_type": saga.event_type,
        "tracking_no": saga.tracking_no,
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_powers_of_two_that_keep_every_row() {
        let cases = [
            (1, vec![1], vec![1]),
            (3, vec![2, 1], vec![4]),
            (64, vec![64], vec![64]),
            (100, vec![64, 32, 4], vec![64, 64]),
            (130, vec![64, 64, 2], vec![64, 64, 2]),
        ];
        for (rows, split, repeat) in cases {
            let all: Vec<usize> = (0..rows).collect();
            for (pad, expected) in [(Pad::Split, split), (Pad::Repeat, repeat)] {
                let chunks = pad.chunks(all.clone());
                let sizes: Vec<usize> = chunks.iter().map(Vec::len).collect();
                assert_eq!(sizes, expected, "{rows} rows, {pad:?}");
                // Each chunk: rows in order, then only repeats of its last row.
                let mut kept = Vec::new();
                for chunk in chunks {
                    let real = (1..chunk.len()).find(|&i| chunk[i] == chunk[i - 1]).unwrap_or(chunk.len());
                    assert!(chunk[real..].iter().all(|v| *v == chunk[real - 1]), "{rows} rows, {pad:?}: {chunk:?}");
                    kept.extend_from_slice(&chunk[..real]);
                }
                assert_eq!(kept, all, "{rows} rows, {pad:?}: each row once, in order");
            }
        }
    }
}
