//! The WMS's books as database tables: stock per SKU, one row per lock key, and the append-only
//! ledger that reconciliation reads.
//!
//! States and ledger kinds are stored as short words, not numbers, so a person auditing the
//! database after a scenario reads it without a decoder ring.

use sea_orm::entity::prelude::*;
use serde::{Deserialize, Serialize};

/// One line of a lock: how much of which SKU. Stored as JSON in the lock and ledger rows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Line {
    pub sku: String,
    pub quantity: i64,
}

/// Where a lock key stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, EnumIter, DeriveActiveEnum)]
#[sea_orm(rs_type = "String", db_type = "String(StringLen::N(16))")]
pub enum LockState {
    #[sea_orm(string_value = "LOCKED")]
    Locked,
    #[sea_orm(string_value = "REJECTED")]
    Rejected,
    #[sea_orm(string_value = "REVERSED")]
    Reversed,
    #[sea_orm(string_value = "TOMBSTONED")]
    Tombstoned,
}

/// What a ledger entry records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, EnumIter, DeriveActiveEnum)]
#[sea_orm(rs_type = "String", db_type = "String(StringLen::N(16))")]
pub enum LedgerKind {
    #[sea_orm(string_value = "LOCK")]
    Lock,
    #[sea_orm(string_value = "REJECT")]
    Reject,
    #[sea_orm(string_value = "REVERSE")]
    Reverse,
    #[sea_orm(string_value = "TOMBSTONE")]
    Tombstone,
}

/// Stock available per SKU. A SKU is known exactly when it has a row.
pub mod stock {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "wms_stock")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false, column_type = "String(StringLen::N(128))")]
        pub sku: String,
        pub available: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

/// One row per lock key: the caller's request id, or in legacy mode a key the WMS made up.
/// The primary key is what makes a concurrent repeat unable to apply twice at the database.
pub mod lock {
    use sea_orm::entity::prelude::*;

    use super::LockState;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "wms_lock")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false, column_type = "String(StringLen::N(160))")]
        pub lock_key: String,
        /// The caller's request id, also in legacy mode (where it identifies nothing).
        #[sea_orm(indexed, column_type = "String(StringLen::N(128))")]
        pub request_id: String,
        #[sea_orm(column_type = "String(StringLen::N(128))")]
        pub order_no: String,
        pub state: LockState,
        /// The WMS's own id of the lock (`LCK` + ledger sequence); empty when nothing was locked.
        #[sea_orm(column_type = "String(StringLen::N(32))")]
        pub lock_id: String,
        #[sea_orm(column_type = "Text")]
        pub reason: String,
        #[sea_orm(column_type = "String(StringLen::N(128))")]
        pub voucher: String,
        /// JSON list of [`super::Line`].
        #[sea_orm(column_type = "Text")]
        pub lines: String,
        /// Sequence of the ledger entry that created the row; orders rows of one request id.
        pub created_seq: i64,
        /// When the row was created (lock, rejection or tombstone), by the WMS's clock.
        pub created_at_ms: i64,
        pub updated_at_ms: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

/// The append-only ledger: every lock, rejection, reversal and tombstone, by sequence.
pub mod ledger {
    use sea_orm::entity::prelude::*;

    use super::LedgerKind;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "wms_ledger")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub seq: i64,
        pub kind: LedgerKind,
        /// Indexed: a reconciliation lists the entries of a few request ids.
        #[sea_orm(indexed, column_type = "String(StringLen::N(128))")]
        pub request_id: String,
        #[sea_orm(column_type = "String(StringLen::N(32))")]
        pub lock_id: String,
        #[sea_orm(column_type = "String(StringLen::N(128))")]
        pub order_no: String,
        /// JSON list of [`super::Line`].
        #[sea_orm(column_type = "Text")]
        pub lines: String,
        pub at_ms: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}
