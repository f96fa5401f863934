"""Emulators of real optical switches' management interfaces, for tests and benchmarks
(issue 34): SONiC's OCS orchagent on a real redis-server (sonic.py) and a Polatis-style
NETCONF server over SSH (polatis.py). Both settle batches with the reference agent's
switch model (lightpath.domain.switch_timing.SwitchTiming)."""
