"""Signed-in viewers. The bearer token a viewer signs in with stays here, in memory, under
a random session id; the browser holds only that id, in an HttpOnly, Secure,
SameSite=Strict cookie. A session ends on sign-out, after `ttl_s` without use, when the
console restarts, or as soon as a service answers UNAUTHENTICATED to its token (revoked)."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from lightpath_services.console.backends import Viewer

COOKIE = "lightpath_console"
MAX_SESSIONS = 10_000


@dataclass
class Session:
    viewer: Viewer
    expires: float


class Sessions:
    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic):
        self.ttl_s = ttl_s
        self._clock = clock
        self._by_id: dict[str, Session] = {}

    def create(self, viewer: Viewer) -> str:
        now = self._clock()
        if len(self._by_id) >= MAX_SESSIONS:
            self._by_id = {k: s for k, s in self._by_id.items() if s.expires > now}
            if len(self._by_id) >= MAX_SESSIONS:  # still full: the oldest goes
                del self._by_id[min(self._by_id, key=lambda k: self._by_id[k].expires)]
        sid = secrets.token_urlsafe(32)
        self._by_id[sid] = Session(viewer, now + self.ttl_s)
        return sid

    def get(self, sid: str | None) -> Viewer | None:
        if not sid:
            return None
        session = self._by_id.get(sid)
        now = self._clock()
        if session is None or session.expires <= now:
            self._by_id.pop(sid, None)
            return None
        session.expires = now + self.ttl_s
        return session.viewer

    def end(self, sid: str | None) -> None:
        if sid:
            self._by_id.pop(sid, None)

    def end_token(self, token: str) -> None:
        """Every session of a token a service no longer accepts."""
        for sid in [k for k, s in self._by_id.items() if s.viewer.token == token]:
            del self._by_id[sid]


def display_name(token: str) -> str:
    """What the page calls a token's holder: its public id (`lightpath token list` shows it),
    never the secret."""
    parts = token.split(".")
    return f"token {parts[1][:12]}" if len(parts) == 3 and parts[0] == "lpt1" else "token"


# Sign-in attempts that failed (a token no service accepts), per client address and
# per token prefix, within WINDOW_S; past MAX_FAILURES, further attempts of that client
# or prefix are refused (HTTP 429 with Retry-After) until the oldest failure is older
# than the window. Guessing tokens from one address, or one token's secret from many,
# gets MAX_FAILURES tries a window (issue 30).
MAX_FAILURES = 5
WINDOW_S = 60.0
MAX_KEYS = 10_000  # addresses and prefixes remembered at once (the oldest go first)


def token_prefix(token: str) -> str:
    """What a token is throttled under: its public id for a Lightpath token, else its
    first 12 characters (never the secret)."""
    parts = token.split(".")
    if len(parts) == 3 and parts[0] == "lpt1":
        return "lpt1." + parts[1][:32]
    return token[:12]


class SignInThrottle:
    def __init__(
        self,
        max_failures: int = MAX_FAILURES,
        window_s: float = WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.max_failures = max_failures
        self.window_s = window_s
        self._clock = clock
        self._failures: dict[str, list[float]] = {}

    def _recent(self, key: str, now: float) -> list[float]:
        times = [t for t in self._failures.get(key, ()) if t > now - self.window_s]
        if times:
            self._failures[key] = times
        else:
            self._failures.pop(key, None)
        return times

    def wait_s(self, client: str, token: str) -> float:
        """0 if an attempt by `client` with `token` may go ahead, else the seconds until
        one may."""
        now = self._clock()
        wait = 0.0
        for key in (f"client {client}", f"prefix {token_prefix(token)}"):
            times = self._recent(key, now)
            if len(times) >= self.max_failures:
                wait = max(wait, times[-self.max_failures] + self.window_s - now)
        return wait

    def failed(self, client: str, token: str) -> None:
        now = self._clock()
        if len(self._failures) >= MAX_KEYS:
            oldest = sorted(self._failures, key=lambda k: self._failures[k][-1])
            for key in oldest[: MAX_KEYS // 10]:
                del self._failures[key]
        for key in (f"client {client}", f"prefix {token_prefix(token)}"):
            times = self._recent(key, now)
            times.append(now)
            self._failures[key] = times[-self.max_failures :]
