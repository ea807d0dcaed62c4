//! A transition written alone on MySQL, in one round trip instead of one per statement.
//!
//! At a moderate rate a group is a single transition (`group.rs`), and its transaction is four
//! to six requests, each waiting for the server's answer before the next is sent: `BEGIN`, the
//! compare-and-set, the log rows, the business and outbox rows of a last step, `COMMIT`. On a
//! busy box each wait is a switch to the server's thread and back. Here the same transaction
//! goes as one text request (MySQL runs a request's statements in order and stops at the first
//! error):
//!
//! ```sql
//! BEGIN;
//! UPDATE saga SET ... WHERE biz_id = ... AND version = ... AND lease_epoch = ...;
//! SET @midflight_cas = ROW_COUNT();
//! INSERT INTO saga_transition (...) SELECT ... FROM DUAL WHERE @midflight_cas = 1;  -- each row
//! UPDATE orders SET ... WHERE biz_id = ... AND @midflight_cas = 1;                    -- and so on
//! COMMIT;
//! SELECT @midflight_cas
//! ```
//!
//! The compare-and-set is the same UPDATE as on the prepared path, and its own rows affected
//! still decide: every later write is guarded by it, so a conflict commits a transaction that
//! wrote nothing, and the last SELECT tells the caller which it was. Values are written into
//! the text as literals that cannot end a string early (`_utf8mb4 X'...'` for text, digits for
//! numbers). When a statement fails, the server runs none of the rest; the connection, which may
//! still hold an open transaction, is closed instead of returned to the pool, and closing it
//! rolls that transaction back. So a failure leaves nothing written, as a rolled-back
//! transaction of the prepared path does, and the same rules say whether it is tried again.
//!
//! Only a transition with no ticket (a ticket reads the log before it writes) takes this path;
//! groups of several keep their shared prepared statements, whose partial conflicts need a
//! rollback that a guard cannot express. `database.one_round_trip = false` turns the path off.

use std::fmt::Write as _;
use std::sync::Arc;

use sea_orm::sqlx::{self, AssertSqlSafe, Row as _};
use sea_orm::{DbBackend, DbErr, RuntimeErr, Statement, Value};

use crate::Store;
use crate::error::{Context, Error};
use crate::transition::Member;

/// The session variable holding the compare-and-set's rows affected, and the condition every
/// later write of the request carries.
const GUARD: &str = "@midflight_cas = 1";

impl Store {
    /// `member`'s transition as one request: `Some(applied)`, or `None` when it does not take
    /// this path (not MySQL, the path turned off, a ticket to open, a value with no literal
    /// form here), so the caller writes it the prepared way. The caller counts the commit.
    pub(crate) async fn write_in_one_trip(&self, member: &Member) -> Result<Option<bool>, Error> {
        if !self.one_trip || self.backend != DbBackend::MySql || member.change.ticket.is_some() {
            return Ok(None);
        }
        let Some(sql) = self.one_trip_sql(member) else { return Ok(None) };
        let biz_id = Some(member.before.biz_id.as_str());
        let mut conn =
            self.db.get_mysql_connection_pool().acquire().await.map_err(db_err).during("begin transition", biz_id)?;
        let rows = match sqlx::raw_sql(AssertSqlSafe(sql)).fetch_all(&mut *conn).await {
            Ok(rows) => rows,
            Err(error) => {
                // The request stopped at a failed statement and may have left its transaction
                // open: closing the connection rolls it back.
                conn.close_on_drop();
                return Err(db_err(error)).during("write transition in one request", biz_id);
            }
        };
        let applied = match rows.as_slice() {
            [row] => row.try_get::<Option<i64>, _>(0).map_err(db_err).during("read transition outcome", biz_id)?,
            _ => None,
        };
        let applied = match applied {
            Some(1) => true,
            Some(0) => false,
            other => {
                return Err(Error::Corrupt {
                    biz_id: member.before.biz_id.clone(),
                    message: format!("the compare-and-set of one saga changed {other:?} rows"),
                });
            }
        };
        self.stats.one_trip();
        Ok(Some(applied))
    }

    /// The request's text, or `None` when a value has no literal form here.
    fn one_trip_sql(&self, member: &Member) -> Option<String> {
        let mut sql = String::with_capacity(4096);
        sql.push_str("BEGIN;\n");
        push_inlined(&mut sql, &self.update_statement(member))?;
        sql.push_str(";\nSET @midflight_cas = ROW_COUNT();\n");
        for step in self.follow_ups(&[member], Some(GUARD)) {
            push_inlined(&mut sql, &step.statement)?;
            sql.push_str(";\n");
        }
        sql.push_str("COMMIT;\nSELECT @midflight_cas");
        Some(sql)
    }
}

fn db_err(error: sqlx::Error) -> DbErr {
    DbErr::Exec(RuntimeErr::SqlxError(Arc::new(error)))
}

/// `statement`'s SQL with each `?` outside quotes replaced by its value's literal, appended to
/// `out`; `None` when a value has no literal form here or the counts differ.
fn push_inlined(out: &mut String, statement: &Statement) -> Option<()> {
    let values = statement.values.as_ref().map(|values| values.0.as_slice()).unwrap_or_default();
    let mut values = values.iter();
    let mut quoted = false;
    for c in statement.sql.chars() {
        match c {
            '\'' => {
                quoted = !quoted;
                out.push(c);
            }
            '?' if !quoted => out.push_str(&literal(values.next()?)?),
            _ => out.push(c),
        }
    }
    values.next().is_none().then_some(())
}

/// `value` as a MySQL literal: text as a hex literal in utf8mb4 (the connection's character
/// set, as a prepared statement's text parameter is), so no byte of it can end the literal.
fn literal(value: &Value) -> Option<String> {
    Some(match value {
        Value::Bool(v) => v.map_or("NULL".to_owned(), |v| u8::from(v).to_string()),
        Value::TinyInt(v) => number(v),
        Value::SmallInt(v) => number(v),
        Value::Int(v) => number(v),
        Value::BigInt(v) => number(v),
        Value::TinyUnsigned(v) => number(v),
        Value::SmallUnsigned(v) => number(v),
        Value::Unsigned(v) => number(v),
        Value::BigUnsigned(v) => number(v),
        Value::String(None) => "NULL".to_owned(),
        Value::String(Some(text)) => {
            let mut hex = String::with_capacity(12 + 2 * text.len());
            hex.push_str("_utf8mb4 X'");
            for byte in text.as_bytes() {
                let _ = write!(hex, "{byte:02X}");
            }
            hex.push('\'');
            hex
        }
        _ => return None,
    })
}

fn number<T: ToString>(value: &Option<T>) -> String {
    value.as_ref().map_or("NULL".to_owned(), ToString::to_string)
}

#[cfg(test)]
mod tests {
    use sea_orm::{DbBackend, Statement, Value};

    use super::{literal, push_inlined};

    #[test]
    fn text_becomes_a_hex_literal_that_nothing_inside_can_end() {
        assert_eq!(literal(&Value::from("a'b\\?")).as_deref(), Some("_utf8mb4 X'6127625C3F'"));
        assert_eq!(literal(&Value::from("")).as_deref(), Some("_utf8mb4 X''"));
        assert_eq!(literal(&Value::from("€")).as_deref(), Some("_utf8mb4 X'E282AC'"));
        assert_eq!(literal(&Value::String(None)).as_deref(), Some("NULL"));
        assert_eq!(literal(&Value::from(-42_i64)).as_deref(), Some("-42"));
        assert_eq!(literal(&Value::BigInt(None)).as_deref(), Some("NULL"));
        assert_eq!(literal(&Value::from(7_u32)).as_deref(), Some("7"));
        assert_eq!(literal(&Value::from(true)).as_deref(), Some("1"));
        assert_eq!(literal(&Value::from(1.5_f64)), None, "no float is written by a transition");
    }

    #[test]
    fn placeholders_are_replaced_in_order_and_quoted_question_marks_are_left() {
        let statement = Statement::from_sql_and_values(
            DbBackend::MySql,
            "UPDATE t SET a = ?, b = 'why?' WHERE c = ?",
            [Value::from(1_i64), Value::from("x?")],
        );
        let mut out = String::new();
        push_inlined(&mut out, &statement).expect("every value has a literal");
        assert_eq!(out, "UPDATE t SET a = 1, b = 'why?' WHERE c = _utf8mb4 X'783F'");
    }

    #[test]
    fn a_count_mismatch_or_a_value_without_literal_gives_none() {
        for (sql, values) in [
            ("SELECT ?, ?", vec![Value::from(1_i64)]),
            ("SELECT ?", vec![Value::from(1_i64), Value::from(2_i64)]),
            ("SELECT ?", vec![Value::from(0.5_f64)]),
        ] {
            let statement = Statement::from_sql_and_values(DbBackend::MySql, sql, values);
            assert_eq!(push_inlined(&mut String::new(), &statement), None, "{sql}");
        }
    }
}
