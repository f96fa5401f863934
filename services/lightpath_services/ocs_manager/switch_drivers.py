"""Building the southbound driver of a pod's switches from the settings (issue 34).

Each switch gets what LIGHTPATH_OCS_SWITCHES (then LIGHTPATH_OCS_SWITCH_AGENTS) says:
a gRPC stub to a switch agent (one channel per address), or an in-process device
switch speaking the device's own interface (sonic_driver.SonicSwitch,
netconf_driver.NetconfSwitch). All go into one AgentSwitchDriver, so batching,
rollback, fail-static and reconcile are the same whatever drives a switch.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
from pathlib import Path
from typing import Any

from lightpath.domain.southbound import devices
from lightpath.domain.torus import Fabric
from lightpath.security.identity import service_principal
from lightpath.v1 import optical_switch_pb2_grpc
from lightpath_services.common.server import Runtime
from lightpath_services.ocs_manager.agent_driver import AgentSwitchDriver
from lightpath_services.ocs_manager.device_switch import DeviceSwitch
from lightpath_services.ocs_manager.netconf_driver import NetconfCredentials, NetconfSwitch
from lightpath_services.ocs_manager.settings import OcsManagerSettings
from lightpath_services.ocs_manager.sonic_driver import SonicSwitch
from lightpath_services.ocs_manager.switch_map import entry_of


def switch_driver(runtime: Runtime[OcsManagerSettings], fabric: Fabric) -> AgentSwitchDriver:
    """The driver of switches behind agents or their own management interfaces (issue 34):
    one channel per agent address (this service's own credentials), an in-process device
    switch per SONiC / NETCONF switch, by LIGHTPATH_OCS_SWITCHES / _SWITCH_AGENTS."""
    s = runtime.settings
    entries = s.switch_entries
    channels: dict[str, optical_switch_pb2_grpc.OpticalSwitchStub] = {}
    stubs: dict[str, Any] = {}
    devs = devices(fabric)
    found = [(d, entry_of(entries, d.id)) for d in devs]
    netconf = [d for d, e in found if e is not None and e.scheme == "netconf"]
    pool = (
        concurrent.futures.ThreadPoolExecutor(len(netconf), thread_name_prefix="netconf")
        if netconf
        else None
    )
    device_switches: list[DeviceSwitch] = []
    for d, e in found:
        assert e is not None  # settings checked every switch has one
        if e.scheme == "agent":
            if e.address not in channels:
                channels[e.address] = optical_switch_pb2_grpc.OpticalSwitchStub(
                    runtime.channel(
                        e.address,
                        max_attempts=1,
                        default_timeout=s.switch_timeout_s,
                        # Only this pod's switch agent may be read and programmed.
                        expect=service_principal("switch_agent", s.pod_id),
                    )
                )
            stubs[d.id] = channels[e.address]
            continue
        sw: DeviceSwitch
        if e.scheme == "sonic":
            sw = SonicSwitch(fabric, d, e.for_switch(d.id), settle_timeout_s=s.switch_timeout_s)
        else:
            creds = NetconfCredentials(
                password=(
                    Path(s.netconf_password_file).read_text().strip()
                    if s.netconf_password_file
                    else None
                ),
                key_file=s.netconf_key_file or None,
                known_hosts=s.netconf_known_hosts or None,
            )
            sw = NetconfSwitch(
                fabric,
                d,
                e.for_switch(d.id),
                creds,
                executor=pool,
                settle_timeout_s=s.switch_timeout_s,
            )
        stubs[d.id] = sw
        device_switches.append(sw)

    async def close() -> None:
        for sw in device_switches:
            with contextlib.suppress(Exception):
                await sw.close()
        if pool is not None:
            pool.shutdown(wait=False)

    if device_switches:
        runtime.on_stop(close)
    return AgentSwitchDriver(fabric, stubs, timeout_s=s.switch_timeout_s)
