"""The run's trail: the hash-chained event log, its anchor, the snapshot, and the checks that read them."""
