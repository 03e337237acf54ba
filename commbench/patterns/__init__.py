"""Communication patterns of large-model training, one per file, each with an oracle, a naive and
an optimized distributed implementation, and its predicted bytes."""
