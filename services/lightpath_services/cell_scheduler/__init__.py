"""cell_scheduler: the single entry point for job systems; picks a superpod (CS-1 … CS-6)."""
