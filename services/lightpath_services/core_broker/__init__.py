"""core_broker: accelerator cores as a service by time-windowed reservations (CB-1 … CB-9) and graph plans (GF-1 … GF-7)."""
