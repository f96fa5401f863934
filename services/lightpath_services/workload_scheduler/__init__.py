"""workload_scheduler: one per superpod; places slices on healthy free building blocks (WS-1 … WS-10)."""
