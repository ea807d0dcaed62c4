-- Transactional outbox for step 4: the notification row is written in the same transaction as
-- DONE, and a relay publishes it to Kafka afterwards. One notification per saga.
CREATE TABLE outbox (
  biz_id          VARCHAR(320) NOT NULL,
  payload         MEDIUMTEXT   NOT NULL,  -- JSON notification (the relay's configuration names the topic)
  trace_context   VARCHAR(256) NULL,
  created_at_ms   BIGINT       NOT NULL,
  relay_owner     VARCHAR(128) NULL,      -- relay instance that claimed the row (several may run)
  relay_until_ms  BIGINT       NOT NULL,  -- the claim is live while the database clock is below this
  published_at_ms BIGINT       NULL,      -- set once the broker acknowledged the message
  PRIMARY KEY (biz_id)
);

CREATE INDEX outbox_pending ON outbox (published_at_ms, created_at_ms);
