-- Sagas automation stopped on, with the evidence a person needs. One per (biz_id, step):
-- a retry that reaches the same decision does not open a second ticket.
CREATE TABLE manual_ticket (
  biz_id         VARCHAR(320) NOT NULL,
  step           VARCHAR(16)  NOT NULL,  -- WMS or LOGISTICS (which downstream needs a person), or SAGA
  state          VARCHAR(16)  NOT NULL,  -- OPEN or RESOLVED
  reason         VARCHAR(1024) NOT NULL, -- what a person must decide
  evidence       MEDIUMTEXT   NOT NULL,  -- JSON: the saga row, its transition log, the downstream's answer, the voucher
  opened_by      VARCHAR(160) NOT NULL,
  opened_at_ms   BIGINT       NOT NULL,
  resolved_by    VARCHAR(160) NULL,
  resolved_at_ms BIGINT       NULL,
  resolution     VARCHAR(1024) NULL,     -- the operator's note
  PRIMARY KEY (biz_id, step)
);

CREATE INDEX manual_ticket_state ON manual_ticket (state, opened_at_ms);
