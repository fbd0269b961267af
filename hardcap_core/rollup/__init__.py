"""Usage records into the durable ledger: stream reading, DynamoDB writes, CloudWatch metrics,
and counters restored after the cache lost them."""
