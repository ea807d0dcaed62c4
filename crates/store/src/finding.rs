//! Tickets for reconciliation findings: a downstream ledger that disagrees with the saga table.
//!
//! They live in `manual_ticket` beside the MANUAL_REVIEW tickets, under their own steps
//! (`WMS_LEDGER`, `LOGISTICS_LEDGER`), so a finding about a saga never merges into, reopens or
//! is closed by that saga's own review ticket. The key is the saga's biz_id, or
//! `orphan:<request id>` for an effect no saga owns.
//!
//! Opening is idempotent: an open ticket is left alone, and a resolved one is reopened only when
//! the finding changed (its fingerprint differs), so an operator who accepted a finding is not
//! asked again every run, while a new mismatch on the same key still surfaces.

use sea_orm::{ConnectionTrait, EntityTrait, SqlErr, Statement, Value};

use crate::entity::manual_ticket;
use crate::error::{Context, Error};
use crate::row::fit;
use crate::{Cas, Store, dialect};

/// Ticket step of a finding about the WMS ledger.
pub const WMS_LEDGER_STEP: &str = "WMS_LEDGER";
/// Ticket step of a finding about the logistics ledger.
pub const LOGISTICS_LEDGER_STEP: &str = "LOGISTICS_LEDGER";

/// A finding to open a ticket for.
#[derive(Debug, Clone, PartialEq)]
pub struct FindingTicket {
    /// The saga's biz_id, or `orphan:<request id>`.
    pub key: String,
    /// [`WMS_LEDGER_STEP`] or [`LOGISTICS_LEDGER_STEP`].
    pub step: &'static str,
    /// What a person must decide, in one sentence.
    pub reason: String,
    /// Identifies what was found (kind and effect ids); stored in the evidence.
    pub fingerprint: String,
    /// JSON evidence: ledger entries, the saga row if any.
    pub evidence: serde_json::Value,
}

/// What opening a finding's ticket did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TicketOutcome {
    Opened,
    /// An open ticket for the key and step exists: nothing written.
    AlreadyOpen,
    /// A resolved ticket existed for a different finding: reopened with the new evidence.
    Reopened,
    /// A resolved ticket exists for this very finding: an operator accepted it; nothing written.
    ResolvedBefore,
}

impl Store {
    /// Opens the ticket of a reconciliation finding, idempotently (see the module docs).
    pub async fn open_finding_ticket(&self, ticket: &FindingTicket, actor: &str) -> Result<TicketOutcome, Error> {
        check_step(ticket.step)?;
        let some = Some(ticket.key.as_str());
        let existing = manual_ticket::Entity::find_by_id((ticket.key.clone(), ticket.step.to_owned()))
            .one(&self.db)
            .await
            .during("read finding ticket", some)?;
        let mut evidence = ticket.evidence.clone();
        if let Some(object) = evidence.as_object_mut() {
            object.insert("fingerprint".to_owned(), ticket.fingerprint.clone().into());
        }
        match existing {
            None => self.insert_finding(ticket, &evidence, actor).await,
            Some(row) if row.state != "RESOLVED" => Ok(TicketOutcome::AlreadyOpen),
            Some(row) if fingerprint_of(&row.evidence).as_deref() == Some(ticket.fingerprint.as_str()) => {
                Ok(TicketOutcome::ResolvedBefore)
            }
            Some(row) => self.reopen_finding(ticket, &evidence, actor, row.opened_at_ms).await,
        }
    }

    /// Closes an open reconciliation ticket (a saga's own review ticket is closed by resolving
    /// the saga instead), if it still holds the finding `fingerprint` the operator looked at: a
    /// pass may have reopened it with another finding since, which closing would accept unseen
    /// (a resolved finding is never opened again). Conflict when no open ticket exists for the
    /// key and step, or it holds another finding.
    pub async fn close_ticket(
        &self,
        key: &str,
        step: &str,
        fingerprint: &str,
        operator: &str,
        note: &str,
    ) -> Result<Cas<()>, Error> {
        let Some(open) = self.open_finding_ticket_row(key, step).await? else { return Ok(Cas::Conflict) };
        if fingerprint_of(&open.evidence).as_deref() != Some(fingerprint) {
            return Ok(Cas::Conflict);
        }
        let now = dialect::now_ms(self.backend);
        // The reopening of a ticket sets its opening time: the one read above must still hold.
        let sql = format!(
            "UPDATE manual_ticket SET state = 'RESOLVED', resolved_by = ?, resolved_at_ms = {now}, resolution = ? \
             WHERE biz_id = ? AND step = ? AND state = 'OPEN' AND opened_at_ms = ?"
        );
        let values: Vec<Value> =
            vec![fit(operator, 160).into(), fit(note, 1024).into(), key.into(), step.into(), open.opened_at_ms.into()];
        let result = self
            .db
            .execute_raw(Statement::from_sql_and_values(self.backend, sql, values))
            .await
            .during("close ticket", Some(key))?;
        self.stats.write_committed();
        Ok(if result.rows_affected() == 1 { Cas::Applied(()) } else { Cas::Conflict })
    }

    /// The finding an open reconciliation ticket holds (its fingerprint), if any.
    pub async fn open_finding(&self, key: &str, step: &str) -> Result<Option<String>, Error> {
        Ok(self.open_finding_ticket_row(key, step).await?.and_then(|row| fingerprint_of(&row.evidence)))
    }

    /// The open reconciliation ticket of `key` at `step`, if any.
    async fn open_finding_ticket_row(&self, key: &str, step: &str) -> Result<Option<manual_ticket::Model>, Error> {
        check_step(step)?;
        let row = manual_ticket::Entity::find_by_id((key.to_owned(), step.to_owned()))
            .one(&self.db)
            .await
            .during("read finding ticket", Some(key))?;
        Ok(row.filter(|row| row.state == "OPEN"))
    }

    async fn insert_finding(
        &self,
        ticket: &FindingTicket,
        evidence: &serde_json::Value,
        actor: &str,
    ) -> Result<TicketOutcome, Error> {
        let now = dialect::now_ms(self.backend);
        // A plain INSERT: MySQL counts a no-op `ON DUPLICATE KEY UPDATE` as one affected row
        // (sqlx asks for found rows), so a duplicate is recognised by its error instead.
        let sql = format!(
            "INSERT INTO manual_ticket (biz_id, step, state, reason, evidence, opened_by, opened_at_ms) \
             VALUES (?, ?, 'OPEN', ?, ?, ?, {now})"
        );
        let values: Vec<Value> = vec![
            ticket.key.clone().into(),
            ticket.step.into(),
            fit(&ticket.reason, 1024).into(),
            evidence.to_string().into(),
            fit(actor, 160).into(),
        ];
        match self.db.execute_raw(Statement::from_sql_and_values(self.backend, sql, values)).await {
            Ok(_) => {
                self.stats.write_committed();
                Ok(TicketOutcome::Opened)
            }
            // Another reconciler opened it between our read and our insert.
            Err(error) if matches!(error.sql_err(), Some(SqlErr::UniqueConstraintViolation(_))) => {
                Ok(TicketOutcome::AlreadyOpen)
            }
            Err(source) => {
                Err(Error::Db { operation: "open finding ticket", biz_id: Some(ticket.key.clone()), source })
            }
        }
    }

    async fn reopen_finding(
        &self,
        ticket: &FindingTicket,
        evidence: &serde_json::Value,
        actor: &str,
        seen_opened_at_ms: i64,
    ) -> Result<TicketOutcome, Error> {
        let now = dialect::now_ms(self.backend);
        // `opened_at_ms` of the resolved row we read is the compare-and-set token.
        let sql = format!(
            "UPDATE manual_ticket SET state = 'OPEN', reason = ?, evidence = ?, opened_by = ?, opened_at_ms = {now} \
             WHERE biz_id = ? AND step = ? AND state = 'RESOLVED' AND opened_at_ms = ?"
        );
        let values: Vec<Value> = vec![
            fit(&ticket.reason, 1024).into(),
            evidence.to_string().into(),
            fit(actor, 160).into(),
            ticket.key.clone().into(),
            ticket.step.into(),
            seen_opened_at_ms.into(),
        ];
        let result = self
            .db
            .execute_raw(Statement::from_sql_and_values(self.backend, sql, values))
            .await
            .during("reopen finding ticket", Some(&ticket.key))?;
        self.stats.write_committed();
        Ok(if result.rows_affected() == 1 { TicketOutcome::Reopened } else { TicketOutcome::AlreadyOpen })
    }
}

fn check_step(step: &str) -> Result<(), Error> {
    if step == WMS_LEDGER_STEP || step == LOGISTICS_LEDGER_STEP {
        return Ok(());
    }
    Err(Error::Invalid(format!(
        "step {step:?} is not a reconciliation step ({WMS_LEDGER_STEP} or {LOGISTICS_LEDGER_STEP}); \
         a saga's review ticket is closed by resolving the saga"
    )))
}

fn fingerprint_of(evidence: &str) -> Option<String> {
    let value: serde_json::Value = serde_json::from_str(evidence).ok()?;
    value.get("fingerprint")?.as_str().map(str::to_owned)
}
