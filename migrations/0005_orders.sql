-- The business table (step 1): the order's status transition. The unique biz_id is the index
-- the user already had: here it backs the business write up, the saga row is the real guard.
CREATE TABLE orders (
  biz_id        VARCHAR(320) NOT NULL,
  order_no      VARCHAR(64)  NOT NULL,
  event_type    VARCHAR(32)  NOT NULL,
  status        VARCHAR(16)  NOT NULL,  -- FULFILLING (step 1 written), SHIPPED (DONE), REVERSED (rolled back)
  amount_cents  BIGINT       NOT NULL,
  tracking_no   VARCHAR(64)  NULL,
  created_at_ms BIGINT       NOT NULL,
  updated_at_ms BIGINT       NOT NULL,
  PRIMARY KEY (biz_id)
);

CREATE INDEX orders_order_no ON orders (order_no);
