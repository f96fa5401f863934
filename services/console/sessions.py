"""Signed-in viewers. The bearer token a viewer signs in with stays here, in memory, under
a random session id; the browser holds only that id, in an HttpOnly, Secure,
SameSite=Strict cookie. A session ends on sign-out, after `ttl_s` without use, when the
console restarts, or as soon as a service answers UNAUTHENTICATED to its token (revoked)."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from services.console.backends import Viewer

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
