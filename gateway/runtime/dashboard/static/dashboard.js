// mqgw dashboard: renders /dashboard/api/snapshot (pushed as server-sent events, polled
// when they fail). Vanilla JS, no build step; data is written with textContent only.
"use strict";
(function () {
  const SNAPSHOT = "/dashboard/api/snapshot";
  const EVENTS = "/dashboard/api/events";
  const POLL_MS = 2000;
  const SVG_NS = "http://www.w3.org/2000/svg";
  let last = null;
  let pollTimer = null;

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v !== undefined && v !== null) node.setAttribute(k, v);
    }
    for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    return node;
  }
  function badge(word, kind) { return el("span", { class: "badge " + kind }, word); }
  function fmtAge(s) {
    if (s === null || s === undefined) return "–";
    if (s < 60) return s.toFixed(0) + " s";
    if (s < 3600) return (s / 60).toFixed(0) + " min";
    return (s / 3600).toFixed(1) + " h";
  }
  function fmtRate(r) { return r.toFixed(r >= 10 ? 0 : 1); }
  function fill(tableId, rows, emptyText, columns) {
    const body = document.querySelector("#" + tableId + " tbody");
    body.replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { colspan: columns, class: "muted" }, emptyText))]));
  }
  function streamLink(name) { return el("a", { href: "#/stream/" + encodeURIComponent(name), "data-stream-link": name }, name); }

  function renderGateway(s) {
    const g = s.gateway;
    document.getElementById("gw-title").textContent = g.gateway_id + " on " + g.q_mgr;
    const facts = [
      ["Gateway", g.gateway_id], ["Queue manager", g.q_mgr], ["Version", g.version],
      ["Uptime", fmtAge(g.uptime_s)],
      ["Health", badge(g.health, g.health === "ok" ? "ok" : "bad")],
      ["Broker", badge(g.broker_serving ? "serving" : "not serving", g.broker_serving ? "ok" : "bad")],
      ["Problems", g.problems.length ? g.problems.join("; ") : "none"],
    ];
    document.getElementById("gateway").replaceChildren(
      ...facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", { "data-fact": k }, v)]));
  }

  function renderNeighbours(s) {
    fill("neighbours", s.neighbours.map((n) => el("tr", { "data-neighbour": n.q_mgr },
      el("td", {}, n.q_mgr),
      el("td", { "data-status": n.state }, badge(n.state, n.active ? "ok" : "bad")),
      el("td", {}, n.kind + " / " + n.role),
      el("td", {}, n.last_heard_age_s === null ? "never" : fmtAge(n.last_heard_age_s) + " ago"),
      el("td", {}, n.streams.join(", ")),
      el("td", { class: "num" }, n.proxy_subscriptions),
    )), "No neighbours configured.", 6);
  }

  function flowList(flows) {
    if (!flows.length) return el("span", { class: "muted" }, "none");
    return el("ul", { class: "flows" }, ...flows.map((f) =>
      el("li", {}, (f.direction === "out" ? "→ " : "← ") + f.kind + " " + f.target + " (" + f.plugin + ")")));
  }

  function renderStreams(s) {
    fill("streams", s.streams.map((st) => el("tr", { "data-stream": st.name },
      el("th", { scope: "row" }, streamLink(st.name)),
      el("td", {}, badge(st.serviced ? "yes" : "NO", st.serviced ? "ok" : "bad")),
      el("td", { class: "num", "data-depth": "" }, st.depth),
      el("td", { class: "num" }, fmtAge(st.oldest_age_s)),
      el("td", { class: "num", "data-rate-in": st.rate_in }, fmtRate(st.rate_in)),
      el("td", { class: "num", "data-rate-out": st.rate_out }, fmtRate(st.rate_out)),
      el("td", { class: "num" }, st.dead_lettered),
      el("td", {}, flowList(st.flows)),
    )), "No streams.", 8);
  }

  function renderRoutes(s) {
    fill("routes", s.routes.map((r) => el("tr", { "data-route": r.name },
      el("td", {}, r.name), el("td", {}, r.side + " (" + r.plugin + ")"),
      el("td", {}, r.source + " → " + r.destination),
      el("td", { class: "num" }, r.in_flight),
    )), "No request/reply routes.", 4);
  }

  function renderDeadLetters(s) {
    const depth = s.dead_letter_depth === null ? "unknown" : s.dead_letter_depth;
    document.getElementById("dlq-summary").textContent = s.dead_letter_queue + " holds " + depth + " message(s).";
    const rows = s.dead_letters.filter((d) => d.count > 0);
    fill("dead-letters", rows.map((d) => el("tr", { "data-dead-letter": d.source + "|" + d.reason },
      el("td", {}, d.source), el("td", {}, d.reason), el("td", { class: "num", "data-count": d.count }, d.count),
    )), "Nothing dead-lettered since the gateway started.", 3);
  }

  function renderNetworkCheck(s) {
    const problems = s.network_problems || [];
    const count = s.network_problem_count || 0;
    document.getElementById("network-check-summary").textContent =
      "What this gateway sees of the network on its own (its definitions and links); " +
      "mqgw network check with every node checks the whole network." +
      (count > problems.length ? " Showing " + problems.length + " of " + count + " problems." : "");
    fill("network-problems", problems.map((p) => el("tr", { "data-network-problem": p.code },
      el("td", {}, badge(p.code, "bad")), el("td", {}, p.subject), el("td", {}, p.text),
    )), "No network problems seen from here.", 3);
  }

  function renderPlugins(s) {
    fill("plugins", s.plugins.map((p) => el("tr", { "data-plugin": p.name },
      el("td", {}, p.name), el("td", {}, p.kind),
      el("td", {}, badge(p.status, p.status === "healthy" ? "ok" : "bad")),
    )), "No plugin instances.", 3);
  }

  // ---- network picture: neighbours left, gateway centre, plugin targets right -----
  function svg(tag, attrs, text) {
    const node = document.createElementNS(SVG_NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    return node;
  }
  function box(parent, x, y, w, h, lines, cls) {
    const g = svg("g", { class: "node " + cls });
    g.append(svg("rect", { x: x, y: y, width: w, height: h, rx: 6 }));
    lines.forEach((line, i) => g.append(svg("text", { x: x + 8, y: y + 17 + i * 15 }, line)));
    parent.append(g);
  }
  function renderNetwork(s) {
    const targets = [];
    const seen = new Set();
    for (const st of s.streams) {
      for (const f of st.flows) {
        const key = f.plugin + "|" + f.direction + "|" + f.target;
        if (!seen.has(key)) { seen.add(key); targets.push(f); }
      }
    }
    const rows = Math.max(s.neighbours.length, targets.length, 1);
    const H = Math.max(160, rows * 52 + 30), W = 900;
    const root = svg("svg", { viewBox: "0 0 " + W + " " + H, role: "img", "aria-labelledby": "net-title net-desc" });
    const active = s.neighbours.filter((n) => n.active).length;
    root.append(svg("title", { id: "net-title" }, "Network of " + s.gateway.q_mgr));
    root.append(svg("desc", { id: "net-desc" }, s.neighbours.length + " neighbour(s), " + active +
      " active; " + targets.length + " plugin route(s)."));
    const gx = 360, gw = 180, gh = 58, gy = H / 2 - gh / 2;
    const place = (i, n) => 15 + (H - 30) * (i + 0.5) / n - 22;
    s.neighbours.forEach((n, i) => {
      const y = place(i, s.neighbours.length);
      root.append(svg("path", { class: "edge" + (n.active ? "" : " inactive"), d: "M220," + (y + 22) + " L" + gx + "," + (gy + gh / 2) }));
      box(root, 10, y, 210, 44, [n.q_mgr, n.state + " · " + n.streams.length + " stream(s)"], n.active ? "active" : "inactive");
    });
    targets.forEach((f, i) => {
      const y = place(i, targets.length);
      const label = f.target.length > 30 ? f.target.slice(0, 29) + "…" : f.target;
      root.append(svg("path", { class: "edge", d: "M" + (gx + gw) + "," + (gy + gh / 2) + " L640," + (y + 22) }));
      box(root, 640, y, 250, 44, [(f.direction === "out" ? "→ " : "← ") + f.kind + " " + label, "via " + f.plugin], "target");
    });
    box(root, gx, gy, gw, gh, [s.gateway.q_mgr, "gateway " + s.gateway.health], "gateway");
    if (!s.neighbours.length) root.append(svg("text", { x: 20, y: H / 2 }, "no neighbours"));
    document.getElementById("network").replaceChildren(root);
  }

  // ---- per-stream details ---------------------------------------------------------
  // The view: a "#/..." hash wins (so "#/" leaves /dashboard/stream/NAME for the
  // overview); without one, the path /dashboard/stream/NAME. A bad escape is no stream.
  function currentStream() {
    const m = location.hash.startsWith("#/")
      ? location.hash.match(/^#\/stream\/(.+)$/)
      : location.pathname.match(/\/dashboard\/stream\/([^/]+)$/);
    if (!m) return null;
    try { return decodeURIComponent(m[1]); } catch (e) { return m[1]; }
  }
  function renderStreamView(s, name) {
    const st = s.streams.find((x) => x.name === name);
    document.getElementById("h-stream").textContent = "Stream " + name;
    const facts = st ? [
      ["Serviced", st.serviced ? "yes" : "no"], ["Queue", st.queue_exists ? "exists" : "MISSING"],
      ["Depth", st.depth], ["Oldest message", fmtAge(st.oldest_age_s)],
      ["Rate in", fmtRate(st.rate_in) + " msg/s (" + st.total_in + " in total)"],
      ["Rate out", fmtRate(st.rate_out) + " msg/s (" + st.total_out + " in total)"],
      ["Dead-lettered (2085)", st.dead_lettered], ["Wanted by", st.wanted_by.join(", ") || "–"],
      ["Neighbours", st.neighbours.join(", ") || "none"],
    ] : [["Stream", "not known to this gateway"]];
    document.getElementById("stream-facts").replaceChildren(
      ...facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", { "data-fact": k }, v)]));
    fill("stream-flows", (st ? st.flows : []).map((f) => el("tr", {},
      el("td", {}, f.direction === "out" ? "feeds (out)" : "fed by (in)"), el("td", {}, f.plugin),
      el("td", {}, f.kind), el("td", {}, f.target))), "No plugin routes.", 4);
    const problems = st && st.problems.length ? st.problems : ["none"];
    document.getElementById("stream-problems").replaceChildren(...problems.map((p) => el("li", {}, p)));
  }

  function render(s) {
    last = s;
    // a redraw every second must not take the keyboard focus away from a stream link
    const active = document.activeElement;
    const focused = active && active.getAttribute ? active.getAttribute("data-stream-link") : null;
    const name = currentStream();
    document.getElementById("overview").hidden = name !== null;
    document.getElementById("stream-view").hidden = name === null;
    renderGateway(s);
    if (name !== null) {
      renderStreamView(s, name);
    } else {
      renderNetwork(s); renderNeighbours(s); renderStreams(s); renderRoutes(s);
      renderDeadLetters(s); renderPlugins(s); renderNetworkCheck(s);
    }
    document.getElementById("updated").textContent = new Date(s.generated_at * 1000).toLocaleTimeString();
    document.body.setAttribute("data-generated-at", String(s.generated_at));
    if (focused !== null && document.activeElement !== active) {
      const again = document.querySelector('a[data-stream-link="' + CSS.escape(focused) + '"]');
      if (again) again.focus();
    }
  }

  function setConn(word, kind) {
    const c = document.getElementById("conn");
    if (c.textContent === word) return; // a live region: announce changes only
    c.textContent = word; c.className = "badge " + kind;
  }

  async function poll() {
    try {
      const r = await fetch(SNAPSHOT, { cache: "no-store", credentials: "same-origin" });
      if (!r.ok) throw new Error(String(r.status));
      render(await r.json());
      setConn("live (polling)", "ok");
    } catch (e) {
      setConn("disconnected", "bad");
    }
    pollTimer = setTimeout(poll, POLL_MS);
  }

  function startEvents() {
    if (!window.EventSource) { poll(); return; }
    const source = new EventSource(EVENTS);
    let failures = 0;
    source.addEventListener("snapshot", (e) => {
      failures = 0;
      setConn("live", "ok");
      render(JSON.parse(e.data));
    });
    // A refused stream (503 when too many are open, any non-200) is CLOSED for good and
    // the browser will not retry it; a stream that keeps dropping is given up after three
    // tries. Either way the page polls the snapshot instead.
    source.onerror = () => {
      failures += 1;
      if (source.readyState === EventSource.CLOSED || failures >= 3) {
        source.close();
        if (pollTimer === null) poll();
        return;
      }
      setConn("reconnecting", "warn");
    };
  }

  window.addEventListener("hashchange", () => {
    if (last) render(last);
    const target = currentStream() === null ? document.getElementById("h-streams") : document.getElementById("h-stream");
    if (target) { target.setAttribute("tabindex", "-1"); target.focus(); }
  });
  document.addEventListener("DOMContentLoaded", startEvents);
})();
