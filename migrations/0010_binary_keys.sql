-- engine: mysql
-- Identifiers compare byte for byte, as SQLite compares them already (this file is applied
-- there as a no-op). MySQL's and MariaDB's default collations compare text without case (MySQL
-- 8's also without accents), so the orders AB-1 and ab-1 had one primary key: the second's row
-- was never written, and its batch failed at every try, holding its partition. Every column
-- that names a saga, an order, a topic, a request or an owner, in every table, changes at once:
-- columns of two collations cannot be compared with each other. Each table is copied: on a
-- database with rows, writes wait for the copy (run it in a quiet hour). utf8mb4_bin still
-- ignores trailing spaces, which no identifier may contain.
ALTER TABLE saga
  MODIFY biz_id               VARCHAR(320) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  MODIFY order_no             VARCHAR(64)  CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  MODIFY src_topic            VARCHAR(249) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  MODIFY wms_request_id       VARCHAR(64)  CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
  MODIFY logistics_request_id VARCHAR(64)  CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
  MODIFY owner_id             VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL;
ALTER TABLE saga_transition
  MODIFY biz_id VARCHAR(320) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL;
ALTER TABLE manual_ticket
  MODIFY biz_id VARCHAR(320) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL;
ALTER TABLE outbox
  MODIFY biz_id      VARCHAR(320) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  MODIFY relay_owner VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL;
ALTER TABLE orders
  MODIFY biz_id   VARCHAR(320) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  MODIFY order_no VARCHAR(64)  CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL;
