"""The control plane: the live configuration in DynamoDB, the admin API over it, and how a
running gateway learns of a change without a read per request."""
