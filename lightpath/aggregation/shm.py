"""Shared memory between aggregation peers on one host (the data path's SHM transport).

NCCL moves bytes between GPUs of one node through shared memory rather than
its network transport; the aggregation tree does the same between processes
of one host. Chunks still travel as AggChunk messages over gRPC, but between
co-located peers a message names a buffer (`ShmRef`: segment, offset, bytes)
instead of carrying the elements, so a 4 MiB chunk costs one small message
and no copy. Partials, results and the timeout aggregation node's work are
computed into buffers that themselves live in shared memory, so they travel
by reference too.

One `ShmDomain` per switch process or compute node owns:

* `lpagg-<id>.owner`, a file it holds an flock on for as long as it lives. A
  domain whose lock is free belongs to a process that died: `sweep` (run by
  every domain that starts) unlinks all of its files.
* `lpagg-<id>.probe`, random bytes a peer must read to prove it sees the same
  memory (`verify`): same host id and the probe opens and matches.
* `lpagg-<id>-<n>`, its buffers, pooled by size: `lease` hands one out,
  `release` takes it back for reuse (its readers are done), `discard` unlinks
  it for good (readers that mapped it keep their mapping; nobody reuses it).
  Free buffers unused for `idle_s` are unlinked by `trim`; `close` unlinks all.
* mappings of peers' buffers (`view`), cached by name, read-only, dropped by
  `trim` once their segment is gone.

Names never repeat, so a cached mapping never aliases another buffer. Who
may reuse a buffer when is decided by the users of a domain (the switch's
`lightpath_services.agg_switch.transport`, the SDK in `lightpath.aggregation.node`).

Linux only (/dev/shm); elsewhere `ShmDomain.create` returns None and peers
use the bytes path.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import fcntl
import logging
import mmap
import os
import re
import secrets
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np


log = logging.getLogger("lightpath.aggregation.shm")

SHM_DIR = Path("/dev/shm")
PREFIX = "lpagg-"
_ID = re.compile(r"^lpagg-([0-9a-f]{16})")
SEGMENT_NAME = re.compile(r"^lpagg-[0-9a-f]{16}-[0-9]{1,12}$")
PROBE_NAME = re.compile(r"^lpagg-[0-9a-f]{16}\.probe$")
MIN_SEGMENT = 1 << 12
# A half-created domain (`.init`, not yet renamed to `.owner`) younger than
# this is left alone by sweeps.
INIT_GRACE_S = 60.0
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
# A reader never reads a buffer it was sent by reference later than the
# command's deadline plus READ_MARGIN_S; an owner whose readers never said
# they are done unlinks the buffer (never reuses it) at the deadline plus
# DISCARD_AFTER_S.
READ_MARGIN_S = 5.0
DISCARD_AFTER_S = 10.0


class ShmError(ValueError):
    """A shared-memory reference that cannot be read (bad name, gone, out of range)."""


def host_identity(shm_dir: Path = SHM_DIR) -> str:
    """What co-located processes share: the boot and the shm filesystem."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = "unknown-boot"
    return f"{boot}/{os.stat(shm_dir).st_dev}"


def _address(buf: mmap.mmap) -> int:
    import numpy as np

    return int(np.frombuffer(buf, np.uint8).__array_interface__["data"][0])


def _size_class(nbytes: int) -> int:
    return max(MIN_SEGMENT, 1 << max(0, nbytes - 1).bit_length())


@dataclass(frozen=True)
class Hello:
    """A domain's offer (the proto's ShmHello)."""

    host: str
    probe: str
    token: str
    min_bytes: int = 0


@dataclass(eq=False)
class Segment:
    name: str
    size: int
    buf: mmap.mmap
    address: int
    writable: bool
    last_used: float = field(default_factory=time.monotonic)


@dataclass(eq=False)
class Lease:
    """One pooled buffer handed out; `refs` counts who still needs it (the user's business)."""

    segment: Segment
    nbytes: int
    refs: int = 1

    def array(self, count: int, dtype: np.dtype) -> np.ndarray:
        import numpy as np

        return np.frombuffer(self.segment.buf, dtype=dtype, count=count)


class ShmDomain:
    """This process's (or this switch's) shared memory; see the module docstring."""

    def __init__(self, shm_dir: Path, idle_s: float):
        self.dir = shm_dir
        self.idle_s = idle_s
        self.id = secrets.token_hex(8)
        self.prefix = f"{PREFIX}{self.id}"
        self.host = host_identity(shm_dir)
        self._counter = 0
        self._free: dict[int, list[Segment]] = {}
        self._leased: dict[int, Lease] = {}  # id(segment) → lease
        self._mapped: dict[str, Segment] = {}  # peers' segments, by name
        self._owned: dict[str, Segment] = {}
        self._starts: list[int] = []  # sorted addresses of every segment we can locate
        self._by_start: dict[int, Segment] = {}
        self._closed = False
        init = shm_dir / f"{self.prefix}.init"
        fd = os.open(init, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(init, shm_dir / f"{self.prefix}.owner")  # atomic: locked before sweeps see it
        self._owner_fd = fd
        # Unlinks whatever is left should the domain be dropped or the interpreter
        # exit without `close` (a crash is the sweep's business).
        self._finalizer = weakref.finalize(self, _remove_domain, shm_dir, self.prefix, fd)
        self._token = secrets.token_bytes(16)
        probe = os.open(
            shm_dir / f"{self.prefix}.probe", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600
        )
        try:
            os.write(probe, self._token)
        finally:
            os.close(probe)

    @classmethod
    def create(cls, *, idle_s: float = 30.0, shm_dir: Path = SHM_DIR) -> ShmDomain | None:
        """A new domain (after sweeping dead ones), or None where shared memory is unusable."""
        try:
            sweep(shm_dir)
            return cls(shm_dir, idle_s)
        except OSError as exc:
            log.warning("shared memory unavailable (%s): the bytes path only", exc)
            return None

    # -- co-location -------------------------------------------------------------

    def hello(self, min_bytes: int = 0) -> Hello:
        return Hello(self.host, f"{self.prefix}.probe", self._token.hex(), min_bytes)

    def verify(self, peer: Hello) -> bool:
        """Whether `peer` shares this host's shared memory: same host id, and its
        probe opens here and holds its token."""
        if self._closed or peer.host != self.host or not PROBE_NAME.match(peer.probe):
            return False
        try:
            return (self.dir / peer.probe).read_bytes() == bytes.fromhex(peer.token)
        except (OSError, ValueError):
            return False

    # -- own buffers -------------------------------------------------------------

    def lease(self, nbytes: int) -> Lease:
        """A buffer of at least `nbytes`, from the pool or new."""
        size = _size_class(nbytes)
        free = self._free.get(size)
        seg = free.pop() if free else self._new_segment(size)
        seg.last_used = time.monotonic()
        lease = Lease(seg, nbytes)
        self._leased[id(seg)] = lease
        return lease

    def release(self, lease: Lease) -> None:
        """Back to the pool: every reader of it is done."""
        seg = lease.segment
        if self._leased.pop(id(seg), None) is None:
            return
        if self._closed:
            self._unlink(seg)
            return
        seg.last_used = time.monotonic()
        self._free.setdefault(seg.size, []).append(seg)

    def discard(self, lease: Lease) -> None:
        """Unlink for good: whoever mapped it keeps reading it, nobody reuses it."""
        if self._leased.pop(id(lease.segment), None) is not None:
            self._unlink(lease.segment)

    def buffer(self, nbytes: int) -> Segment:
        """A buffer outside the pool (a compute node's own vector), unlinked by `close`."""
        seg = self._new_segment(_size_class(nbytes))
        return seg

    def _new_segment(self, size: int) -> Segment:
        if self._closed:
            raise ShmError("the shared-memory domain is closed")
        self._counter += 1
        name = f"{self.prefix}-{self._counter}"
        fd = os.open(self.dir / name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, size)
            buf = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | _POPULATE)
        except OSError:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(self.dir / name)
            raise
        os.close(fd)
        seg = Segment(name, size, buf, _address(buf), writable=True)
        self._owned[name] = seg
        self._index(seg)
        return seg

    def _unlink(self, seg: Segment) -> None:
        self._owned.pop(seg.name, None)
        self._unindex(seg)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.dir / seg.name)
        # The mapping goes when the last array over it does (closing it under
        # a live numpy view would fail).

    # -- peers' buffers ------------------------------------------------------------

    def view(self, name: str, offset: int, nbytes: int) -> memoryview:
        """Read-only bytes of a peer's (or our own) buffer."""
        seg = self._owned.get(name) or self._mapped.get(name)
        if seg is None:
            seg = self._map(name)
        if offset < 0 or nbytes < 0 or offset + nbytes > seg.size:
            raise ShmError(f"{name}: bytes {offset}..{offset + nbytes} outside its {seg.size}")
        seg.last_used = time.monotonic()
        mv = memoryview(seg.buf)[offset : offset + nbytes]
        return mv if not seg.writable else mv.toreadonly()

    def _map(self, name: str) -> Segment:
        if not SEGMENT_NAME.match(name):
            raise ShmError(f"{name!r} is not a shared-memory buffer name")
        try:
            fd = os.open(self.dir / name, os.O_RDONLY)
        except OSError as exc:
            raise ShmError(f"{name}: {os.strerror(exc.errno or errno.EIO)}") from None
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                raise ShmError(f"{name}: empty")
            buf = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | _POPULATE, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        seg = Segment(name, size, buf, _address(buf), writable=False)
        self._mapped[name] = seg
        self._index(seg)
        return seg

    # -- where an array lives ----------------------------------------------------------

    def _index(self, seg: Segment) -> None:
        bisect.insort(self._starts, seg.address)
        self._by_start[seg.address] = seg

    def _unindex(self, seg: Segment) -> None:
        if self._by_start.get(seg.address) is seg:
            del self._by_start[seg.address]
            i = bisect.bisect_left(self._starts, seg.address)
            if i < len(self._starts) and self._starts[i] == seg.address:
                del self._starts[i]

    def locate(self, arr: np.ndarray) -> tuple[Segment, int] | None:
        """(segment, offset) when `arr` is a contiguous array inside a buffer this
        domain owns or has mapped, else None."""
        if not arr.flags.c_contiguous or arr.nbytes == 0:
            return None
        addr = int(arr.__array_interface__["data"][0])
        i = bisect.bisect_right(self._starts, addr) - 1
        if i < 0:
            return None
        seg = self._by_start[self._starts[i]]
        offset = addr - seg.address
        if offset + arr.nbytes > seg.size:
            return None
        return seg, offset

    def lease_of(self, arr: np.ndarray) -> Lease | None:
        """The lease `arr` lies in, if it lies in one of ours."""
        found = self.locate(arr)
        return None if found is None else self._leased.get(id(found[0]))

    # -- housekeeping ----------------------------------------------------------------

    @property
    def leased(self) -> int:
        return len(self._leased)

    @property
    def pooled(self) -> int:
        return sum(len(v) for v in self._free.values())

    def trim(self, now: float | None = None) -> None:
        """Unlink free buffers idle for `idle_s`; forget mappings of buffers that are gone."""
        now = time.monotonic() if now is None else now
        for size, free in list(self._free.items()):
            keep = [s for s in free if now - s.last_used < self.idle_s]
            for seg in free:
                if now - seg.last_used >= self.idle_s:
                    self._unlink(seg)
            if keep:
                self._free[size] = keep
            else:
                del self._free[size]
        for name, seg in list(self._mapped.items()):
            if now - seg.last_used >= self.idle_s or not (self.dir / name).exists():
                del self._mapped[name]
                self._unindex(seg)

    def close(self) -> None:
        """Unlink every file of this domain (at shutdown)."""
        if self._closed:
            return
        self._closed = True
        for seg in list(self._owned.values()):
            self._unlink(seg)
        self._free.clear()
        self._mapped.clear()
        self._finalizer()

    def files(self) -> list[str]:
        """This domain's files in the shm directory (tests, operators)."""
        return sorted(p.name for p in self.dir.glob(f"{self.prefix}*"))


def _remove_domain(shm_dir: Path, prefix: str, owner_fd: int) -> None:
    """Unlink a domain's files, the owner file last, then let go of its lock."""
    names = sorted((p.name for p in shm_dir.glob(f"{prefix}*")), key=lambda n: n.endswith(".owner"))
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(shm_dir / name)
    with contextlib.suppress(OSError):
        os.close(owner_fd)


def sweep(shm_dir: Path = SHM_DIR) -> list[str]:
    """Unlink the files of domains whose owner died (its lock is free). Returns them."""
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return []
    groups: dict[str, list[str]] = {}
    for name in names:
        m = _ID.match(name)
        if m:
            groups.setdefault(m.group(0), []).append(name)
    removed: list[str] = []
    now = time.time()
    for prefix, files in groups.items():
        owner = shm_dir / f"{prefix}.owner"
        if f"{prefix}.init" in files:
            with contextlib.suppress(OSError):
                if now - os.stat(shm_dir / f"{prefix}.init").st_mtime < INIT_GRACE_S:
                    continue
        fd = None
        try:
            if owner.exists():
                fd = os.open(owner, os.O_RDONLY)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # alive
            for name in sorted(files, key=lambda n: n.endswith(".owner")):  # the owner file last
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(shm_dir / name)
                    removed.append(name)
        except OSError as exc:
            log.warning("could not sweep %s: %s", prefix, exc)
        finally:
            if fd is not None:
                os.close(fd)
    if removed:
        log.info("swept %d shared-memory files of dead processes", len(removed))
    return removed


__all__ = [
    "DISCARD_AFTER_S",
    "READ_MARGIN_S",
    "Hello",
    "Lease",
    "Segment",
    "ShmDomain",
    "ShmError",
    "host_identity",
    "sweep",
]
