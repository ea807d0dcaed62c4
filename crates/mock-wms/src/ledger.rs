//! The WMS's bookkeeping: applying locks, reversals and tombstones to the database, and reading
//! them back. No gRPC types here beyond the `Status` a handler answers with.
//!
//! Every write happens in one short transaction during this process's [`WriteTurn`], so the
//! "is this request id known?" check and the write that follows cannot interleave with another
//! call, and each write appends exactly one ledger entry. LockStock calls are applied in groups
//! (one transaction for every call queued while the previous one committed, see
//! [`midflight_mock::serial::Group`]), each call answered exactly as if applied alone.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use midflight_mock::database::ensure_table;
use midflight_mock::serial::{Group, Waiting, WriteTurn};
use midflight_mock::{Clock, SerialWriter};
use sea_orm::sea_query::{Expr, ExprTrait};
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbErr, EntityTrait,
    QueryFilter, QueryOrder, QuerySelect, TransactionTrait,
};
use tonic::Status;

use crate::entity::{LedgerKind, Line, LockState, ledger, lock, stock};

/// How many stock rows one seeding insert carries; keeps each statement far below SQLite's
/// bound-parameter limit.
const SEED_BATCH_ROWS: usize = 500;
/// Most LockStock calls applied in one group transaction; more wait for the next. Keeps every
/// statement of a group (11 parameters a lock row) far below SQLite's bound-parameter limit.
const GROUP_CALLS_MAX: usize = 256;
/// Rows per multi-row insert of a group.
const INSERT_ROWS_MAX: usize = 64;

/// A validated LockStock request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockOrder {
    pub request_id: String,
    pub order_no: String,
    pub lines: Vec<Line>,
    pub voucher: String,
}

/// A validated ReverseLock request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReverseOrder {
    pub request_id: String,
    pub voucher: String,
    pub order_no: String,
}

/// What LockStock answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockAnswer {
    pub state: LockState,
    pub lock_id: String,
    pub reason: String,
}

/// What ReverseLock did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReverseResult {
    Reversed,
    Tombstoned,
    NothingToReverse,
    Irreversible,
    VoucherMismatch,
}

/// What ReverseLock answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReverseAnswer {
    pub result: ReverseResult,
    pub reason: String,
}

/// The WMS's database and the discipline for writing it.
#[derive(Debug)]
pub struct Ledger {
    db: DatabaseConnection,
    writer: SerialWriter,
    clock: Arc<dyn Clock>,
    /// LockStock calls waiting for the next group transaction.
    locks: Group<(LockOrder, bool), Result<LockAnswer, Status>>,
}

impl Ledger {
    /// Creates missing tables and picks up the ledger where the last process left it.
    pub async fn open(db: DatabaseConnection, clock: Arc<dyn Clock>) -> Result<Ledger, midflight_mock::Error> {
        ensure_table(&db, stock::Entity).await?;
        ensure_table(&db, lock::Entity).await?;
        ensure_table(&db, ledger::Entity).await?;
        let last = ledger::Entity::find().order_by_desc(ledger::Column::Seq).one(&db).await.map_err(startup)?;
        let last_seq = last.map_or(0, |entry| u64::try_from(entry.seq).unwrap_or(0));
        Ok(Ledger { db, writer: SerialWriter::new(last_seq), clock, locks: Group::default() })
    }

    /// Inserts the SKUs of `levels` that have no stock row yet; existing rows keep their level,
    /// so a restart does not undo the locks made before it. Returns how many were inserted.
    pub async fn seed_stock(&self, levels: &BTreeMap<String, i64>) -> Result<usize, midflight_mock::Error> {
        let _turn = self.writer.turn().await;
        let known: HashSet<String> =
            stock::Entity::find().all(&self.db).await.map_err(startup)?.into_iter().map(|row| row.sku).collect();
        let missing: Vec<stock::ActiveModel> = levels
            .iter()
            .filter(|(sku, _)| !known.contains(*sku))
            .map(|(sku, available)| stock::ActiveModel { sku: Set(sku.clone()), available: Set(*available) })
            .collect();
        for batch in missing.chunks(SEED_BATCH_ROWS) {
            stock::Entity::insert_many(batch.to_vec()).exec_without_returning(&self.db).await.map_err(startup)?;
        }
        Ok(missing.len())
    }

    /// LockStock. Idempotent on the request id, except in legacy mode, where every call gets a
    /// fresh key of the WMS's own and so deducts again.
    pub async fn lock(&self, order: LockOrder, legacy: bool) -> Result<LockAnswer, Status> {
        self.locks
            .submit(&self.writer, (order, legacy), |turn, batch| self.apply_locks(turn, batch))
            .await
            .unwrap_or_else(|_| Err(Status::unavailable("lock group abandoned; its outcome is unknown")))
    }

    /// Applies a group of LockStock calls in one transaction and answers each. A failed
    /// transaction fails every call of the group (none of them applied).
    async fn apply_locks(
        &self,
        mut turn: WriteTurn<'_>,
        mut batch: Vec<Waiting<(LockOrder, bool), Result<LockAnswer, Status>>>,
    ) {
        while !batch.is_empty() {
            let rest = batch.split_off(batch.len().min(GROUP_CALLS_MAX));
            let group = std::mem::replace(&mut batch, rest);
            let requests: Vec<&(LockOrder, bool)> = group.iter().map(|w| &w.request).collect();
            match self.try_apply_locks(&mut turn, &requests).await {
                Ok(answers) => {
                    turn.commit_taken();
                    for (waiting, answer) in group.into_iter().zip(answers) {
                        let _ = waiting.reply.send(answer);
                    }
                }
                Err(status) => {
                    turn.return_taken();
                    for waiting in group {
                        let _ = waiting.reply.send(Err(status.clone()));
                    }
                }
            }
        }
    }

    async fn try_apply_locks(
        &self,
        turn: &mut WriteTurn<'_>,
        requests: &[&(LockOrder, bool)],
    ) -> Result<Vec<Result<LockAnswer, Status>>, Status> {
        let ids: Vec<&str> =
            requests.iter().filter(|(_, legacy)| !legacy).map(|(order, _)| order.request_id.as_str()).collect();
        let mut known: HashMap<String, LockAnswer> = HashMap::new();
        if !ids.is_empty() {
            let rows = lock::Entity::find()
                .filter(lock::Column::RequestId.is_in(ids))
                .all(&self.db)
                .await
                .map_err(db_error)?;
            for (request_id, row) in first_of(rows, Answering::Repeat) {
                tracing::info!(%request_id, state = ?row.state, "lock repeated, first answer returned");
                known.insert(request_id, LockAnswer::of(&row));
            }
        }
        let txn = self.db.begin().await.map_err(db_error)?;
        let skus: Vec<&str> =
            requests.iter().flat_map(|(order, _)| order.lines.iter().map(|l| l.sku.as_str())).collect();
        let mut stock = load_levels(&txn, &skus).await?;
        let mut touched: BTreeMap<String, i64> = BTreeMap::new();
        let (mut locks, mut entries) = (Vec::new(), Vec::new());
        let mut answers = Vec::with_capacity(requests.len());
        let now_ms = self.clock.now_ms();
        for (order, legacy) in requests {
            if !legacy && let Some(answer) = known.get(&order.request_id) {
                answers.push(Ok(answer.clone()));
                continue;
            }
            if let Some(unknown) = order.lines.iter().find(|line| !stock.contains_key(&line.sku)) {
                answers.push(Err(Status::invalid_argument(format!("unknown sku {:?}", unknown.sku))));
                continue;
            }
            let seq = turn.next_seq();
            let key = if *legacy { format!("legacy-{seq}") } else { order.request_id.clone() };
            let answer = match shortage(&stock, &order.lines) {
                Some(reason) => LockAnswer { state: LockState::Rejected, lock_id: String::new(), reason },
                None => {
                    for line in &order.lines {
                        let level = stock.entry(line.sku.clone()).or_default();
                        *level -= line.quantity;
                        touched.insert(line.sku.clone(), *level);
                    }
                    LockAnswer { state: LockState::Locked, lock_id: format!("LCK{seq:012}"), reason: String::new() }
                }
            };
            let (row, entry) = lock_rows(order, key, &answer, seq, now_ms)?;
            locks.push(row);
            entries.push(entry);
            tracing::info!(request_id = %order.request_id, state = ?answer.state, lock_id = %answer.lock_id, legacy, "lock applied");
            if !legacy {
                known.insert(order.request_id.clone(), answer.clone());
            }
            answers.push(Ok(answer));
        }
        set_levels(&txn, &touched).await?;
        for chunk in locks.chunks(INSERT_ROWS_MAX) {
            lock::Entity::insert_many(chunk.to_vec()).exec_without_returning(&txn).await.map_err(db_error)?;
        }
        for chunk in entries.chunks(INSERT_ROWS_MAX) {
            ledger::Entity::insert_many(chunk.to_vec()).exec_without_returning(&txn).await.map_err(db_error)?;
        }
        txn.commit().await.map_err(db_error)?;
        Ok(answers)
    }

    /// ReverseLock. `window_ms` is the irreversibility window in force (`None`: never).
    pub async fn reverse(
        &self,
        order: ReverseOrder,
        window_ms: Option<i64>,
        legacy: bool,
    ) -> Result<ReverseAnswer, Status> {
        let turn = self.writer.turn().await;
        let row = if legacy { self.latest_for(&order.request_id).await? } else { self.find(&order.request_id).await? };
        let Some(row) = row else {
            if legacy {
                // The user's WMS keeps no tombstones (Contract::LEGACY): it would not refuse a
                // late lock under an id it never saw, so it does not claim to.
                return Ok(ReverseAnswer {
                    result: ReverseResult::NothingToReverse,
                    reason: "no lock under this request id".to_owned(),
                });
            }
            return self.tombstone(turn, order).await;
        };
        let now_ms = self.clock.now_ms();
        let answer = |result, reason: &str| Ok(ReverseAnswer { result, reason: reason.to_owned() });
        if row.voucher != order.voucher {
            return answer(ReverseResult::VoucherMismatch, "voucher does not match the one stored with the lock");
        }
        match row.state {
            LockState::Rejected => {
                answer(ReverseResult::NothingToReverse, "the lock was rejected; nothing was deducted")
            }
            LockState::Reversed => answer(ReverseResult::Reversed, "already reversed"),
            LockState::Tombstoned => answer(ReverseResult::Tombstoned, "already tombstoned"),
            LockState::Locked if !reversible(&row, window_ms, now_ms) => answer(
                ReverseResult::Irreversible,
                &format!("locked {} ms ago, past the reversal window", now_ms - row.created_at_ms),
            ),
            LockState::Locked => self.restore(turn, row, now_ms).await,
        }
    }

    /// QueryLock: the row under `request_id`, if any: the one made under that key, or else one
    /// made under it in legacy mode (a lock in force first), so locks made while legacy mode was
    /// on are found after it is turned off.
    pub async fn find(&self, request_id: &str) -> Result<Option<lock::Model>, Status> {
        let rows = lock::Entity::find()
            .filter(lock::Column::RequestId.eq(request_id))
            .all(&self.db)
            .await
            .map_err(db_error)?;
        Ok(first_of(rows, Answering::State).remove(request_id))
    }

    /// ListLedger: up to `limit` entries after `cursor`, in order.
    /// With `request_ids`, only the entries under them.
    pub async fn list(&self, cursor: u64, limit: u64, request_ids: Vec<String>) -> Result<Vec<ledger::Model>, Status> {
        let after = i64::try_from(cursor).unwrap_or(i64::MAX);
        let mut find = ledger::Entity::find().filter(ledger::Column::Seq.gt(after));
        if !request_ids.is_empty() {
            find = find.filter(ledger::Column::RequestId.is_in(request_ids));
        }
        find.order_by_asc(ledger::Column::Seq).limit(limit).all(&self.db).await.map_err(db_error)
    }

    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    /// Legacy mode keys rows by made-up ids; the caller's id finds the latest row it sent.
    async fn latest_for(&self, request_id: &str) -> Result<Option<lock::Model>, Status> {
        let rows = lock::Entity::find()
            .filter(lock::Column::RequestId.eq(request_id))
            .order_by_desc(lock::Column::CreatedSeq)
            .all(&self.db)
            .await
            .map_err(db_error)?;
        let live = rows.iter().find(|row| row.state == LockState::Locked).cloned();
        Ok(live.or_else(|| rows.into_iter().next()))
    }

    async fn tombstone(&self, mut turn: WriteTurn<'_>, order: ReverseOrder) -> Result<ReverseAnswer, Status> {
        let now_ms = self.clock.now_ms();
        let seq = turn.next_seq();
        let row = lock::ActiveModel {
            lock_key: Set(order.request_id.clone()),
            request_id: Set(order.request_id.clone()),
            order_no: Set(order.order_no.clone()),
            state: Set(LockState::Tombstoned),
            lock_id: Set(String::new()),
            reason: Set("reversed before any lock arrived".to_owned()),
            voucher: Set(order.voucher.clone()),
            lines: Set("[]".to_owned()),
            created_seq: Set(seq_i64(seq)),
            created_at_ms: Set(now_ms),
            updated_at_ms: Set(now_ms),
        };
        let txn = self.db.begin().await.map_err(db_error)?;
        lock::Entity::insert(row).exec_without_returning(&txn).await.map_err(db_error)?;
        let entry = Entry {
            seq,
            kind: LedgerKind::Tombstone,
            request_id: &order.request_id,
            lock_id: "",
            order_no: &order.order_no,
        };
        append(&txn, entry, "[]".to_owned(), now_ms).await?;
        txn.commit().await.map_err(db_error)?;
        turn.committed();
        tracing::info!(request_id = %order.request_id, "tombstone recorded");
        Ok(ReverseAnswer {
            result: ReverseResult::Tombstoned,
            reason: "no lock existed; later locks are refused".to_owned(),
        })
    }

    async fn restore(&self, mut turn: WriteTurn<'_>, row: lock::Model, now_ms: i64) -> Result<ReverseAnswer, Status> {
        let lines: Vec<Line> = serde_json::from_str(&row.lines)
            .map_err(|e| Status::internal(format!("lock {} has unreadable lines: {e}", row.lock_key)))?;
        let seq = turn.next_seq();
        let txn = self.db.begin().await.map_err(db_error)?;
        for line in &lines {
            stock::Entity::update_many()
                .col_expr(stock::Column::Available, Expr::col(stock::Column::Available).add(line.quantity))
                .filter(stock::Column::Sku.eq(line.sku.as_str()))
                .exec(&txn)
                .await
                .map_err(db_error)?;
        }
        lock::Entity::update_many()
            .col_expr(lock::Column::State, Expr::value(LockState::Reversed))
            .col_expr(lock::Column::UpdatedAtMs, Expr::value(now_ms))
            .filter(lock::Column::LockKey.eq(row.lock_key.as_str()))
            .exec(&txn)
            .await
            .map_err(db_error)?;
        let entry = Entry {
            seq,
            kind: LedgerKind::Reverse,
            request_id: &row.request_id,
            lock_id: &row.lock_id,
            order_no: &row.order_no,
        };
        append(&txn, entry, row.lines.clone(), now_ms).await?;
        txn.commit().await.map_err(db_error)?;
        turn.committed();
        tracing::info!(request_id = %row.request_id, lock_id = %row.lock_id, "lock reversed");
        Ok(ReverseAnswer { result: ReverseResult::Reversed, reason: String::new() })
    }
}

impl LockAnswer {
    /// The answer a repeat gets: the row's state now (a reversed lock answers REVERSED).
    pub fn of(row: &lock::Model) -> LockAnswer {
        LockAnswer { state: row.state, lock_id: row.lock_id.clone(), reason: row.reason.clone() }
    }
}

/// What a request id's row is looked up for.
#[derive(Debug, Clone, Copy)]
enum Answering {
    /// A repeated LockStock: the first answer given under the request id.
    Repeat,
    /// A query or a reversal: the lock in force, if any.
    State,
}

/// Per request id, the row that answers for it. For a repeat, the one keyed by the request id
/// itself, else the latest made under it in legacy mode that is in force, else the latest; for
/// a query or a reversal, a lock in force first (legacy mode may have made one after the keyed
/// row was tombstoned or reversed), then the same order.
fn first_of(rows: Vec<lock::Model>, answering: Answering) -> HashMap<String, lock::Model> {
    let rank = |row: &lock::Model| {
        let (keyed, locked) = (row.lock_key == row.request_id, row.state == LockState::Locked);
        match answering {
            Answering::Repeat => (keyed, locked, row.created_seq),
            Answering::State => (locked, keyed, row.created_seq),
        }
    };
    let mut first: HashMap<String, lock::Model> = HashMap::new();
    for row in rows {
        match first.get(&row.request_id) {
            Some(kept) if rank(kept) >= rank(&row) => {}
            _ => {
                first.insert(row.request_id.clone(), row);
            }
        }
    }
    first
}

/// Whether ReverseLock can still succeed on `row`.
pub fn reversible(row: &lock::Model, window_ms: Option<i64>, now_ms: i64) -> bool {
    row.state == LockState::Locked && window_ms.is_none_or(|window| now_ms.saturating_sub(row.created_at_ms) < window)
}

/// The lock row and the ledger entry a LockStock call that applied writes.
fn lock_rows(
    order: &LockOrder,
    key: String,
    answer: &LockAnswer,
    seq: u64,
    now_ms: i64,
) -> Result<(lock::ActiveModel, ledger::ActiveModel), Status> {
    let lines = lines_json(&order.lines)?;
    let row = lock::ActiveModel {
        lock_key: Set(key),
        request_id: Set(order.request_id.clone()),
        order_no: Set(order.order_no.clone()),
        state: Set(answer.state),
        lock_id: Set(answer.lock_id.clone()),
        reason: Set(answer.reason.clone()),
        voucher: Set(order.voucher.clone()),
        lines: Set(lines.clone()),
        created_seq: Set(seq_i64(seq)),
        created_at_ms: Set(now_ms),
        updated_at_ms: Set(now_ms),
    };
    let kind = if answer.state == LockState::Locked { LedgerKind::Lock } else { LedgerKind::Reject };
    let entry = ledger::ActiveModel {
        seq: Set(seq_i64(seq)),
        kind: Set(kind),
        request_id: Set(order.request_id.clone()),
        lock_id: Set(answer.lock_id.clone()),
        order_no: Set(order.order_no.clone()),
        lines: Set(lines),
        at_ms: Set(now_ms),
    };
    Ok((row, entry))
}

/// The identity part of a ledger entry.
struct Entry<'a> {
    seq: u64,
    kind: LedgerKind,
    request_id: &'a str,
    lock_id: &'a str,
    order_no: &'a str,
}

async fn append(txn: &DatabaseTransaction, entry: Entry<'_>, lines: String, at_ms: i64) -> Result<(), Status> {
    let row = ledger::ActiveModel {
        seq: Set(seq_i64(entry.seq)),
        kind: Set(entry.kind),
        request_id: Set(entry.request_id.to_owned()),
        lock_id: Set(entry.lock_id.to_owned()),
        order_no: Set(entry.order_no.to_owned()),
        lines: Set(lines),
        at_ms: Set(at_ms),
    };
    ledger::Entity::insert(row).exec_without_returning(txn).await.map_err(db_error)?;
    Ok(())
}

/// The stock levels of `skus` that exist (an unknown SKU is left out: the caller's error).
async fn load_levels(txn: &impl ConnectionTrait, skus: &[&str]) -> Result<HashMap<String, i64>, Status> {
    let mut unique: Vec<&str> = skus.to_vec();
    unique.sort_unstable();
    unique.dedup();
    let mut levels = HashMap::with_capacity(unique.len());
    for chunk in unique.chunks(SEED_BATCH_ROWS) {
        let rows =
            stock::Entity::find().filter(stock::Column::Sku.is_in(chunk.to_vec())).all(txn).await.map_err(db_error)?;
        levels.extend(rows.into_iter().map(|row| (row.sku, row.available)));
    }
    Ok(levels)
}

/// Why the order cannot be served from `stock`, if it cannot.
fn shortage(stock: &HashMap<String, i64>, lines: &[Line]) -> Option<String> {
    lines.iter().find_map(|line| {
        let available = stock.get(&line.sku).copied().unwrap_or(0);
        (available < line.quantity)
            .then(|| format!("not enough stock of {}: {available} available, {} requested", line.sku, line.quantity))
    })
}

/// Writes the new levels of the SKUs a group changed: one statement per chunk of SKUs.
async fn set_levels(txn: &DatabaseTransaction, levels: &BTreeMap<String, i64>) -> Result<(), Status> {
    let levels: Vec<(&String, &i64)> = levels.iter().collect();
    for chunk in levels.chunks(INSERT_ROWS_MAX) {
        let mut case = Expr::case(stock::Column::Sku.eq(chunk[0].0.as_str()), *chunk[0].1);
        for (sku, level) in &chunk[1..] {
            case = case.case(stock::Column::Sku.eq(sku.as_str()), **level);
        }
        let skus: Vec<&str> = chunk.iter().map(|(sku, _)| sku.as_str()).collect();
        stock::Entity::update_many()
            .col_expr(stock::Column::Available, case.finally(Expr::col(stock::Column::Available)).into())
            .filter(stock::Column::Sku.is_in(skus))
            .exec(txn)
            .await
            .map_err(db_error)?;
    }
    Ok(())
}

fn lines_json(lines: &[Line]) -> Result<String, Status> {
    serde_json::to_string(lines).map_err(|e| Status::internal(format!("cannot encode lines: {e}")))
}

/// Sequence numbers start at 1 and grow by one per entry; they never come near i64::MAX.
fn seq_i64(seq: u64) -> i64 {
    i64::try_from(seq).unwrap_or(i64::MAX)
}

/// A database failure: the caller cannot know whether a write committed, so it is not a
/// business answer but an error.
fn db_error(error: DbErr) -> Status {
    Status::internal(format!("ledger database: {error}"))
}

fn startup(source: DbErr) -> midflight_mock::Error {
    midflight_mock::Error::Database { context: "cannot prepare the wms ledger".to_owned(), source }
}

/// Takes the ledger entry `seq` out of sight (`hold`), or shows it again, in the WMS database at
/// `url`: as a WMS that numbers an entry when its write begins shows it only once that write
/// commits, possibly after later entries. For the tests of the ledger's readers.
pub async fn hold_entry(url: &str, seq: u64, hold: bool) -> Result<(), DbErr> {
    let db = sea_orm::Database::connect(url).await?;
    let txn = db.begin().await?;
    txn.execute_unprepared("CREATE TABLE IF NOT EXISTS wms_ledger_held AS SELECT * FROM wms_ledger WHERE 0").await?;
    let (from, to) = if hold { ("wms_ledger", "wms_ledger_held") } else { ("wms_ledger_held", "wms_ledger") };
    let copied = txn.execute_unprepared(&format!("INSERT INTO {to} SELECT * FROM {from} WHERE seq = {seq}")).await?;
    if copied.rows_affected() != 1 {
        return Err(DbErr::RecordNotFound(format!("no entry {seq} in {from}")));
    }
    txn.execute_unprepared(&format!("DELETE FROM {from} WHERE seq = {seq}")).await?;
    txn.commit().await?;
    db.close().await
}
