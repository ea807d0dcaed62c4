-- What the pass that set a reconciliation checkpoint read of the stretch of each ledger just
-- behind it, as its reconciler wrote it (where the stretch starts, and the sequence numbers in
-- it that it did not see). The next pass, whichever process runs it, reads that stretch again
-- and judges only the entries that have appeared since: a downstream that numbers an entry
-- when its write begins shows it when the write commits, possibly after later entries. NULL
-- when unknown (a checkpoint written before this column, or too many unseen numbers to keep):
-- the next pass then judges the whole stretch again.
ALTER TABLE reconcile_checkpoint ADD COLUMN wms_unseen MEDIUMTEXT NULL;
ALTER TABLE reconcile_checkpoint ADD COLUMN logistics_unseen MEDIUMTEXT NULL;
