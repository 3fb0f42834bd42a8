"""The landing page's script and style sheet, served as ``/static/app.js`` and
``/static/app.css`` from the exporter's own origin, so the page runs under a
Content-Security-Policy that allows no inline script or style.

The script polls ``/api/v1/history?since=<last time it has>`` (only the new samples, from
the ring buffer) every collection interval, at least a second apart, and redraws the
charts drawn server-side by exporter.landing with the same geometry (a 300 x 60 viewBox,
the samples of the last ``--web.history`` seconds, a gap where a value is unknown), and
refills each GPU's ``div.processes`` from the reply's ``processes`` with DOM methods only:
process names are user-controlled text, so they go in through ``textContent``, never as
markup. Without JavaScript the page is the same, frozen at load.
"""

from __future__ import annotations

APP_JS = """\
"use strict";
(function () {
  var W = 300, H = 60, MIN_SPAN = 30;
  var body = document.body;
  var span = parseFloat(body.dataset.window), every = parseFloat(body.dataset.interval);
  var data = {}, units = {}, since = 0, serverNow = 0;

  function top(values, high) {
    if (high > 0) return high;
    var m = 0;
    for (var i = 0; i < values.length; i++) if (values[i] !== null && values[i] > m) m = values[i];
    return 1.25 * m || 1;
  }

  function path(col, key, high) {
    var values = col[key], scale = top(values, high), d = [], pen = "M", n = 0;
    var width = col.t.length ? Math.min(span, Math.max(MIN_SPAN, serverNow - col.t[0])) : span;
    for (var i = 0; i < col.t.length; i++) {
      var v = values[i];
      if (v === null || v === undefined) { pen = "M"; continue; }
      var x = Math.max(0, W - (serverNow - col.t[i]) / width * W);
      var y = H - Math.min(Math.max(v / scale, 0), 1) * H;
      d.push(pen + x.toFixed(1) + "," + y.toFixed(1));
      pen = "L"; n++;
    }
    return [d.join(" "), n];
  }

  function last(values) {
    for (var i = values.length - 1; i >= 0; i--) if (values[i] !== null) return values[i];
    return null;
  }

  function draw() {
    document.querySelectorAll("svg.chart").forEach(function (svg) {
      var col = data[svg.dataset.gpu];
      if (!col || !col[svg.dataset.key]) return;
      var drawn = path(col, svg.dataset.key, parseFloat(svg.dataset.max));
      svg.querySelector("path").setAttribute("d", drawn[0]);
      svg.dataset.points = String(drawn[1]);
    });
    document.querySelectorAll("[data-last]").forEach(function (el) {
      var col = data[el.dataset.gpu];
      if (!col || !col[el.dataset.last]) return;
      var v = last(col[el.dataset.last]);
      el.textContent = v === null ? "\\u2013" : v.toFixed(0) + " " + units[el.dataset.last];
    });
  }

  function note(text) {
    var p = document.createElement("p");
    p.className = "none";
    p.textContent = text;
    return p;
  }

  function row(section, cells, tag) {
    var tr = section.insertRow();
    cells.forEach(function (text) {
      var cell = document.createElement(tag);
      cell.textContent = text;
      tr.appendChild(cell);
    });
  }

  function gib(bytes) {
    return bytes === null ? "\u2013" : (bytes / 1073741824).toFixed(2) + " GiB";
  }

  function tables(processes) {
    document.querySelectorAll("div.processes").forEach(function (box) {
      var top = processes[box.dataset.gpu];
      if (!top) return;  // GPU down or forgotten: keep what is shown
      var table = document.createElement("table"), rows = table.createTBody();
      row(table.createTHead(), ["pid", "process", "memory", "pod", "container"], "th");
      top.rows.forEach(function (p) {
        row(rows, [String(p.pid), p.process, gib(p.memory_bytes), p.pod, p.container], "td");
      });
      box.replaceChildren(top.rows.length ? table : note("No processes reported."));
      if (top.more > 0) box.appendChild(note("and " + top.more + " more"));
      box.dataset.updated = String(serverNow);  // when this table was last refilled
    });
  }

  function merge(reply) {
    serverNow = reply.now;
    reply.series.forEach(function (s) { units[s.key] = s.unit; });
    reply.gpus.forEach(function (g) {
      var col = data[g.gpu];
      if (!col) {
        col = data[g.gpu] = {t: []};
        reply.series.forEach(function (s) { col[s.key] = []; });
      }
      for (var i = 0; i < g.t.length; i++) {
        col.t.push(g.t[i]);
        reply.series.forEach(function (s) { col[s.key].push(g[s.key][i]); });
        if (g.t[i] > since) since = g.t[i];
      }
      var old = 0;
      while (old < col.t.length && col.t[old] < serverNow - span) old++;
      if (old) Object.keys(col).forEach(function (k) { col[k].splice(0, old); });
    });
  }

  function refresh() {
    var live = document.getElementById("live");
    fetch("/api/v1/history" + (since ? "?since=" + since : ""), {cache: "no-store"})
      .then(function (r) { if (!r.ok) throw new Error("HTTP " + r.status); return r.json(); })
      .then(function (reply) {
        merge(reply);
        draw();
        tables(reply.processes || {});
        body.dataset.live = "1";
        if (live) live.textContent = "Live, updated " + new Date().toLocaleTimeString() + ".";
      })
      .catch(function (e) { if (live) live.textContent = "Not updating: " + e.message; })
      .then(function () { setTimeout(refresh, Math.max(1000, every * 1000)); });
  }

  refresh();
})();
"""

APP_CSS = """\
body { font-family: system-ui, sans-serif; margin: 1em 2em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0; }
td, th { border: 1px solid #bbb; padding: 0.2em 0.6em; text-align: left; }
section.gpu { border-top: 1px solid #ddd; margin-top: 1em; }
.charts { display: flex; flex-wrap: wrap; gap: 1em; }
figure { margin: 0; }
figcaption { font-size: 0.9em; }
svg.chart { width: 300px; height: 60px; background: #f6f6f6; color: #1565c0; }
.none { color: #666; font-size: 0.9em; }
"""
