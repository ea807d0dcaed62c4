-- Reconciliation maps a downstream ledger entry to its saga by our request id. The ids are
-- one-way hashes of biz_id + step, so the only way back is an index on the stored columns.
-- Both columns are written once (with the intent) and never change, so these indexes cost
-- one insert each per saga, not one per transition.
CREATE INDEX saga_wms_request ON saga (wms_request_id);

CREATE INDEX saga_logistics_request ON saga (logistics_request_id);
