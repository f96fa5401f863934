"""agg_switch: one switch of an in-network aggregation tree with timeouts and bypass entries (AG-1 … AG-14)."""
