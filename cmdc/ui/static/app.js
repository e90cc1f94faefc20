// cmdc's web page: live updates from /events (server-sent events). Plain JavaScript, no build
// step. Text only ever goes into the page through textContent (never innerHTML), and fragments
// re-read from the server replace nodes that the server already escaped.
(function () {
  "use strict";
  const body = document.body;
  if (body.dataset.live !== "1" || !window.EventSource) return;
  const agent = body.dataset.agent || null;
  const badge = document.getElementById("live");
  const BAR = 160;

  function fmt(n) { return n === null || n === undefined ? "\u2014" : n.toLocaleString("en-US"); }
  function clock(t) {
    if (t === null || t === undefined) return "\u2014";
    const d = new Date(t * 1000), p = (x) => String(x).padStart(2, "0");
    return d.getFullYear() + "-" + p(d.getMonth() + 1) + "-" + p(d.getDate()) + " " +
      p(d.getHours()) + ":" + p(d.getMinutes()) + ":" + p(d.getSeconds());
  }
  function text(tr, sel, value) { const el = tr.querySelector(sel); if (el) el.textContent = value; }

  let reloading = false;
  function reloadSoon() {
    if (reloading) return;
    reloading = true;
    setTimeout(() => location.reload(), 1500);
  }

  function update(r) {
    const tr = document.getElementById("a-" + r.name);
    if (!tr) { reloadSoon(); return; }  // a new agent: the server renders its row
    const st = tr.querySelector("td.state span");
    if (st) { st.textContent = r.state; st.className = "st st-" + r.state.replace(/ /g, "-"); }
    text(tr, "td.tokens", fmt(r.tokens));
    text(tr, "td.trig", fmt(r.trigger));
    text(tr, "td.win", fmt(r.window));
    text(tr, "td.comp", fmt(r.compactions));
    text(tr, "td.auto", fmt(r.auto));
    text(tr, "td.forced", fmt(r.forced));
    text(tr, "td.failed", fmt(r.failed));
    text(tr, "td.last", clock(r.last));
    const tokens = r.tokens || 0;
    const scale = r.window || Math.max(tokens, r.trigger || 0, 1) * 1.15;
    const fill = tr.querySelector("svg.bar rect.fill");
    if (fill) {
      fill.setAttribute("width", String(Math.min(BAR, Math.floor(BAR * tokens / scale))));
      fill.setAttribute("class", "fill" + (r.trigger !== null && tokens >= r.trigger ? " over" : ""));
    }
    text(tr, "svg.bar title", fmt(r.tokens) + " tokens; trigger " + fmt(r.trigger) + "; window " + fmt(r.window));
    tr.classList.remove("flash"); void tr.offsetWidth; tr.classList.add("flash");
  }

  let busy = false, again = false;
  async function refresh() {  // one agent's page: re-read it and swap its main part
    if (busy) { again = true; return; }
    busy = true;
    try {
      const resp = await fetch(location.href, { credentials: "same-origin" });
      if (resp.ok) {
        const doc = new DOMParser().parseFromString(await resp.text(), "text/html");
        const fresh = doc.querySelector("main"), main = document.querySelector("main");
        if (fresh && main) main.replaceChildren(...Array.from(fresh.childNodes).map((n) => document.adoptNode(n)));
        body.dataset.refreshed = String(Number(body.dataset.refreshed || "0") + 1);
      }
    } catch (e) { /* the next update tries again */ }
    await new Promise((ok) => setTimeout(ok, 1000));
    busy = false;
    if (again) { again = false; refresh(); }
  }

  const events = new EventSource("/events" + (agent ? "?agent=" + encodeURIComponent(agent) : ""));
  events.onopen = () => { badge.textContent = "live"; badge.className = "live on"; };
  events.onerror = () => { badge.textContent = "reconnecting\u2026"; badge.className = "live off"; };
  events.onmessage = (ev) => {
    let d;
    try { d = JSON.parse(ev.data); } catch (e) { return; }
    body.dataset.updates = String(Number(body.dataset.updates || "0") + 1);
    if (agent) { refresh(); return; }
    if (d.all) {
      fetch("/api/agents", { credentials: "same-origin" }).then((r) => r.json()).then((rows) => rows.forEach(update));
      return;
    }
    (d.rows || []).forEach(update);
  };
})();
