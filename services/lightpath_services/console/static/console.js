// Lightpath console: a read-only, live view of the cell. Plain JS, no build step, no
// third-party code. Each view is a URL fragment (#/cell, #/pod/pod-1, ...) whose data
// comes from /events/<view> (server-sent events, sent again whenever it changes).
"use strict";

const SVG = "http://www.w3.org/2000/svg";
// Colour-blind-safe palette (Okabe-Ito, then Tol's muted) for jobs; never the only cue:
// each block also carries its job's short label and a pattern marks failures.
const PALETTE = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00",
  "#332288", "#117733", "#882255", "#44AA99", "#999933", "#AA4499"];
const state = { source: null, route: null, session: null, updates: 0, selected: null };

// -- DOM helpers (text only: nothing from the services is ever parsed as HTML) ----------
function h(tag, attrs, ...kids) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const kid of kids.flat(Infinity)) {
    if (kid === null || kid === undefined || kid === false) continue;
    el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return el;
}
function s(tag, attrs, ...kids) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, String(v));
  }
  for (const kid of kids.flat(Infinity)) {
    if (kid === null || kid === undefined) continue;
    el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return el;
}
const link = (href, text) => h("a", { href }, text);
const stateTag = (st) => h("span", { class: `state ${st}` }, st);
function ago(sec) {
  if (sec === null || sec === undefined) return "—";
  if (sec < 60) return `${sec.toFixed(1)} s`;
  if (sec < 3600) return `${Math.floor(sec / 60)} min`;
  return `${(sec / 3600).toFixed(1)} h`;
}
function when(unix) { return unix ? new Date(unix * 1000).toLocaleTimeString() : "—"; }
// Every live job (or reservation) on a view has a colour no other on it has, kept while
// it lives: a new one takes the first colour free on that view (a hash of the id gave two
// jobs of one pod the same colour). Past the palette, hues a golden angle apart.
const colourMaps = new Map();
let colours = new Map();
function useColours(view, ids) {
  const kept = colourMaps.get(view) || new Map();
  const live = new Set(ids.filter(Boolean));
  for (const id of [...kept.keys()]) if (!live.has(id)) kept.delete(id);
  const taken = new Set(kept.values());
  for (const id of live) {
    if (kept.has(id)) continue;
    let i = 0;
    while (taken.has(i)) i++;
    kept.set(id, i); taken.add(i);
  }
  colourMaps.set(view, kept);
  colours = kept;
}
function colourAt(i) {
  return i < PALETTE.length ? PALETTE[i] : `hsl(${Math.round((i - PALETTE.length) * 137.508 + 20) % 360}, 65%, 36%)`;
}
function colourOf(id) { return colours.has(id) ? colourAt(colours.get(id)) : "#8c959f"; }
function table(headers, rows, numeric = []) {
  return h("table", {},
    h("thead", {}, h("tr", {}, headers.map((t, i) => h("th", { class: numeric.includes(i) ? "num" : null, scope: "col" }, t)))),
    h("tbody", {}, rows.map((r) => h("tr", {}, r.map((c, i) => h("td", { class: numeric.includes(i) ? "num" : null }, c))))));
}
// Capacity reads the same everywhere (docs/usage.md): "free/total free", as `lightpath pods`;
// the bar shows the part in use.
function usebar(used, total, label, free = total - used) {
  const pct = total ? Math.round((100 * used) / total) : 0;
  const inner = h("span", {});
  inner.style.width = `${pct}%`;
  return h("span", {}, h("span", { class: "bar", role: "img", "aria-label": `${label}: ${pct}%` }, inner), ` ${free}/${total} free`);
}

// -- tooltip ----------------------------------------------------------------------------
const tip = h("div", { class: "tip", role: "tooltip", hidden: true });
function showTip(ev, text) {
  tip.textContent = text; tip.hidden = false;
  tip.style.left = `${Math.min(ev.clientX + 12, window.innerWidth - 330)}px`;
  tip.style.top = `${ev.clientY + 12}px`;
}
function hideTip() { tip.hidden = true; }

// -- session ----------------------------------------------------------------------------
async function loadSession() {
  const r = await fetch("/api/session", { credentials: "same-origin" });
  state.session = await r.json();
  renderWho(); renderNav();
}
function renderWho() {
  const who = document.getElementById("who");
  const sess = state.session;
  who.replaceChildren();
  if (sess.signed_in) {
    who.append(h("span", {}, `signed in: ${sess.name}`), h("button", { onclick: signOut, type: "button" }, "Sign out"));
  } else {
    who.append(h("span", {}, sess.anonymous_reads ? "console's read-only view" : "not signed in"),
      h("a", { href: "#/signin" }, "Sign in"));
  }
}
async function signOut() {
  await fetch("/api/logout", { method: "POST", credentials: "same-origin" });
  await loadSession(); route();
}
function viewSignIn(main) {
  const input = h("input", { type: "password", id: "token", autocomplete: "off", "aria-describedby": "token-help", placeholder: "lpt1.…" });
  const out = h("p", { "aria-live": "polite" });
  const form = h("form", { class: "signin", onsubmit: async (ev) => {
    ev.preventDefault();
    const r = await fetch("/api/login", { method: "POST", credentials: "same-origin",
      headers: { "Content-Type": "application/json" }, body: JSON.stringify({ token: input.value }) });
    const body = await r.json();
    if (!r.ok) { out.className = "error"; out.textContent = body.error.message; return; }
    input.value = ""; await loadSession(); location.hash = "#/cell";
  } },
  h("label", { for: "token" }, "Your bearer token"), input,
  h("p", { id: "token-help", class: "muted" },
    "A tenant sees only its own jobs. Get a token with `lightpath tenant create NAME --token`. It stays on the console's server; your browser keeps only a session cookie."),
  h("button", { type: "submit" }, "Sign in"), out);
  main.replaceChildren(h("h1", {}, "Sign in"), form);
  live("");
}

// -- navigation -------------------------------------------------------------------------
function renderNav() {
  const nav = document.getElementById("nav");
  const items = [["#/cell", "Cell"]];
  for (const pod of state.session.pods) items.push([`#/pod/${pod}`, `Superpod ${pod}`]);
  if (state.session.pods.length) items.push([`#/ocs/${state.session.pods[0]}`, "OCS"]);
  if (state.session.cores) items.push(["#/cores", "Core broker"]);
  if (state.session.agg) items.push(["#/agg", "Aggregation"]);
  nav.replaceChildren(...items.map(([href, text]) => h("a", { href }, text)));
  markNav();
}
function markNav() {
  const here = (location.hash || "#/cell").split("?")[0];
  for (const a of document.querySelectorAll("#nav a")) {
    const href = a.getAttribute("href");
    const on = here === href || (href.startsWith("#/ocs/") && here.startsWith("#/ocs/")) ;
    if (on) a.setAttribute("aria-current", "page"); else a.removeAttribute("aria-current");
  }
}

// -- live data --------------------------------------------------------------------------
function live(text) { document.getElementById("live").textContent = text || "not connected"; }
// Codes a moment can cure: the view is asked for again, later and later, until it answers.
const RETRYABLE = new Set(["UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "ABORTED"]);
function follow(url, render, attempt = 0) {
  if (state.source) state.source.close();
  const src = new EventSource(url);
  state.source = src;
  src.addEventListener("view", (ev) => {
    const data = JSON.parse(ev.data);
    attempt = 0;
    state.updates += 1;
    document.body.dataset.updates = String(state.updates);
    live(`live · updated ${new Date().toLocaleTimeString()}`);
    render(data);
  });
  src.addEventListener("failure", (ev) => {
    const err = JSON.parse(ev.data);
    showError(err);
  });
  // A stream whose first read failed is closed by the browser for good (an error status,
  // not an event stream), so a fault that passes must be followed again by hand.
  const again = (err) => {
    const delay = Math.min(2 ** attempt * 2, 30);
    if (err) showError(err, `retrying in ${delay} s`);
    else live("reconnecting…");
    setTimeout(() => { if (state.source === src) follow(url, render, attempt + 1); }, delay * 1000);
  };
  src.onerror = async () => {
    if (state.source !== src) return;  // the page moved on
    if (src.readyState === EventSource.CLOSED || !state.updates) {
      // the stream could not start: ask once as a plain request to show why
      let r;
      try {
        r = await fetch(url.replace("/events/", "/api/view/"), { credentials: "same-origin" });
      } catch (e) {
        if (state.source === src) again({ code: "UNAVAILABLE", message: "the console did not answer" });
        return;
      }
      if (state.source !== src) return;
      if (!r.ok) {
        const err = (await r.json()).error;
        if (RETRYABLE.has(err.code)) { src.close(); again(err); return; }
        src.close(); showError(err); return;
      }
      if (src.readyState === EventSource.CLOSED) { again(null); return; }
    }
    live("reconnecting…");
  };
}
function showError(err, retrying = "") {
  const main = document.getElementById("view");
  const hint = retrying ? ` — ${retrying}.`
    : err.code === "UNAUTHENTICATED" ? " — sign in to see this."
    : err.code === "PERMISSION_DENIED" ? " — your sign-in may not see this view." : "";
  main.replaceChildren(h("h1", {}, "Not available"), h("p", { class: "error", role: "alert" }, `${err.message}${hint}`),
    h("p", {}, link("#/cell", "Back to the cell")));
  live(retrying || "stopped");
}

function route() {
  const parts = (location.hash || "#/cell").split("?")[0].slice(2).split("/").map(decodeURIComponent);
  const main = document.getElementById("view");
  markNav(); hideTip();
  if (state.source) { state.source.close(); state.source = null; }
  const [view, a, b] = parts;
  const q = (o) => new URLSearchParams(o).toString();
  main.replaceChildren(h("p", { class: "muted" }, "Loading…"));
  if (view === "signin") return viewSignIn(main);
  if (view === "job") return follow(`/events/job?${q({ id: a })}`, (d) => renderJob(main, d));
  if (view === "pod") return follow(`/events/pod?${q({ id: a })}`, (d) => renderPod(main, d));
  if (view === "ocs") return follow(`/events/ocs?${q({ pod: a })}`, (d) => renderOcs(main, d));
  if (view === "slice") return follow(`/events/slice?${q({ pod: a, job: b })}`, (d) => renderSlice(main, d));
  if (view === "cores") return follow("/events/cores", (d) => renderCores(main, d));
  if (view === "agg") return follow("/events/agg", (d) => renderAgg(main, d));
  return follow("/events/cell", (d) => renderCell(main, d));
}

// A pod's name, linked to its view when this sign-in may read it (a tenant's may not).
function podLink(pod) { return state.session.pods.includes(pod) ? link(`#/pod/${pod}`, pod) : pod; }

// -- Cell -------------------------------------------------------------------------------
function renderCell(main, d) {
  const pods = d.pods_error
    ? h("p", { class: "muted" }, "Superpods, their blocks and switches are the operators' view: this sign-in shows its own jobs. ", h("span", { class: "mono" }, `(${d.pods_error})`))
    : h("div", { class: "cards" }, d.pods.map((p) => h("div", { class: "card" },
      h("h3", {}, link(`#/pod/${p.pod_id}`, p.pod_id), " ", stateTag(p.status)),
      h("div", { class: "muted" }, `${p.fabric_kind}, blocks of ${p.block_shape}`, p.ocs_per_axis > 1 ? `, K = ${p.ocs_per_axis}` : ""),
      h("div", {}, `heartbeat ${ago(p.heartbeat_age_s)} ago · queue ${p.queued_jobs} · running ${p.running_jobs}`),
      p.capacity.map((c) => h("div", {}, `${c.node_type}: `, usebar(c.allocated, c.total, `${c.node_type} blocks in use`, c.free),
        c.failed ? h("span", { class: "state FAILED" }, `${c.failed} failed`) : "")),
      h("div", {}, link(`#/ocs/${p.pod_id}`, "OCS use →")))));
  const jobs = d.jobs.length ? table(["job", "tenant", "state", "pod", "shape (chips)", "blocks", "priority", "age"],
    d.jobs.map((j) => [link(`#/job/${encodeURIComponent(j.job_id)}`, j.job_id), j.tenant, stateTag(j.state),
      j.pod_id ? podLink(j.pod_id) : (j.queue_position ? `cell queue #${j.queue_position}` : "—"),
      j.shape, j.blocks, j.priority, ago(j.age_s)]), [5, 6]) : h("p", { class: "muted" }, "No jobs yet.");
  main.replaceChildren(h("h1", {}, "Cell"), h("h2", {}, "Superpods"), pods, ...quotaSection(d.quotas, d.hold),
    h("h2", {}, `Jobs (${d.jobs.length})`), jobs);
}

// Tenants' quotas (issue 35): per tenant and node type, chips held against its quota; the
// part above it (borrowed from its cohort) striped. A tenant's sign-in gets its own row only.
function quotabar(t) {
  const whole = Math.max(t.quota || 0, t.used);
  const inner = h("span", {});
  inner.style.width = `${whole ? Math.round((100 * t.used) / whole) : 0}%`;
  const label = t.quota === null ? `${t.used} ${t.node_type} chips held, no quota`
    : `${t.used} of ${t.quota} ${t.node_type} chips` + (t.borrowed ? `, ${t.borrowed} borrowed` : "");
  return h("span", {}, h("span", { class: t.borrowed ? "bar borrowing" : "bar", role: "img", "aria-label": label }, inner), ` ${label}`);
}
// The pod held for a job within its tenant's nominal quota that no pod could make room
// for: whose job only to operators and to that tenant (the cell leaves it out otherwise).
function holdNote(hold) {
  const whose = hold.job_id
    ? [`for ${hold.tenant}'s job `, link(`#/job/${encodeURIComponent(hold.job_id)}`, hold.job_id)]
    : ["for another tenant's job"];
  return h("p", { class: "hold", "data-pod": hold.pod }, h("strong", {}, "Pod ", podLink(hold.pod), " is held "),
    ...whose, ` (held ${ago(hold.age_s)}): within its nominal quota, no pod could make room for it, so jobs that`
    + " would borrow quota stay off this pod and the room its jobs leave gathers for it; jobs within"
    + " their nominal quota still go there. It ends when that job starts or leaves the cell queue.");
}
function quotaSection(quotas, hold) {
  if (!quotas || !quotas.length) return hold ? [h("h2", {}, "Tenants' quotas"), holdNote(hold)] : [];
  // A pod-scoped row caps what the tenant holds on that pod: sharing and waiting are the cell's.
  const rows = quotas.map((q) => [q.tenant, q.pod ? `pod ${q.pod}` : "cell",
    q.types.length ? q.types.map((t) => h("div", { class: "quota", "data-tenant": q.tenant, "data-pod": q.pod, "data-type": t.node_type }, quotabar(t))) : "—",
    q.pod ? "—" : q.has_quota ? (q.cohort ? `cohort ${q.cohort}` : "no cohort") + (q.no_borrowing ? ", no borrowing" : "") : "no quota",
    q.pod ? "—" : q.waiting ? `${q.waiting} (${q.waiting_for_quota} for quota)` : "0"]);
  return [h("h2", {}, "Tenants' quotas"), table(["tenant", "scope", "chips held / quota", "sharing", "waiting"], rows),
    ...(hold ? [holdNote(hold)] : [])];
}

// -- Job --------------------------------------------------------------------------------
function renderJob(main, d) {
  const dl = (pairs) => h("dl", {}, pairs.filter(Boolean).flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
  const wiring = d.wiring ? `${d.wiring.state}: ${d.wiring.cross_connects} cross-connects, ${d.wiring.one_to_many} 1×K settings, grid ${d.wiring.grid}`
    : (d.wiring_error || "not wired");
  main.replaceChildren(
    h("h1", {}, `Job ${d.job_id} `, stateTag(d.state), d.twisted ? h("span", { class: "badge twisted", title: "a twisted torus" }, "↻ twisted") : null),
    h("div", { class: "grid2" },
      h("div", { class: "detail" }, dl([
        ["tenant", d.tenant], ["pod", d.pod_id ? link(`#/pod/${d.pod_id}`, d.pod_id) : "—"],
        ["shape", d.box ? `${d.shape} chips: a box inside one block, a mesh (no OCS change)` : `${d.shape} chips = ${d.grid || "?"} blocks${d.twisted ? ", a twisted torus" : ""}`],
        d.box ? ["box", `chips ${d.box.chips.join("x")} at ${coords(d.box.offset)} of block ${d.box.block_id}`] : null,
        ["priority", d.priority], ["age", ago(d.age_s)],
        ["reason", d.reason || "—"], ["placement", d.placement_reason || "—"],
        ["wiring", d.wiring && d.pod_id ? link(`#/slice/${d.pod_id}/${encodeURIComponent(d.job_id)}`, wiring) : wiring],
        ["trace id", h("span", { class: "mono" }, d.trace_id || "—")],
      ]), h("p", { class: "muted" }, "The trace id is this page's read of the job: the services' logs and spans of that read carry it.")),
      h("div", {}, h("h2", {}, `Blocks (${d.block_list.length})`),
        d.block_list.length ? table(["block", "type", "position"], d.block_list.map((b) => [
          d.pod_id ? link(`#/pod/${d.pod_id}?block=${b.block_id}`, `block ${b.block_id}`) : b.block_id, b.node_type, b.position.join(",")]))
          : h("p", { class: "muted" }, "none held"))),
    h("h2", {}, "History"),
    table(["at", "from", "to", "pod", "reason"], d.history.map((e) => [when(e.at), e.from, stateTag(e.to), e.pod_id, e.reason])));
}

// -- Superpod block map -----------------------------------------------------------------
function mapLayout(d) {
  if (d.switched) {
    const cfg = d.switched.fabric.config || {};
    return { cols: cfg.cluster_cols || 4, cell: 120 };
  }
  const n = d.blocks.length;
  // Blocks shared by sub-block slices are drawn split into their chips: larger cells.
  const chips = d.blocks.some((b) => b.shared || b.failed_hosts.length);
  return { cols: Math.max(1, Math.ceil(Math.sqrt(n))), cell: chips ? 92 : 62 };
}
function defs() {
  return s("defs", {},
    s("pattern", { id: "failed-hatch", width: 8, height: 8, patternUnits: "userSpaceOnUse", patternTransform: "rotate(45)" },
      s("rect", { width: 8, height: 8, fill: "#f8d7da" }), s("line", { x1: 0, y1: 0, x2: 0, y2: 8, stroke: "#a40e26", "stroke-width": 4 })),
    s("pattern", { id: "free-dots", width: 6, height: 6, patternUnits: "userSpaceOnUse" },
      s("rect", { width: 6, height: 6, fill: "#f6f8fa" }), s("circle", { cx: 3, cy: 3, r: 0.8, fill: "#8c959f" })));
}
const DIM_NAMES = ["x", "y", "z", "w"];
const TYPE_MARK = { tpu: "", gpu: "◆", npu: "" };
const coords = (c) => `(${c.join(",")})`;
const boxText = (x) => `${x.job_id} ${x.chips.join("x")} at ${coords(x.offset)}`;
// Failed as a whole block; one with failed hosts only (also health FAILED: it takes no
// block slice) keeps serving sub-block slices on its other hosts.
const wholeFailed = (b) => b.health === "FAILED" && !b.failed_hosts.length;
function blockSummary(b) {  // what a block holds, in words (tooltip, aria-label)
  if (wholeFailed(b)) return "failed";
  const hosts = b.failed_hosts.length ? `; hosts ${b.failed_hosts.join(", ")} failed` : "";
  if (b.job_id) return `job ${b.job_id}${b.twisted ? " (twisted torus)" : ""}${hosts}`;
  if (b.shared) return `shared by sub-block slices: ${b.boxes.map(boxText).join(", ") || "none now"}; ${b.chips_free} chips free${hosts}`;
  return b.failed_hosts.length ? `${b.chips_free} chips free${hosts}` : "free";
}
// A block of sub-block slices (issue 28) split into its chips: its z layers side by side,
// each chip in the colour of the job whose box holds it, a failed host's chips hatched,
// each host outlined.
function chipGrid(g, b, d, x, y, size) {
  const [X, Y, Z] = [...d.block_dims, 1, 1, 1].slice(0, 3);
  const [hx, hy] = [...(d.host_shape.length ? d.host_shape : [X, Y, Z]), 1, 1, 1].slice(0, 3);
  const hz = (d.host_shape[2] || 1);
  const lc = Math.ceil(Math.sqrt(Z)), lr = Math.ceil(Z / lc), lgap = 3;
  const cs = Math.max(2, Math.floor(Math.min((size - 6 - (lc - 1) * lgap) / (lc * X), (size - 20 - (lr - 1) * lgap) / (lr * Y))));
  const owner = new Map();
  for (const box of b.boxes)
    for (let i = 0; i < box.chips[0]; i++) for (let j = 0; j < (box.chips[1] || 1); j++) for (let k = 0; k < (box.chips[2] || 1); k++)
      owner.set(`${box.offset[0] + i},${(box.offset[1] || 0) + j},${(box.offset[2] || 0) + k}`, box.job_id);
  const hostsX = Math.max(1, Math.floor(X / hx)), hostsY = Math.max(1, Math.floor(Y / hy));
  const hostOf = (cx, cy, cz) => Math.floor(cx / hx) + hostsX * (Math.floor(cy / hy) + hostsY * Math.floor(cz / hz));
  const failed = new Set(b.failed_hosts);
  for (let z = 0; z < Z; z++) {
    const ox = x + 3 + (z % lc) * (X * cs + lgap), oy = y + 17 + Math.floor(z / lc) * (Y * cs + lgap);
    for (let cy = 0; cy < Y; cy++) for (let cx = 0; cx < X; cx++) {
      const job = owner.get(`${cx},${cy},${z}`) || "", host = hostOf(cx, cy, z), down = failed.has(host);
      g.append(s("rect", { class: down ? "chip chip-failed" : "chip", x: ox + cx * cs, y: oy + cy * cs, width: cs, height: cs,
        fill: down ? "url(#failed-hatch)" : job ? colourOf(job) : "#f6f8fa", stroke: "#d0d7de", "stroke-width": 0.5,
        "data-chip": `${cx},${cy},${z}`, "data-host": host, "data-job": job }));
    }
    for (let h0 = 0; h0 < Y; h0 += hy) for (let w0 = 0; w0 < X; w0 += hx)  // the hosts of this layer
      g.append(s("rect", { class: "host", x: ox + w0 * cs, y: oy + h0 * cs, width: hx * cs, height: hy * cs, fill: "none", stroke: "#57606a", "stroke-width": 0.8 }));
  }
}
function blockGlyph(b, x, y, size, label) {
  const failed = wholeFailed(b);
  const split = !failed && !b.job_id && (b.shared || b.failed_hosts.length);
  const fill = failed ? "url(#failed-hatch)" : b.job_id ? colourOf(b.job_id) : split ? "#ffffff" : "url(#free-dots)";
  const g = s("g", { class: b.shared ? "block shared" : "block", tabindex: 0, role: "button", "data-block": b.block_id,
    "data-job": b.job_id || "", "data-health": b.health, "data-type": b.node_type,
    "data-twisted": b.twisted ? "true" : null, "data-failed-hosts": b.failed_hosts.join(",") || null,
    "aria-label": `block ${b.block_id}, ${b.node_type}, ${blockSummary(b)}` });
  const rx = b.node_type === "gpu" ? size / 3 : 3;  // other node types: rounder corners, and a mark
  g.append(s("rect", { class: "cell", x, y, width: size, height: size, rx, fill, stroke: "#57606a", "stroke-width": 1 }));
  const dark = !failed && b.job_id;
  g.append(s("text", { x: x + 4, y: y + 13, fill: dark ? "#fff" : "#1b1f24", "font-weight": 600 }, String(b.block_id)));
  if (TYPE_MARK[b.node_type]) g.append(s("text", { x: x + size - 14, y: y + 13, fill: dark ? "#fff" : "#1b1f24" }, TYPE_MARK[b.node_type]));
  if (failed) g.append(s("text", { x: x + size / 2, y: y + size / 2 + size * 0.18, "font-size": size * 0.5, "text-anchor": "middle", fill: "#a40e26", "font-weight": 700 }, "✕"));
  else if (b.job_id) g.append(s("text", { x: x + 4, y: y + size - 6, fill: "#fff", "font-size": 10 }, label(b.job_id)));
  if (b.twisted) g.append(s("text", { class: "twist", x: x + size - 4, y: y + 13, "text-anchor": "end", fill: "#fff", "font-weight": 700 }, "↻"));
  if (split) {
    g.append(s("text", { x: x + size - 4, y: y + 13, "text-anchor": "end", fill: "#1b1f24", "font-size": 10 }, `${b.chips_free} free`));
    g.append(s("title", {}, `block ${b.block_id}: ${blockSummary(b)}`));
  }
  return g;
}
// A SWITCHED pod's processor group (seed 002), named as the rings table names it
// (g<cluster row>.<column>), its processors drawn in the colour of the job holding each:
// a large job holds whole groups, small jobs rectangles of a group kept for them. The
// name sits above the processors and the job below them, neither over them.
function groupName(d, i) {
  const cols = (d.switched.fabric.config || {}).cluster_cols || 1;
  return `g${Math.floor(i / cols)}.${i % cols}`;
}
function groupTiles(d, i) {  // [job, tile] of the small jobs in group i
  return Object.entries(d.switched.small_tiles).filter(([, t]) => (t.group || 0) === i);
}
const tileText = (t) => `rows ${t.row || 0}–${(t.row || 0) + t.height - 1}, columns ${t.col || 0}–${(t.col || 0) + t.width - 1}`;
function groupSummary(b, d) {
  const dims = (d.switched.fabric.config.group_shape || {}).dims || [3, 3];
  const all = dims[0] * (dims[1] || 1);
  const small = d.switched.small_groups.includes(b.block_id) ? ", kept for small jobs" : "";
  if (wholeFailed(b)) return `failed${small}`;
  if (b.job_id) return `job ${b.job_id}, all ${all} processors`;
  const tiles = groupTiles(d, b.block_id);
  const used = tiles.reduce((n, [, t]) => n + t.height * t.width, 0);
  const jobs = tiles.map(([j, t]) => `${j} (${tileText(t)})`).join(", ");
  return `${jobs ? `small jobs ${jobs}; ` : ""}${all - used} of ${all} processors free${small}`;
}
function groupGlyph(b, d, x, y, size, label) {
  const dims = (d.switched.fabric.config.group_shape || {}).dims || [3, 3];
  const pr = dims[0], pc = dims[1] || 1;
  const failed = wholeFailed(b), small = d.switched.small_groups.includes(b.block_id);
  const tiles = groupTiles(d, b.block_id);
  const owner = new Map();
  for (const [job, t] of tiles)
    for (let i = 0; i < t.height; i++) for (let j = 0; j < t.width; j++) owner.set(`${(t.row || 0) + i},${(t.col || 0) + j}`, job);
  const name = groupName(d, b.block_id);
  const g = s("g", { class: "block group", tabindex: 0, role: "button", "data-block": b.block_id, "data-group": name,
    "data-job": b.job_id || "", "data-health": b.health, "data-type": b.node_type,
    "data-small-jobs": tiles.map(([j]) => j).join(",") || null,
    "aria-label": `group ${name}, ${groupSummary(b, d)}` });
  const fill = failed ? "url(#failed-hatch)" : b.job_id ? colourOf(b.job_id) : tiles.length ? "#ffffff" : "url(#free-dots)";
  g.append(s("rect", { class: "cell", x, y, width: size, height: size, rx: 3, fill, stroke: "#57606a", "stroke-width": 1 }));
  const ink = b.job_id && !failed ? "#fff" : "#1b1f24";
  g.append(s("text", { x: x + 4, y: y + 13, fill: ink, "font-weight": 600 }, name));
  if (small) g.append(s("text", { x: x + size - 4, y: y + 13, "text-anchor": "end", fill: ink, "font-size": 10 }, "small jobs"));
  const top = 18, bottom = 16, ps = Math.floor(Math.min((size - top - bottom) / pr, (size - 8) / pc));
  const ox = x + (size - pc * ps) / 2, oy = y + top + (size - top - bottom - pr * ps) / 2;
  for (let r = 0; r < pr; r++) for (let c = 0; c < pc; c++) {
    const job = owner.get(`${r},${c}`) || "";
    g.append(s("rect", { class: "proc", x: ox + c * ps + 1.5, y: oy + r * ps + 1.5, width: ps - 3, height: ps - 3,
      fill: job ? colourOf(job) : "none", stroke: b.job_id && !failed ? "#fff" : "#8c959f", "data-job": job || b.job_id || "" }));
  }
  if (failed) g.append(s("text", { x: x + size / 2, y: y + size / 2 + size * 0.18, "font-size": size * 0.5, "text-anchor": "middle", fill: "#a40e26", "font-weight": 700 }, "✕"));
  const free = pr * pc - owner.size;
  const foot = failed ? "" : b.job_id ? label(b.job_id) : tiles.length ? `${tiles.length} small · ${free} free` : "";
  if (foot) g.append(s("text", { x: x + 4, y: y + size - 4, fill: ink, "font-size": 10 }, foot));
  return g;
}
function renderPod(main, d) {
  useColours(`pod:${d.pod_id}`, [...d.blocks.flatMap((b) => [b.job_id, ...b.boxes.map((x) => x.job_id)]),
    ...Object.keys((d.switched || {}).small_tiles || {}), ...d.live_jobs.map((j) => j.job_id)]);
  const { cols, cell } = mapLayout(d);
  const gap = 6;
  const rows = Math.ceil(d.blocks.length / cols);
  const W = cols * (cell + gap) + gap, H = rows * (cell + gap) + gap;
  const svg = s("svg", { class: "blockmap", viewBox: `0 0 ${W} ${H}`, role: "group", "aria-label": `block map of ${d.pod_id}` }, defs());
  // A long id keeps its head and its tail: jobs of one series differ at the end.
  const short = (id) => (id.length > 9 ? `${id.slice(0, 4)}…${id.slice(-4)}` : id);
  const detail = h("div", { class: "detail", id: "block-detail" }, h("p", { class: "muted" }, d.switched ? "Hover a group for its jobs; click it for its detail." : "Hover a block for its job; click it for its segments and cross-connects."));
  for (const b of d.blocks) {
    const i = b.block_id, x = gap + (i % cols) * (cell + gap), y = gap + Math.floor(i / cols) * (cell + gap);
    const g = d.switched ? groupGlyph(b, d, x, y, cell, short) : blockGlyph(b, x, y, cell, short);
    if (!d.switched && !wholeFailed(b) && !b.job_id && (b.shared || b.failed_hosts.length)) chipGrid(g, b, d, x, y, cell);
    const text = d.switched ? `group ${groupName(d, i)} (index ${i}, ${b.node_type}) — ${groupSummary(b, d)}`
      : `block ${i} (${b.node_type}) — ${wholeFailed(b) ? "FAILED" : blockSummary(b)}`;
    g.addEventListener("mousemove", (ev) => showTip(ev, text));
    g.addEventListener("mouseleave", hideTip);
    const pick = () => { state.selected = i; selectBlock(svg, d, i, detail); };
    g.addEventListener("click", pick);
    g.addEventListener("keydown", (ev) => { if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); pick(); } });
    svg.append(g);
  }
  const types = [...new Set(d.blocks.map((b) => b.node_type))];
  const swatch = (fill, extra, rx = 2) => s("svg", { width: 18, height: 18, "aria-hidden": "true" }, defs(), s("rect", { x: 1, y: 1, width: 16, height: 16, rx, fill, stroke: "#57606a" }), extra || null);
  const legend = h("div", { class: "legend" },
    h("span", {}, swatch("url(#free-dots)"), " free"),
    h("span", {}, swatch("url(#failed-hatch)", s("text", { x: 4, y: 14, fill: "#a40e26", "font-size": 13 }, "✕")), " failed (hatched, ✕)"),
    h("span", {}, swatch(PALETTE[0]), d.switched ? " held by a large job (whole groups; colour per job, job id written below)" : " held by a job (colour per job, job id written in the block)"),
    d.switched && d.switched.small_groups.length ? h("span", {}, swatch("#ffffff", s("rect", { x: 4, y: 4, width: 5, height: 5, fill: PALETTE[1] })), " small jobs: a rectangle of processors in a group kept for them, in the job's colour") : null,
    !d.switched && d.blocks.some((b) => b.shared || b.failed_hosts.length) ? h("span", {}, swatch("#ffffff", s("rect", { x: 4, y: 4, width: 5, height: 5, fill: PALETTE[1] })), ` shared by sub-block slices: drawn as its chips (z layers side by side, hosts of ${d.host_shape.join("x") || "?"} outlined), each job's box in its colour, a failed host hatched`) : null,
    d.blocks.some((b) => b.twisted) ? h("span", {}, "↻ twisted torus") : null,
    types.length > 1 ? types.map((t) => h("span", {}, swatch("#fff", TYPE_MARK[t] ? s("text", { x: 4, y: 14, "font-size": 11 }, TYPE_MARK[t]) : null, t === "gpu" ? 6 : 2), ` ${t} block`)) : h("span", { class: "muted" }, `all blocks ${types[0] || ""}`));
  const tile = (j) => ((d.switched || {}).small_tiles || {})[j.job_id];
  const holds = (j) => j.box ? `chips ${j.box.chips.join("x")} at ${coords(j.box.offset)} of block ${j.box.block_id}`
    : tile(j) ? `${tile(j).group_name} ${tileText(tile(j))}`
    : d.switched ? `${j.blocks} group${j.blocks === 1 ? "" : "s"}` : `${j.grid} blocks`;
  const jobs = d.live_jobs.length ? table(["", "job", "state", "holds", "priority"], d.live_jobs.map((j) => [
    s("svg", { width: 14, height: 14, "aria-hidden": "true" }, s("rect", { width: 14, height: 14, fill: colourOf(j.job_id) })),
    h("span", {}, link(`#/job/${encodeURIComponent(j.job_id)}`, j.job_id), j.twisted ? h("span", { class: "badge twisted", title: "a twisted torus" }, "↻ twisted") : null),
    stateTag(j.state), holds(j), j.priority]), [4])
    : h("p", { class: "muted" }, "No live jobs.");
  const caps = d.capacity.map((c) => h("div", {}, `${c.node_type}: `, usebar(c.allocated, c.total, `${c.node_type} in use`, c.free), ` · ${c.failed} failed`));
  for (const c of d.chips || []) caps.push(h("div", { class: "chips" }, `${c.node_type} chips: `, usebar(c.used, c.total, `${c.node_type} chips in use`, c.free), ` · ${c.failed} failed`));
  const side = [h("div", { class: "detail" }, h("div", {}, stateTag(d.status), ` heartbeat ${ago(d.heartbeat_age_s)} ago · queue ${d.queued_jobs}`), caps,
    h("div", {}, link(`#/ocs/${d.pod_id}`, "OCS use of this pod →"))), detail, h("h2", {}, "Live jobs"), jobs];
  if (d.switched) side.push(switchedPanel(d));
  if (d.wiring_differences.length) side.push(h("p", { class: "error" }, `${d.wiring_differences.length} wiring difference(s) being repaired`));
  const wanted = new URLSearchParams(location.hash.split("?")[1] || "").get("block");
  const kept = state.selected !== null && state.route === location.hash;
  const sel = kept ? state.selected : (wanted !== null ? Number(wanted) : null);
  state.route = location.hash;
  // A live redraw keeps the selected block's detail on screen until its new reading is in.
  const shown = kept ? document.getElementById("block-detail") : null;
  if (shown) detail.replaceChildren(...shown.childNodes);
  main.replaceChildren(h("h1", {}, `Superpod ${d.pod_id}`, h("span", { class: "muted" }, ` · ${d.fabric_kind} · ${d.block_count} ${d.switched ? "groups" : "blocks"} of ${d.block_shape}`)),
    h("div", { class: "grid2" }, h("div", {}, svg, legend), h("div", {}, side)));
  if (sel !== null && d.blocks[sel]) selectBlock(svg, d, sel, detail);
}
let blockReads = 0;  // the newest block read wins: an older answer arriving late is dropped
async function selectBlock(svg, d, id, detail) {
  for (const g of svg.querySelectorAll(".block")) g.classList.toggle("selected", Number(g.dataset.block) === id);
  state.selected = id;
  const mine = ++blockReads;
  const r = await fetch(`/api/view/block?${new URLSearchParams({ pod: d.pod_id, id })}`, { credentials: "same-origin" });
  const b = await r.json();
  if (mine !== blockReads) return;
  if (!r.ok) { detail.replaceChildren(h("p", { class: "error" }, b.error.message)); return; }
  detail.replaceChildren(h("h2", {}, d.switched ? `Group ${groupName(d, b.block_id)} (index ${b.block_id})` : `Block ${b.block_id}`),
    h("dl", {}, h("dt", {}, "type"), h("dd", {}, b.node_type), h("dt", {}, "health"), h("dd", {}, stateTag(b.health === "FAILED" ? "FAILED" : "READY"), " ", b.health),
      h("dt", {}, "job"), h("dd", {}, b.job_id ? link(`#/job/${encodeURIComponent(b.job_id)}`, b.job_id) : "free"),
      h("dt", {}, "wiring"), h("dd", {}, b.job_id ? link(`#/slice/${d.pod_id}/${encodeURIComponent(b.job_id)}`, "its slice's cross-connects →") : b.shared ? "none: sub-block slices use the block's own links" : "—"),
      (b.failed_hosts || []).length ? [h("dt", {}, "failed hosts"), h("dd", {}, b.failed_hosts.join(", "))] : null,
      b.shared || (b.failed_hosts || []).length ? [h("dt", {}, "chips free"), h("dd", {}, String(b.chips_free))] : null),
    (b.boxes || []).length ? table(["job", "box (chips)", "at"], b.boxes.map((x) => [link(`#/job/${encodeURIComponent(x.job_id)}`, x.job_id), x.chips.join("x"), coords(x.offset)])) : null,
    b.segments.length ? h("div", { class: "scroll" }, table(["dim", "axis", "end", "OCS port(s)", "1×K"], b.segments.map((g) => [g.dim, g.axis, g.end, g.ports.join(" "), g.one_to_many || "—"])))
      : h("p", { class: "muted" }, d.switched ? "A processor group: its links are ring reservations (below)." : "No segments reported."),
    b.cross_connects.length ? h("p", {}, `${b.cross_connects.length} cross-connects of its slice touch it.`) : null);
}
function switchedPanel(d) {
  const sw = d.switched;
  const busy = sw.switches.filter((x) => (x.down_in_use || 0) + (x.up_in_use || 0) > 0);
  return h("div", {}, h("h2", {}, "Groups and ring reservations"),
    h("p", {}, `${sw.fabric.groups} groups of ${((sw.fabric.config.group_shape || {}).dims || []).join("x")} processors, ${sw.fabric.tier0_switches} tier-0 and ${sw.fabric.tier1_switches} tier-1 switches; ${sw.small_groups.length ? `groups ${sw.small_groups.map((i) => groupName(d, i)).join(", ")} kept for small jobs` : "no group kept for small jobs"}.`),
    sw.rings.length ? table(["job", "tiles", "rings", "channels"], sw.rings.map((r) => [link(`#/job/${encodeURIComponent(r.job_id)}`, r.job_id),
      (r.tiles || []).map((t) => (t.group_name || groupName(d, t.group || 0)) + (sw.small_tiles[r.job_id] ? ` ${tileText(t)}` : "")).join(" "), r.rings, r.channel_count]), [2, 3])
      : h("p", { class: "muted" }, "No ring reservations."),
    h("p", {}, `${busy.length} of ${sw.switches.length} switches carry a ring.`));
}

// -- OCS --------------------------------------------------------------------------------
function heatColour(u) {  // light to dark blue (sequential, readable in greyscale)
  const stops = [[247, 251, 255], [198, 219, 239], [107, 174, 214], [33, 113, 181], [8, 48, 107]];
  const t = Math.max(0, Math.min(1, u)) * (stops.length - 1), i = Math.min(stops.length - 2, Math.floor(t)), f = t - i;
  const c = stops[i].map((v, k) => Math.round(v + (stops[i + 1][k] - v) * f));
  return `rgb(${c.join(",")})`;
}
function renderOcs(main, d) {
  const pods = state.session.pods;
  const pick = h("p", {}, "Pod: ", pods.map((p) => [p === d.pod_id ? h("strong", {}, p) : link(`#/ocs/${p}`, p), " "]));
  if (!d.switches.length) {
    main.replaceChildren(h("h1", {}, `OCS of ${d.pod_id}`), pick, h("p", { class: "muted" }, "This pod has no optical circuit switches (a SWITCHED pod: see its ring reservations on the superpod view)."), link(`#/pod/${d.pod_id}`, "Superpod view →"));
    return;
  }
  // Rows: the logical dimensions (x, y, z); columns: each dimension's axes (a face's
  // segment positions), and under each axis its K switches when K > 1.
  const dims = [...new Set(d.switches.map((x) => x.dim))].sort((a, b) => a - b);
  const rowOf = (dm) => d.switches.filter((x) => x.dim === dm);
  const widest = dims.map(rowOf).reduce((a, b) => (b.length > a.length ? b : a), []);
  const perDim = widest.length, K = Math.max(...d.switches.map((x) => x.k)) + 1;
  const cw = Math.max(22, Math.min(44, Math.floor(1000 / perDim))), ch = 34, left = 74, head = K > 1 ? 36 : 24;
  const H = head + dims.length * (ch + 8) + 4;
  const svg = s("svg", { class: "heat", viewBox: `0 0 ${left + perDim * cw + 10} ${H}`, width: "100%", role: "group", "aria-label": "port use per switch: rows dimensions, columns axes" });
  svg.append(s("text", { x: 4, y: 14, fill: "#57606a", "font-size": 11 }, K > 1 ? "axis / k" : "axis"));
  widest.forEach((x, col) => {
    const cx = left + col * cw + (cw - 2) / 2;
    if (x.k === 0) svg.append(s("text", { class: "axis-label", x: K > 1 ? left + col * cw + (K * cw - 2) / 2 : cx, y: 14, "text-anchor": "middle", "font-size": 11, fill: "#1b1f24" }, String(x.axis)));
    if (K > 1) svg.append(s("text", { x: cx, y: 28, "text-anchor": "middle", "font-size": 9, fill: "#57606a" }, `k${x.k}`));
  });
  dims.forEach((dm, row) => {
    const y0 = head + row * (ch + 8);
    svg.append(s("text", { class: "dim-label", x: 4, y: y0 + ch / 2 + 4, "font-weight": 600 }, `${DIM_NAMES[dm] || dm} (dim ${dm})`));
    rowOf(dm).forEach((x, col) => {
      const g = s("g", { class: "switch", "data-ocs": x.ocs_id, "data-dim": x.dim, "data-axis": x.axis, "data-k": x.k, tabindex: 0, "aria-label": `${x.ocs_id}: dim ${x.dim}, axis ${x.axis}, k ${x.k}: ${x.ports_in_use} of ${x.ports_cabled} ports in use` });
      g.append(s("rect", { x: left + col * cw, y: y0, width: cw - 2, height: ch, fill: heatColour(x.use), stroke: "#57606a", "stroke-width": 0.5 }));
      g.append(s("text", { x: left + col * cw + (cw - 2) / 2, y: y0 + ch / 2 + 4, "text-anchor": "middle", "font-size": cw < 30 ? 9 : 11, fill: x.use > 0.5 ? "#fff" : "#1b1f24" }, String(x.ports_in_use)));
      g.addEventListener("mousemove", (ev) => showTip(ev, `${x.ocs_id} (dim ${x.dim}, axis ${x.axis}, k ${x.k}): ${x.ports_in_use}/${x.ports_cabled} ports in use, radix ${x.radix}`));
      g.addEventListener("mouseleave", hideTip);
      svg.append(g);
    });
  });
  // Whole-block slices use every axis of each block they hold, so in a healthy pod every
  // switch of a dimension reads the same: say so, and name the ones that differ.
  const inUse = d.switches.map((x) => x.ports_in_use), lo = Math.min(...inUse), hi = Math.max(...inUse);
  const cabled = [...new Set(d.switches.map((x) => x.ports_cabled))];
  // (with K > 1 a dimension's k-th switches carry what their 1xK settings send them:
  // alike among themselves, not with the other k)
  const kinds = [...new Set(d.switches.map((x) => `${x.dim}/${x.k}`))];
  const outliers = kinds.flatMap((kind) => {
    const row = d.switches.filter((x) => `${x.dim}/${x.k}` === kind), counts = {};
    for (const x of row) counts[x.ports_in_use] = (counts[x.ports_in_use] || 0) + 1;
    const usual = Number(Object.entries(counts).sort((a, b) => b[1] - a[1])[0][0]);
    return row.filter((x) => x.ports_in_use !== usual);
  });
  const even = lo === hi
    ? `Every switch has ${lo} of ${cabled.join("/")} cabled ports in use: a slice of whole blocks uses every axis of its blocks in each dimension, so even use is what a healthy pod shows.`
    : `Ports in use per switch: ${lo} to ${hi} (of ${cabled.join("/")} cabled)${K > 1 ? "; the switches of one dimension and k alike" : ""}.` + (outliers.length ? ` Unlike the rest of their dimension: ${outliers.slice(0, 12).map((x) => `${x.ocs_id} (${x.ports_in_use})`).join(", ")}${outliers.length > 12 ? ", …" : ""} — \`lightpath ocs check --compare-switches\` compares them with what the switches hold.` : "");
  const scale = h("div", { class: "legend" }, "port use: ", [0, 0.25, 0.5, 0.75, 1].map((u) => h("span", {},
    s("svg", { width: 18, height: 14, "aria-hidden": "true" }, s("rect", { width: 18, height: 14, fill: heatColour(u), stroke: "#57606a" })), ` ${u * 100}%`)),
    h("span", { class: "muted" }, "(the number in a cell: its ports in use)"));
  const top = [...d.switches].sort((a, b) => b.use - a.use).slice(0, 8).filter((x) => x.ports_in_use);
  const oneK = d.one_to_many.length ? h("div", { class: "scroll" }, table(["1×K switch", "block", "dim", "axis", "selected output", "job"],
    d.one_to_many.slice(0, 300).map((o) => [o.switch_id, link(`#/pod/${d.pod_id}?block=${o.block_id}`, o.block_id), o.dim, o.axis,
      o.selected >= 0 ? `${o.selected} → ${o.outputs[o.selected] || "?"}` : "idle", o.job_id ? link(`#/job/${encodeURIComponent(o.job_id)}`, o.job_id) : "—"])))
    : h("p", { class: "muted" }, "No 1×K switches (K = 1: every segment is cabled straight to its OCS).");
  main.replaceChildren(h("h1", {}, `OCS of ${d.pod_id}`), pick,
    h("p", { class: "muted" }, `${d.switches.length} switches; rows: logical dimension, columns: axis${K > 1 ? ` and, under each, its ${K} switches (k)` : ""}; the number: ports in use.`),
    svg, scale, h("p", { id: "ocs-summary" }, even),
    h("div", { class: "grid2" },
      h("div", {}, h("h2", {}, "1×K switch states"), oneK),
      h("div", {}, h("h2", {}, "Busiest switches"), lo === hi && hi ? h("p", { class: "muted" }, "All alike (above).") : top.length ? table(["OCS", "in use", "cabled"], top.map((x) => [x.ocs_id, x.ports_in_use, x.ports_cabled]), [1, 2]) : h("p", { class: "muted" }, "No port in use."),
        h("p", {}, link(`#/pod/${d.pod_id}`, "Block map of this pod →")))));
}
function renderSlice(main, d) {
  const byOcs = {};
  for (const c of d.cross_connects) (byOcs[c.ocs_id] = byOcs[c.ocs_id] || []).push(c);
  main.replaceChildren(h("h1", {}, `Slice of ${d.job_id} `, stateTag(d.state)),
    h("p", {}, `Grid ${d.grid} of blocks on `, link(`#/pod/${d.pod_id}`, d.pod_id), ` · ${d.cross_connects.length} cross-connects on ${Object.keys(byOcs).length} switches · ${d.one_to_many.length} 1×K settings · `,
      link(`#/job/${encodeURIComponent(d.job_id)}`, "job →"), " ", link(`#/ocs/${d.pod_id}`, "OCS heat map →")),
    h("h2", {}, "Blocks"), h("p", {}, d.blocks.map((b) => [link(`#/pod/${d.pod_id}?block=${b.block_id}`, `block ${b.block_id}`), ` at (${b.position.join(",")})  `])),
    h("h2", {}, "Cross-connects"),
    h("div", { class: "scroll" }, table(["OCS", "port a", "port b", "from (block, dim, axis)", "to (block, dim, axis)"],
      d.cross_connects.slice(0, 1000).map((c) => [c.ocs_id, c.port_a, c.port_b, c.a.join(", "), c.b.join(", ")]), [1, 2])));
}

// -- Core broker ------------------------------------------------------------------------
function renderCores(main, d) {
  if (!d.devices.length) {
    main.replaceChildren(h("h1", {}, "Core broker"), h("p", { class: "muted" }, "No devices registered (`lightpath cores devices` lists them; `lightpath demo` registers some)."));
    return;
  }
  useColours("cores", d.devices.flatMap((dev) => dev.bars.map((b) => b.reservation_id)));
  const left = 150, W = 1100, rowH = 44, span = d.end - d.start, top = 34;
  const X = (t) => left + ((t - d.start) / span) * (W - left - 10);
  const svg = s("svg", { viewBox: `0 0 ${W} ${d.devices.length * (rowH + 14) + top + 16}`, width: "100%", role: "group", "aria-label": `reservations per device from now to ${offset(span)}` });
  const bottom = d.devices.length * (rowH + 14) + top + 6;
  for (let k = 0; k * d.tick <= span + 1e-6; k++) {  // a tick every d.tick s: "+10 min", "+1 h"
    const x = X(d.start + k * d.tick), last = (k + 1) * d.tick > span + 1e-6;
    svg.append(s("line", { x1: x, y1: top - 6, x2: x, y2: bottom, stroke: "#d0d7de" }),
      s("text", { class: "tick", x: x + (k === 0 ? 2 : last ? -2 : 0), y: 11, fill: "#57606a", "text-anchor": k === 0 ? "start" : last ? "end" : "middle" }, k === 0 ? "now" : offset(k * d.tick)),
      s("text", { x: x + (k === 0 ? 2 : last ? -2 : 0), y: 24, fill: "#8c959f", "font-size": 9, "text-anchor": k === 0 ? "start" : last ? "end" : "middle" }, k === 0 ? "" : clock(d.start + k * d.tick)));
  }
  d.devices.forEach((dev, i) => {
    const y0 = top + i * (rowH + 14);
    svg.append(s("text", { x: 4, y: y0 + 14, "font-weight": 600 }, dev.device_id), s("text", { x: 4, y: y0 + 28, fill: "#57606a" }, `${dev.kind}, ${dev.cores} cores`));
    svg.append(s("rect", { x: left, y: y0, width: W - left - 10, height: rowH, fill: "#f6f8fa", stroke: "#d0d7de" }));
    // free capacity: a step line, full height = every core free
    let path = "";
    dev.free.forEach(([t, free], k) => {
      const x = X(t), y = y0 + rowH - (free / dev.cores) * rowH, nx = k + 1 < dev.free.length ? X(dev.free[k + 1][0]) : X(d.end);
      path += `${k ? "L" : "M"}${x},${y} L${nx},${y} `;
    });
    // reservations stack from the bottom: a bar sits on the bars before it that overlap it
    const placed = [];
    dev.bars.forEach((b) => {
      const hgt = (b.cores / dev.cores) * rowH;
      const below = placed.filter((p) => p.start < b.end && b.start < p.end).reduce((n, p) => n + p.hgt, 0);
      placed.push({ ...b, hgt });
      const g = s("g", { class: "resv", tabindex: 0, "data-reservation": b.reservation_id, "aria-label": `${b.reservation_id}: ${b.cores} cores ${when(b.start)}–${when(b.end)}` });
      g.append(s("rect", { x: X(b.start), y: y0 + rowH - below - hgt, width: Math.max(2, X(b.end) - X(b.start)), height: Math.max(2, hgt), fill: colourOf(b.reservation_id), stroke: "#fff", "stroke-width": 0.5 }));
      if (X(b.end) - X(b.start) > 60 && hgt >= 12) g.append(s("text", { x: X(b.start) + 3, y: y0 + rowH - below - hgt / 2 + 4, fill: "#fff", "font-size": 10 }, `${b.reservation_id} · ${b.cores}`));
      g.addEventListener("mousemove", (ev) => showTip(ev, `${b.reservation_id}: ${b.cores} cores, ${when(b.start)} – ${when(b.end)}`));
      g.addEventListener("mouseleave", hideTip);
      svg.append(g);
    });
    svg.append(s("path", { d: path, fill: "none", stroke: "#116329", "stroke-width": 2, "stroke-dasharray": "5 3" }));
  });
  const swatch = (id) => s("svg", { width: 12, height: 12, "aria-hidden": "true" }, s("rect", { width: 12, height: 12, fill: colourOf(id) }));
  const resv = d.reservations.length ? h("div", { class: "scroll" }, table(["", "reservation", "application", "state", "cores", "devices", "starts", "ends", "lasts"],
    d.reservations.slice(0, 500).map((r) => [swatch(r.reservation_id), r.reservation_id, r.application_id, stateTag(r.state), r.cores,
      r.devices.map((x) => `${x.device_id} ×${x.cores}`).join(", "),
      r.starts_in_s <= 0 ? `${when(r.start)} (started)` : `${when(r.start)} (in ${offset(r.starts_in_s).slice(1)})`,
      `${when(r.end)} (in ${offset(r.ends_in_s).slice(1)})`, offset(r.end - r.start).slice(1)]), [4]))
    : h("p", { class: "muted" }, "No live reservations (`lightpath cores reserve` makes one).");
  const more = d.reservations.length > 500 || !d.reservations_complete ? h("p", { class: "muted" }, "Only the first reservations are shown; `lightpath cores list --all` lists every one.") : null;
  main.replaceChildren(h("h1", {}, "Core broker"),
    h("p", { class: "muted" }, `Reservations per device from now to ${offset(span)} (${d.reservations.length ? "the last live reservation ends by then" : "no live reservation"}), stacked from the bottom (height: cores); the dashed green line is the free cores (at the top: all free).`),
    svg, h("h2", {}, `Live reservations (${d.reservations.length})`), resv, ...(more ? [more] : []), h("h2", {}, "Devices now"),
    table(["device", "kind", "cores", "free in window", "peak reserved"], d.devices.map((x) => [x.device_id, x.kind, x.cores, x.free_cores, x.peak_reserved]), [2, 3, 4]));
}
// "+10 min", "+1 h 30 min", "+2 d": a time from now in the units a person reads.
function offset(sec) {
  const m = Math.round(sec / 60);
  if (m < 60) return `+${m} min`;
  if (m < 1440) return `+${Math.floor(m / 60)} h${m % 60 ? ` ${m % 60} min` : ""}`;
  return `+${Math.floor(m / 1440)} d${Math.floor((m % 1440) / 60) ? ` ${Math.floor((m % 1440) / 60)} h` : ""}`;
}
function clock(unix) { return new Date(unix * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" }); }

// -- Aggregation ------------------------------------------------------------------------
function renderAgg(main, d) {
  if (!d.nodes.length) {
    main.replaceChildren(h("h1", {}, `Aggregation tree ${d.tree_id}`), h("p", { class: "muted" }, "No topology defined yet (`lightpath agg topology` defines one; `lightpath demo` does)."),
      switchTable(d));
    return;
  }
  const children = {};
  for (const n of d.nodes) (children[n.parent] = children[n.parent] || []).push(n);
  const levels = [];
  const walk = (id, depth) => { (levels[depth] = levels[depth] || []).push(id); for (const c of children[id] || []) walk(c.id, depth + 1); };
  for (const r of children[""] || []) walk(r.id, 0);
  const W = 1100, lh = 90, pos = {};
  levels.forEach((ids, depth) => ids.forEach((id, i) => { pos[id] = [((i + 0.5) * W) / ids.length, 30 + depth * lh]; }));
  const svg = s("svg", { viewBox: `0 0 ${W} ${levels.length * lh + 20}`, width: "100%", role: "group", "aria-label": "aggregation tree" });
  for (const n of d.nodes) if (n.parent && pos[n.parent]) svg.append(s("line", { x1: pos[n.id][0], y1: pos[n.id][1], x2: pos[n.parent][0], y2: pos[n.parent][1] + 24, stroke: "#8c959f" }));
  for (const n of d.nodes) {
    const [x, y] = pos[n.id] || [0, 0];
    const st = d.switches[n.id];
    const isSwitch = n.kind.includes("SWITCH");
    const g = s("g", { class: "aggnode", "data-node": n.id });
    if (isSwitch && d.switches_shown === false) {  // a tenant: the tree, not the slots
      g.append(s("rect", { x: x - 70, y: y - 4, width: 140, height: 30, rx: 4, fill: "#fff", stroke: "#0b5394", "stroke-width": 2 }),
        s("text", { x: x - 64, y: y + 15, "font-weight": 600 }, `${n.id} (switch)`));
    } else if (isSwitch) {
      const used = st && !st.error ? st.slots_in_use : 0, total = st && !st.error ? st.slots_total : 0;
      g.append(s("rect", { x: x - 70, y: y - 4, width: 140, height: 44, rx: 4, fill: "#fff", stroke: "#0b5394", "stroke-width": 2 }),
        s("text", { x: x - 64, y: y + 10, "font-weight": 600 }, `${n.id} (switch)`),
        s("rect", { x: x - 64, y: y + 16, width: 128, height: 8, fill: "#d0d7de" }),
        s("rect", { x: x - 64, y: y + 16, width: total ? (128 * used) / total : 0, height: 8, fill: "#0b5394" }),
        s("text", { x: x - 64, y: y + 36, "font-size": 10 }, st && st.error ? "unreachable" : `slots ${used}/${total}${st && st.bypass.length ? ` · ${st.bypass.length} bypass` : ""}`));
    } else {
      g.append(s("circle", { cx: x, cy: y + 10, r: 8, fill: n.id === d.timeout_aggregator ? "#E69F00" : "#f6f8fa", stroke: "#57606a" }),
        s("text", { x: x - 20, y: y + 34, "font-size": 10 }, n.id + (n.id === d.timeout_aggregator ? " (TA)" : "")));
    }
    svg.append(g);
  }
  main.replaceChildren(h("h1", {}, `Aggregation tree ${d.tree_id}`), svg, switchTable(d),
    h("h2", {}, "Recent commands"),
    d.commands.length ? table(["command", "tenant", "state", "participants", "chunks", "timed out", "age"],
      d.commands.map((c) => [c.command_id, c.tenant, stateTag(c.state), c.participants, c.chunks, c.timeout_nodes.join(" ") || "—", ago(c.age_s)]), [3, 4])
      : h("p", { class: "muted" }, "No commands yet."));
}
function switchTable(d) {
  if (d.switches_shown === false) return h("p", { class: "muted" }, "The switches' slots and bypass entries are the operators' view; this sign-in sees its tree and its own commands.");
  const rows = Object.entries(d.switches).map(([id, st]) => st.error ? [id, h("span", { class: "state FAILED" }, "unreachable"), st.error, "", ""]
    : [id, usebar(st.slots_in_use, st.slots_total, `${id} slots in use`), st.parked, st.bypass.length,
      st.bypass.slice(0, 5).map((b) => `${b.command_id}#${b.chunk} → ${b.timeout_node}`).join(", ") || "—"]);
  return h("div", {}, h("h2", {}, "Switches"), table(["switch", "slots", "parked", "bypass entries", "live bypass (command#chunk → timeout node)"], rows, [2, 3]));
}

// -- start ------------------------------------------------------------------------------
window.addEventListener("hashchange", () => { state.selected = null; route(); });
document.addEventListener("DOMContentLoaded", async () => {
  document.body.append(tip);
  await loadSession();
  route();
});
