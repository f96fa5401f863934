"""Issue 30: the local stack's service logs are readable by their owner only (0600),
as the audit logs are: they name callers, jobs and errors."""

from __future__ import annotations

import stat

from lightpath.paths import open_private_append


def test_a_service_log_is_owner_only_also_when_it_was_not(tmp_path):
    fresh = tmp_path / "cell.log"
    with open_private_append(fresh) as f:
        f.write(b"one\n")
    old = tmp_path / "ws.log"
    old.write_bytes(b"kept\n")
    old.chmod(0o644)  # as an older release left it
    with open_private_append(old) as f:
        f.write(b"two\n")
    for path in (fresh, old):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert old.read_bytes() == b"kept\ntwo\n"  # appended, not truncated
