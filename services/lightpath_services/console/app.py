"""The console's HTTP surface (Starlette): the page, JSON snapshots of each view, their
live versions as server-sent events, sign-in and health. Read-only: the only POSTs are
sign-in and sign-out, and no route changes anything in the services.

    GET  /                       the page (static/index.html; views by URL fragment)
    GET  /static/...             its script, style and icon: nothing comes from elsewhere
    GET  /api/session            who is looking, what the anonymous view is
    POST /api/login              {"token": "lpt1...."}: sign in with a bearer token
    POST /api/logout
    GET  /api/view/{view}?...    one snapshot of a view (JSON)
    GET  /events/{view}?...      the same view as server-sent events, sent again on change
    GET  /healthz                200 while every watch runs, else 503 (JSON says which)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from lightpath.errors import LightpathError, PermissionDenied, Unauthenticated
from lightpath_services.common.supervisor import Supervisor
from lightpath_services.console import views
from lightpath_services.console.backends import CONSOLE, MAX_RESERVATIONS, Backends, Viewer
from lightpath_services.console.hub import Hub
from lightpath_services.console.sessions import COOKIE, Sessions, SignInThrottle, display_name

log = logging.getLogger("lightpath.console")
STATIC = Path(__file__).parent / "static"
_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
HTTP_STATUS = {
    "INVALID_ARGUMENT": 400,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "NOT_FOUND": 404,
    "FAILED_PRECONDITION": 409,
    "RESOURCE_EXHAUSTED": 429,
    "UNAVAILABLE": 503,
    "DEADLINE_EXCEEDED": 504,
}
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)
SETTLE_S = 0.25  # a view is read again this long after a change was announced


class BadParameter(LightpathError):
    code = "INVALID_ARGUMENT"
    reason = "INVALID_PARAMETER"


def _param(request: Request, name: str) -> str:
    value = request.query_params.get(name, "")
    if not _ID.match(value):
        raise BadParameter(
            f"query parameter {name!r} must be an id of 1-128 characters of A-Z a-z 0-9 . _ -"
        )
    return value


def _int_param(request: Request, name: str) -> int:
    raw = request.query_params.get(name, "")
    if not raw.isdigit() or len(raw) > 9:
        raise BadParameter(f"query parameter {name!r} must be a whole number >= 0")
    return int(raw)


@dataclass
class Console:
    backends: Backends
    hub: Hub
    sessions: Sessions
    supervisor: Supervisor
    anonymous_reads: bool
    clock: Callable[[], float] = time.time
    throttle: SignInThrottle = field(default_factory=SignInThrottle)

    # -- who is looking --------------------------------------------------------------

    def viewer(self, request: Request) -> Viewer:
        viewer = self.sessions.get(request.cookies.get(COOKIE))
        if viewer is not None:
            return viewer
        if self.anonymous_reads:
            return CONSOLE
        raise Unauthenticated(
            "sign in with your bearer token to see this console", reason="SIGN_IN_REQUIRED"
        )

    # -- the views: (JSON, topics whose change re-sends it) ----------------------------

    async def view(self, name: str, request: Request, viewer: Viewer) -> tuple[dict, list[str]]:
        now = self.clock()
        b = self.backends
        if name == "cell":
            jobs = await b.list_jobs(viewer)
            pods, pods_error = None, ""
            try:
                pods = await b.list_pods(viewer)
            except PermissionDenied as exc:
                pods_error = exc.message
            quotas = await b.list_quotas(viewer)
            hold = quotas.hold if quotas.HasField("hold") else None
            view = views.cell_view(pods, jobs, now, pods_error, quotas.quotas, hold)
            return view, ["jobs", "tick"]
        if name == "job":
            job, trace_id = await b.get_job(viewer, _param(request, "id"))
            wiring, wiring_error = None, ""
            if job.pod_id and job.pod_id in b.ocs:
                try:
                    wiring = await b.slice_wiring(viewer, job.pod_id, job.job_id, full=False)
                except LightpathError as exc:
                    wiring_error = exc.message
            return views.job_view(job, now, trace_id, wiring, wiring_error), ["jobs"]
        if name == "pod":
            pod_id = _param(request, "id")
            pod = await b.get_pod(viewer, pod_id)
            rings = []
            if pod.view.HasField("switched") and pod_id in b.ocs:
                rings = await b.ring_reservations(viewer, pod_id)
            twisted = {j.job_id for j in pod.view.live_jobs if j.twisted}
            return views.pod_view(pod, now, rings, twisted), [f"pod:{pod_id}", "tick"]
        if name == "block":
            pod_id, block_id = _param(request, "pod"), _int_param(request, "id")
            pod = await b.get_pod(viewer, pod_id)
            blocks = {blk["block_id"]: blk for blk in views.pod_view(pod, now)["blocks"]}
            if block_id not in blocks:
                raise BadParameter(
                    f"query parameter 'id': pod {pod_id} has blocks 0..{len(blocks) - 1}"
                )
            block = blocks[block_id]
            ports, wiring = [], None
            if pod_id in b.ocs and not pod.view.HasField("switched"):
                ports = await b.block_ports(viewer, pod_id, block_id)
                if block["job_id"]:
                    with contextlib.suppress(LightpathError):
                        wiring = await b.slice_wiring(viewer, pod_id, block["job_id"])
            return views.block_detail(block, ports, wiring), [f"pod:{pod_id}"]
        if name == "ocs":
            pod_id = _param(request, "pod")
            switches = await b.switches(viewer, pod_id)
            states = await b.one_to_many(viewer, pod_id)
            return views.ocs_view(pod_id, switches, states), [f"pod:{pod_id}", "tick"]
        if name == "slice":
            pod_id, job_id = _param(request, "pod"), _param(request, "job")
            wiring = await b.slice_wiring(viewer, pod_id, job_id)
            return views.slice_view(pod_id, wiring), [f"pod:{pod_id}"]
        if name == "cores":
            listed = await b.reservations(viewer)
            live = views.live_reservations(listed, now)
            end, tick = views.cores_window(live, now)
            capacity = await b.capacity(viewer, now, end)
            complete = len(listed) < MAX_RESERVATIONS
            return views.cores_view(capacity, now, end, live, tick, complete), ["cores", "tick"]
        if name == "agg":
            topology = await b.agg_topology(viewer)
            # A tenant reads its tree and commands, not the switches' slots.
            switch_states = await b.switch_states(viewer) if viewer.sees_switches else {}
            commands = await b.commands(viewer)
            out = views.agg_view(b.agg_tree, topology, switch_states, commands, now)
            out["switches_shown"] = viewer.sees_switches
            return out, ["tick"]
        raise BadParameter(
            f"view {name!r} is not one of cell, job, pod, block, ocs, slice, cores, agg"
        )

    async def what_it_sees(self, viewer: Viewer) -> Viewer:
        """`viewer` with the operators' views it may not read turned off, so its page has no
        tab that only answers "Not available" (issue 33). One read of each; a service
        that does not answer leaves its view on (its page then says why)."""
        b, now = self.backends, self.clock()

        async def may(read: Callable[[], Awaitable[object]]) -> bool:
            try:
                await read()
            except PermissionDenied:
                return False
            except LightpathError:
                pass
            return True

        return dataclasses.replace(
            viewer,
            sees_pods=await may(lambda: b.list_pods(viewer)),
            sees_cores=b.broker is None or await may(lambda: b.capacity(viewer, now, now + 1e-3)),
            sees_switches=not b.agg or await may(lambda: b.switch_state(viewer, next(iter(b.agg)))),
        )

    def forget_if_revoked(self, exc: LightpathError, viewer: Viewer) -> None:
        if isinstance(exc, Unauthenticated) and viewer.token:
            self.sessions.end_token(viewer.token)


def error_response(exc: LightpathError) -> JSONResponse:
    return JSONResponse(
        {"error": {"code": exc.code, "reason": exc.reason, "message": str(exc)}},
        status_code=HTTP_STATUS.get(exc.code, 502),
    )


def build_app(console: Console) -> Starlette:
    async def page(request: Request) -> Response:
        return FileResponse(STATIC / "index.html", media_type="text/html")

    async def health(request: Request) -> Response:
        down = sorted(t.name for t in console.supervisor.tasks.values() if t.down)
        body = {"status": "SERVING" if not down else "NOT_SERVING", "tasks_down": down}
        return JSONResponse(body, status_code=200 if not down else 503)

    async def session(request: Request) -> Response:
        viewer = console.sessions.get(request.cookies.get(COOKIE))
        return JSONResponse(
            {
                "signed_in": viewer is not None,
                "name": viewer.name if viewer else "",
                "anonymous_reads": console.anonymous_reads,
                # Superpods and their switches are the operators' view: a tenant gets no
                # tab that would only answer "Not available" (issue 33).
                "pods": []
                if viewer is not None and not viewer.sees_pods
                else sorted(console.backends.ocs) or console.hub.pods,
                "cores": console.backends.broker is not None
                and (viewer is None or viewer.sees_cores),
                "agg": bool(console.backends.agg),
            }
        )

    async def login(request: Request) -> Response:
        same_origin(request)
        try:
            body = await request.json()
        except ValueError:
            body = None
        token = body.get("token", "") if isinstance(body, dict) else ""
        if not isinstance(token, str) or not token.strip():
            raise BadParameter("field 'token' must be your bearer token (lpt1....)")
        token = token.strip()
        client = request.client.host if request.client else "unknown"
        wait = console.throttle.wait_s(client, token)
        if wait > 0:
            log.warning("sign-in throttled", extra={"client": client})
            retry = max(1, math.ceil(wait))
            return JSONResponse(
                {
                    "error": {
                        "code": "RESOURCE_EXHAUSTED",
                        "reason": "SIGN_IN_THROTTLED",
                        "message": f"too many failed sign-ins; try again in {retry} s",
                    }
                },
                status_code=429,
                headers={"Retry-After": str(retry)},
            )
        viewer = Viewer(token, display_name(token))
        try:
            await console.backends.list_jobs_probe(viewer)  # UNAUTHENTICATED for a bad token
        except Unauthenticated:
            console.throttle.failed(client, token)
            raise
        viewer = await console.what_it_sees(viewer)
        sid = console.sessions.create(viewer)
        log.info("viewer signed in", extra={"viewer": viewer.name})
        response = JSONResponse({"signed_in": True, "name": viewer.name})
        response.set_cookie(COOKIE, sid, httponly=True, secure=True, samesite="strict", path="/")
        return response

    async def logout(request: Request) -> Response:
        same_origin(request)
        console.sessions.end(request.cookies.get(COOKIE))
        response = JSONResponse({"signed_in": False})
        response.delete_cookie(COOKIE, path="/", secure=True, httponly=True, samesite="strict")
        return response

    async def snapshot(request: Request) -> Response:
        viewer = console.viewer(request)
        try:
            body, _ = await console.view(request.path_params["view"], request, viewer)
        except LightpathError as exc:
            console.forget_if_revoked(exc, viewer)
            raise
        return JSONResponse(body, headers={"Cache-Control": "no-store"})

    async def events(request: Request) -> Response:
        viewer = console.viewer(request)
        name = request.path_params["view"]
        before = dict(console.hub.versions)  # taken before the read: no change falls between
        body, topics = await console.view(name, request, viewer)  # a bad request fails here

        async def stream() -> AsyncIterator[str]:
            nonlocal body, topics, before
            last = ""
            settle = False
            yield "retry: 2000\n\n"
            while True:
                seen = tuple(before.get(t, 0) for t in topics)
                text = json.dumps(body, separators=(",", ":"))
                if text != last:
                    yield f"event: view\ndata: {text}\n\n"
                    last = text
                else:
                    yield ": still here\n\n"
                # After a change, read once more shortly after: a service's view may trail
                # the event that announced it by a few milliseconds.
                timeout = SETTLE_S if settle else console.hub.poll_s * 5
                settle = await console.hub.wait(topics, seen, timeout)
                try:
                    before = dict(console.hub.versions)
                    body, topics = await console.view(name, request, viewer)
                except LightpathError as exc:
                    console.forget_if_revoked(exc, viewer)
                    err = {"code": exc.code, "reason": exc.reason, "message": str(exc)}
                    yield f"event: failure\ndata: {json.dumps(err)}\n\n"
                    if exc.code in ("UNAUTHENTICATED", "PERMISSION_DENIED", "NOT_FOUND"):
                        return
                    await asyncio.sleep(console.hub.poll_s)

        return StreamingResponse(
            stream(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    async def on_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, LightpathError)
        return error_response(exc)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        console.hub.start()
        try:
            yield
        finally:
            for task in list(console.supervisor.tasks.values()):
                if task.task is not None:
                    task.task.cancel()
            await console.backends.close()

    return Starlette(
        routes=[
            Route("/", page),
            Route("/healthz", health),
            Route("/api/session", session),
            Route("/api/login", login, methods=["POST"]),
            Route("/api/logout", logout, methods=["POST"]),
            Route("/api/view/{view}", snapshot),
            Route("/events/{view}", events),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ],
        middleware=[Middleware(SecurityHeaders)],
        exception_handlers={LightpathError: on_error},
        lifespan=lifespan,
    )


def same_origin(request: Request) -> None:
    """Sign-in and sign-out only from the console's own page (no cross-site posts)."""
    origin = request.headers.get("origin", "")
    expected = f"{request.url.scheme}://{request.url.netloc}"
    if origin != expected:
        raise PermissionDenied(
            f"origin {origin or '(none)'!r} is not this console ({expected})",
            reason="CROSS_ORIGIN",
        )


SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
]


class SecurityHeaders:
    """Every answer: no script, style or frame from anywhere but the console itself
    (a pure ASGI middleware, so event streams pass through unbuffered)."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)
