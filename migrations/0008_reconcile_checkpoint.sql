-- Where the periodic reconciliation got to, so each pass reads only what changed since the last
-- one: the sequence numbers of the two downstream ledgers it had read up to, and the database
-- time it began (sagas finished since then are judged by the next pass). One row per name.
-- Several recovery workers share it, and each advance is a compare-and-set on the values the
-- pass started from, so two passes racing judge some effects twice and skip none.
CREATE TABLE reconcile_checkpoint (
  name           VARCHAR(32) NOT NULL,
  wms_seq        BIGINT      NOT NULL,  -- entries with a higher seq are not yet read
  logistics_seq  BIGINT      NOT NULL,
  since_ms       BIGINT      NOT NULL,  -- sagas finished (last written) from this time on are not yet judged
  updated_at_ms  BIGINT      NOT NULL,
  PRIMARY KEY (name)
);
