//! sea-orm entities, one per table of `migrations/`. They are the store's private view of
//! the rows; the rest of the system sees `midflight_model` types.

pub mod saga {
    use sea_orm::entity::prelude::*;
    use serde::Serialize;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, Serialize)]
    #[sea_orm(table_name = "saga")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub biz_id: String,
        pub order_no: String,
        pub event_type: String,
        pub src_topic: String,
        pub src_partition: i32,
        pub src_offset: i64,
        pub payload: String,
        pub status: String,
        pub version: i64,
        pub wms_request_id: Option<String>,
        pub wms_voucher: Option<String>,
        pub wms_locked_at_ms: Option<i64>,
        pub logistics_request_id: Option<String>,
        pub logistics_voucher: Option<String>,
        pub tracking_no: Option<String>,
        pub intent_at_ms: Option<i64>,
        pub attempts: i32,
        pub next_attempt_at_ms: i64,
        pub last_error: Option<String>,
        pub deadline_ms: i64,
        pub owner_id: Option<String>,
        pub lease_epoch: i64,
        pub lease_until_ms: i64,
        pub trace_context: Option<String>,
        pub created_at_ms: i64,
        pub updated_at_ms: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod saga_transition {
    use sea_orm::entity::prelude::*;
    use serde::Serialize;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, Serialize)]
    #[sea_orm(table_name = "saga_transition")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub biz_id: String,
        #[sea_orm(primary_key, auto_increment = false)]
        pub version: i64,
        pub from_status: Option<String>,
        pub to_status: String,
        pub lease_epoch: i64,
        pub actor: String,
        pub reason: String,
        pub at_ms: i64,
        /// Duration of the downstream call this transition records the answer of (migration 0007).
        pub call_ms: Option<i64>,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod manual_ticket {
    use sea_orm::entity::prelude::*;
    use serde::Serialize;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, Serialize)]
    #[sea_orm(table_name = "manual_ticket")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub biz_id: String,
        #[sea_orm(primary_key, auto_increment = false)]
        pub step: String,
        pub state: String,
        pub reason: String,
        pub evidence: String,
        pub opened_by: String,
        pub opened_at_ms: i64,
        pub resolved_by: Option<String>,
        pub resolved_at_ms: Option<i64>,
        pub resolution: Option<String>,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod outbox {
    use sea_orm::entity::prelude::*;
    use serde::Serialize;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, Serialize)]
    #[sea_orm(table_name = "outbox")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub biz_id: String,
        pub payload: String,
        pub trace_context: Option<String>,
        pub created_at_ms: i64,
        pub relay_owner: Option<String>,
        pub relay_until_ms: i64,
        pub published_at_ms: Option<i64>,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod orders {
    use sea_orm::entity::prelude::*;
    use serde::Serialize;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, Serialize)]
    #[sea_orm(table_name = "orders")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub biz_id: String,
        pub order_no: String,
        pub event_type: String,
        pub status: String,
        pub amount_cents: i64,
        pub tracking_no: Option<String>,
        pub created_at_ms: i64,
        pub updated_at_ms: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}
