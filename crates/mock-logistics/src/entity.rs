//! The logistics provider's books as database tables: one row per request id, and the
//! append-only ledger that reconciliation reads. States are stored as words for auditors.

use sea_orm::entity::prelude::*;

/// Where a shipment request stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, EnumIter, DeriveActiveEnum)]
#[sea_orm(rs_type = "String", db_type = "String(StringLen::N(16))")]
pub enum ShipmentState {
    #[sea_orm(string_value = "CREATED")]
    Created,
    #[sea_orm(string_value = "REJECTED")]
    Rejected,
    #[sea_orm(string_value = "CANCELLED")]
    Cancelled,
    #[sea_orm(string_value = "TOMBSTONED")]
    Tombstoned,
}

/// What a ledger entry records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, EnumIter, DeriveActiveEnum)]
#[sea_orm(rs_type = "String", db_type = "String(StringLen::N(16))")]
pub enum LedgerKind {
    #[sea_orm(string_value = "CREATE")]
    Create,
    #[sea_orm(string_value = "REJECT")]
    Reject,
    #[sea_orm(string_value = "CANCEL")]
    Cancel,
    #[sea_orm(string_value = "TOMBSTONE")]
    Tombstone,
}

/// One row per caller request id; the primary key is what stops a concurrent repeat from
/// creating a second shipment at the database.
pub mod shipment {
    use sea_orm::entity::prelude::*;

    use super::ShipmentState;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "logistics_shipment")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false, column_type = "String(StringLen::N(128))")]
        pub request_id: String,
        #[sea_orm(column_type = "String(StringLen::N(128))")]
        pub order_no: String,
        pub state: ShipmentState,
        /// `TRK` + ledger sequence; empty when no shipment was created.
        #[sea_orm(column_type = "String(StringLen::N(32))")]
        pub tracking_no: String,
        #[sea_orm(column_type = "Text")]
        pub reason: String,
        #[sea_orm(column_type = "String(StringLen::N(128))")]
        pub voucher: String,
        #[sea_orm(column_type = "String(StringLen::N(128))")]
        pub region: String,
        /// When the row was created, by the provider's clock; pickup is measured from here.
        pub created_at_ms: i64,
        pub updated_at_ms: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

/// The append-only ledger: every creation, rejection, cancellation and tombstone, by sequence.
pub mod ledger {
    use sea_orm::entity::prelude::*;

    use super::LedgerKind;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "logistics_ledger")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub seq: i64,
        pub kind: LedgerKind,
        /// Indexed: a reconciliation lists the entries of a few request ids.
        #[sea_orm(indexed, column_type = "String(StringLen::N(128))")]
        pub request_id: String,
        #[sea_orm(column_type = "String(StringLen::N(32))")]
        pub tracking_no: String,
        #[sea_orm(column_type = "String(StringLen::N(128))")]
        pub order_no: String,
        pub at_ms: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}
