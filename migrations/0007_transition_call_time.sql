-- How long the downstream call whose answer a transition records took, as the caller measured
-- it (request sent to answer received, in milliseconds, NULL when the transition follows no
-- call). With it the timeline separates the downstream's time from our own: a saga's time
-- from arrival to DONE minus the sum of this column is what midflight itself added.
ALTER TABLE saga_transition ADD COLUMN call_ms BIGINT NULL;
