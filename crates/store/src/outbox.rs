//! The outbox relay's side of the table: claim pending rows (several relays may run; a claim is
//! a conditional UPDATE with an expiry, like a saga lease), then mark them published.
//!
//! A store handle may also write its outbox rows already claimed by one relay
//! ([`Store::with_outbox_claim`]): the consumer's relay then reads the rows its own sagas
//! finished by their keys and publishes them, without listing and claiming them first. A row
//! whose relay never reads it is claimable by any relay once its claim runs out, as a row left by
//! a relay that died is.
//!
//! Delivery is at least once: a relay that stalls past its claim after publishing lets another
//! relay publish again. Notifications are keyed by biz_id so their readers deduplicate.

use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect, Statement, Value};

use crate::entity::outbox;
use crate::error::{Context, Error};
use crate::{BATCH_ROWS_MAX, Store, dialect};

/// Longest relay name an outbox row holds (`outbox.relay_owner` is `VARCHAR(128)`).
const OWNER_LEN_MAX: usize = 128;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxMessage {
    pub biz_id: String,
    pub payload: String,
    pub trace_context: Option<String>,
}

/// The claim a store's outbox rows are written with: `owner`'s, for `claim_ms` from the write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InsertClaim {
    pub(crate) owner: String,
    pub(crate) claim_ms: i64,
}

impl Store {
    /// A handle on the same database whose transitions write the outbox rows of the sagas they
    /// finish claimed by the relay `owner` until `claim_ms` after the write (the writer's
    /// database-clock reading). That relay then publishes them by their keys
    /// ([`Store::read_claimed_outbox`]) without listing and claiming them. Rows written through
    /// other handles (the recovery worker's, an operator's close) stay unclaimed, for any
    /// relay's [`Store::claim_outbox`]; transitions of several handles may share a group, each
    /// row written with its own handle's claim.
    pub fn with_outbox_claim(&self, owner: &str, claim_ms: i64) -> Result<Store, Error> {
        if owner.is_empty() || owner.len() > OWNER_LEN_MAX {
            return Err(Error::Invalid(format!(
                "an outbox claimant must be 1..={OWNER_LEN_MAX} bytes, got {} bytes",
                owner.len()
            )));
        }
        if claim_ms <= 0 {
            return Err(Error::Invalid(format!("an outbox claim must last a positive time, got {claim_ms} ms")));
        }
        let claim = InsertClaim { owner: owner.to_owned(), claim_ms };
        Ok(Store { outbox_claim: Some(std::sync::Arc::new(claim)), ..self.clone() })
    }

    /// Claims up to `limit` unpublished rows for `owner` for `claim_ms`, oldest first.
    pub async fn claim_outbox(&self, owner: &str, limit: u64, claim_ms: i64) -> Result<Vec<OutboxMessage>, Error> {
        let limit = limit.min(BATCH_ROWS_MAX as u64);
        let now_ms = self.now_ms().await?;
        let operation = "find pending outbox rows";
        let candidates: Vec<String> = self
            .patiently(operation, || {
                outbox::Entity::find()
                    .select_only()
                    .column(outbox::Column::BizId)
                    .filter(outbox::Column::PublishedAtMs.is_null())
                    .filter(outbox::Column::RelayUntilMs.lte(now_ms))
                    .order_by_asc(outbox::Column::CreatedAtMs)
                    .limit(limit)
                    .into_tuple()
                    .all(&self.db)
            })
            .await
            .during(operation, None)?;
        if candidates.is_empty() {
            return Ok(Vec::new());
        }
        let padded = dialect::padded(candidates.clone());
        let now = dialect::now_ms(self.backend);
        let sql = format!(
            "UPDATE {} SET relay_owner = ?, relay_until_ms = {now} + ? \
             WHERE published_at_ms IS NULL AND relay_until_ms <= {now} AND biz_id IN ({})",
            dialect::by_primary_key(self.backend, "outbox"),
            dialect::placeholders(padded.len())
        );
        let mut values: Vec<Value> = vec![owner.into(), claim_ms.into()];
        values.extend(padded.into_iter().map(Value::from));
        let statement = Statement::from_sql_and_values(self.backend, sql, values);
        self.patiently("claim outbox rows", || self.db.execute_raw(statement.clone()))
            .await
            .during("claim outbox rows", None)?;
        self.stats.write_committed();
        // Read back whatever this claim took, however short it was.
        self.read_held(owner, &candidates, None).await
    }

    /// The rows of `biz_ids` that `owner` holds claimed with at least `left_ms` of the claim
    /// left (database clock) and that are not published yet, oldest first: those a relay
    /// claimed, or that were written claimed for it ([`Store::with_outbox_claim`]). Keys it does
    /// not hold (published, never written, claimed by another relay since its claim ran out, or
    /// with less than `left_ms` left, which a scan takes once the claim has run out) are left
    /// out. At most [`BATCH_ROWS_MAX`] keys.
    pub async fn read_claimed_outbox(
        &self,
        owner: &str,
        biz_ids: &[String],
        left_ms: i64,
    ) -> Result<Vec<OutboxMessage>, Error> {
        self.read_held(owner, biz_ids, Some(left_ms)).await
    }

    /// [`Store::read_claimed_outbox`], with no condition on the time left when `left_ms` is
    /// `None`.
    async fn read_held(
        &self,
        owner: &str,
        biz_ids: &[String],
        left_ms: Option<i64>,
    ) -> Result<Vec<OutboxMessage>, Error> {
        let operation = "read claimed outbox rows";
        if biz_ids.len() > BATCH_ROWS_MAX {
            return Err(Error::Invalid(format!("{operation}: {} keys, at most {BATCH_ROWS_MAX}", biz_ids.len())));
        }
        if biz_ids.is_empty() {
            return Ok(Vec::new());
        }
        let biz_ids = dialect::padded(biz_ids.to_vec());
        let mut values: Vec<Value> = vec![owner.into()];
        let left = match left_ms {
            Some(left_ms) => {
                values.push(left_ms.into());
                format!("AND relay_until_ms >= {} + ? ", dialect::now_ms(self.backend))
            }
            None => String::new(),
        };
        let sql = format!(
            "SELECT biz_id, payload, trace_context FROM {} \
             WHERE relay_owner = ? {left}AND published_at_ms IS NULL AND biz_id IN ({}) ORDER BY created_at_ms",
            dialect::by_primary_key(self.backend, "outbox"),
            dialect::placeholders(biz_ids.len())
        );
        values.extend(biz_ids.into_iter().map(Value::from));
        let statement = Statement::from_sql_and_values(self.backend, sql, values);
        let rows =
            self.patiently(operation, || self.db.query_all_raw(statement.clone())).await.during(operation, None)?;
        rows.iter()
            .map(|row| {
                Ok(OutboxMessage {
                    biz_id: row.try_get("", "biz_id")?,
                    payload: row.try_get("", "payload")?,
                    trace_context: row.try_get("", "trace_context")?,
                })
            })
            .collect::<Result<_, sea_orm::DbErr>>()
            .during(operation, None)
    }

    /// Gives up `owner`'s claims on the unpublished rows of `biz_ids`, so any relay may take them
    /// at once instead of when the claims run out (a relay stopping with rows it was handed and
    /// did not publish). Returns how many it released.
    pub async fn release_outbox(&self, owner: &str, biz_ids: &[String]) -> Result<u64, Error> {
        self.update_held(owner, biz_ids, "relay_owner = NULL, relay_until_ms = 0", None, "release outbox claims").await
    }

    /// Makes `owner`'s claims on the unpublished rows of `biz_ids` last `claim_ms` from now
    /// (database clock): a relay whose delivery outlasts most of a short claim. Returns how many
    /// it extended; a row another relay took meanwhile is not.
    pub async fn extend_outbox_claims(&self, owner: &str, biz_ids: &[String], claim_ms: i64) -> Result<u64, Error> {
        let set = format!("relay_until_ms = {} + ?", dialect::now_ms(self.backend));
        self.update_held(owner, biz_ids, &set, Some(claim_ms.into()), "extend outbox claims").await
    }

    /// `SET set` (with `value` for its placeholder, if any) on the unpublished rows of `biz_ids`
    /// that `owner` holds, a statement per [`BATCH_ROWS_MAX`] keys; how many rows it changed.
    async fn update_held(
        &self,
        owner: &str,
        biz_ids: &[String],
        set: &str,
        value: Option<Value>,
        operation: &'static str,
    ) -> Result<u64, Error> {
        let mut changed = 0;
        for chunk in biz_ids.chunks(BATCH_ROWS_MAX) {
            let chunk = dialect::padded(chunk.to_vec());
            let sql = format!(
                "UPDATE {} SET {set} WHERE relay_owner = ? AND published_at_ms IS NULL AND biz_id IN ({})",
                dialect::by_primary_key(self.backend, "outbox"),
                dialect::placeholders(chunk.len())
            );
            let mut values: Vec<Value> = value.iter().cloned().collect();
            values.push(owner.into());
            values.extend(chunk.into_iter().map(Value::from));
            let statement = Statement::from_sql_and_values(self.backend, sql, values);
            let result =
                self.patiently(operation, || self.db.execute_raw(statement.clone())).await.during(operation, None)?;
            self.stats.write_committed();
            changed += result.rows_affected();
        }
        Ok(changed)
    }

    /// Marks rows published, if `owner` still holds their claim; returns how many it marked.
    pub async fn mark_published(&self, owner: &str, biz_ids: &[String]) -> Result<u64, Error> {
        let set = format!("published_at_ms = {}", dialect::now_ms(self.backend));
        self.update_held(owner, biz_ids, &set, None, "mark published").await
    }

    /// Rows written but not yet published (a metric and a quiescence check).
    pub async fn outbox_pending(&self) -> Result<u64, Error> {
        use sea_orm::PaginatorTrait;
        outbox::Entity::find()
            .filter(outbox::Column::PublishedAtMs.is_null())
            .count(&self.db)
            .await
            .during("count pending outbox rows", None)
    }

    /// When the oldest notification not yet published was written (database clock), if any:
    /// one seek of `outbox_pending`.
    pub async fn oldest_unpublished_ms(&self) -> Result<Option<i64>, Error> {
        let sql = "SELECT MIN(created_at_ms) AS oldest FROM outbox WHERE published_at_ms IS NULL";
        let operation = "read the oldest unpublished outbox row";
        let row = self.db.query_one_raw(Statement::from_string(self.backend, sql)).await.during(operation, None)?;
        let oldest = row.map(|row| row.try_get::<Option<i64>>("", "oldest")).transpose().during(operation, None)?;
        Ok(oldest.flatten())
    }

    /// Every outbox row's biz_id and whether it was published (for the invariant checker).
    pub async fn outbox_rows(&self) -> Result<Vec<(String, bool)>, Error> {
        let rows = outbox::Entity::find()
            .order_by_asc(outbox::Column::BizId)
            .all(&self.db)
            .await
            .during("read outbox", None)?;
        Ok(rows.into_iter().map(|r| (r.biz_id, r.published_at_ms.is_some())).collect())
    }
}
