-- Append-only log of every transition and takeover: the timeline operators and the invariant
-- checker read. Written in the same transaction as the saga UPDATE it records.
CREATE TABLE saga_transition (
  biz_id        VARCHAR(320) NOT NULL,
  version       BIGINT       NOT NULL,  -- the saga's version after this transition (unique per saga)
  from_status   VARCHAR(24)  NULL,      -- NULL for the row's arrival
  to_status     VARCHAR(24)  NOT NULL,  -- equal to from_status for a takeover
  lease_epoch   BIGINT       NOT NULL,  -- epoch of the actor that wrote it
  actor         VARCHAR(160) NOT NULL,  -- consumer:<id>, recovery:<id>, operator:<name>
  reason        VARCHAR(512) NOT NULL,
  at_ms         BIGINT       NOT NULL,  -- database clock
  PRIMARY KEY (biz_id, version)
);
