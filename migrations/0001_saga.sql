-- The intermediate-state table: one row per biz_id, the durable record of how far a message got.
-- Written only by conditional UPDATEs (compare-and-set on version and lease_epoch): no lock is
-- ever held across a downstream call. All times are milliseconds since the Unix epoch by the
-- DATABASE's clock (lease comparisons happen inside the statements, never in a worker).
CREATE TABLE saga (
  -- Identity and provenance
  biz_id                VARCHAR(320) NOT NULL,  -- idempotency key: order_no ':' event_type (poison: 'parked:' topic ':' partition ':' offset)
  order_no              VARCHAR(64)  NOT NULL,  -- sagas of one order run one at a time, in offset order
  event_type            VARCHAR(32)  NOT NULL,  -- e.g. PAID
  src_topic             VARCHAR(249) NOT NULL,  -- where the message came from ...
  src_partition         INT          NOT NULL,
  src_offset            BIGINT       NOT NULL,  -- ... so it can be traced back and ordered
  payload               MEDIUMTEXT   NOT NULL,  -- the message as received (JSON): resume without Kafka
  -- Progress
  status                VARCHAR(24)  NOT NULL,  -- RECEIVED, DB_WRITTEN, WMS_REQUESTED, WMS_CONFIRMED, LOGISTICS_REQUESTED, LOGISTICS_CONFIRMED, DONE, LOGISTICS_CANCELLING, WMS_REVERSING, ROLLED_BACK, MANUAL_REVIEW, PARKED
  version               BIGINT       NOT NULL,  -- bumped by every change, and every UPDATE names the version it read
  wms_request_id        VARCHAR(64)  NULL,      -- deterministic from biz_id: the key WMS deduplicates, is queried and reversed by
  wms_voucher           VARCHAR(80)  NULL,      -- reversal voucher, stored with the intent BEFORE LockStock is sent, and sent with it
  wms_locked_at_ms      BIGINT       NULL,      -- when the lock was confirmed: starts its reversal window
  logistics_request_id  VARCHAR(64)  NULL,      -- deterministic from biz_id, like wms_request_id
  logistics_voucher     VARCHAR(80)  NULL,      -- cancel voucher, stored before CreateShipment is sent
  tracking_no           VARCHAR(64)  NULL,      -- the point of no return: once set, forward only
  intent_at_ms          BIGINT       NULL,      -- when the current *_REQUESTED / compensation intent was recorded (in-flight window)
  attempts              INT          NOT NULL,  -- failed attempts at the current step (reset on progress)
  next_attempt_at_ms    BIGINT       NOT NULL,  -- recovery leaves the row alone before this (backoff)
  last_error            VARCHAR(1024) NULL,     -- why the last attempt failed, or why the saga stopped
  deadline_ms           BIGINT       NOT NULL,  -- after this no new step starts: roll back while everything done is reversible
  -- Ownership
  owner_id              VARCHAR(128) NULL,      -- process holding (or last holding) the lease
  lease_epoch           BIGINT       NOT NULL,  -- fencing token: bumped by every takeover, and transitions must name it
  lease_until_ms        BIGINT       NOT NULL,  -- lease is live while the database clock is below this
  -- Observability and bookkeeping
  trace_context         VARCHAR(256) NULL,      -- W3C traceparent of the message: every actor's spans join one trace
  created_at_ms         BIGINT       NOT NULL,
  updated_at_ms         BIGINT       NOT NULL,
  PRIMARY KEY (biz_id)
);

-- Recovery scan: non-terminal rows whose lease expired (an IN list of statuses, then a range on the lease).
CREATE INDEX saga_recovery ON saga (status, lease_until_ms);

-- Per-order ordering: is there an earlier unfinished saga of this order on this partition?
CREATE INDEX saga_order ON saga (order_no, src_partition, src_offset);
