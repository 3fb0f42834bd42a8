"""The landing page's script and style sheet, served as ``/static/app.js`` and
``/static/app.css`` from the exporter's own origin, so the page runs under a
Content-Security-Policy that allows no inline script or style.

The script polls ``/api/v1/history?since=<last time it has>`` (only the new samples, from
the ring buffer) every collection interval, at least a second apart, and
- redraws the charts drawn server-side by exporter.serve.landing with the same geometry (a
  300 x 60 viewBox, the x axis the whole ``--web.history`` window, the y axis 0-100 % for
  ratios, 0 to the power limit or the critical temperature where known, a gap where a
  value is unknown, "no data" where there is none);
- rebuilds the GPUs table, the health problems and the backends table from the reply's
  ``devices``, ``backends`` and ``otlp`` (their text is exporter.serve.history's ``cells``, the
  marks and columns exporter.serve.landing's, inlined below), and each GPU's top processes;
- says "Not updating ... stale" when a poll fails.
Every table is built with DOM methods only: process and GPU names are user- or
vendor-controlled text, so they go in through ``textContent``, never as markup. Without
JavaScript the page is the same, frozen at load.
"""

from __future__ import annotations

import json

from exporter.serve.landing import BACKEND_COLUMNS, GPU_COLUMNS, MARKS

_APP_JS = """\
"use strict";
(function () {
  var W = 300, H = 60;
  var MARKS = __MARKS__;
  var GPU_COLUMNS = __GPU_COLUMNS__, BACKEND_COLUMNS = __BACKEND_COLUMNS__;
  var body = document.body;
  var span = parseFloat(body.dataset.window), every = parseFloat(body.dataset.interval);
  var data = {}, units = {}, devices = {}, since = 0, serverNow = 0;

  function mark(word) { return MARKS[word] || word || "no data"; }

  function top(values, high) {
    if (high > 0) return high;
    var m = 0;
    for (var i = 0; i < values.length; i++) if (values[i] !== null && values[i] > m) m = values[i];
    return 1.25 * m || 1;
  }

  function high(gpu, key) {  // landing.chart_high
    var dev = devices[gpu];
    if (key === "utilization" || key === "memory") return 100;
    if (!dev) return 0;
    if (key === "power") return dev.power_limit_watts || 0;
    if (key === "temperature" && dev.temperature) return dev.temperature.critical || 0;
    return 0;
  }

  function path(col, key, scale) {  // landing.chart_path: a point per pixel, its largest value
    var values = col[key], d = [], pen = "M", n = 0, column = -1, best = null;
    function point() {
      var y = Math.floor(H + 0.5 - Math.min(Math.max(best * H / scale, 0), H));
      d.push(pen + column + "," + y);
      pen = "L"; n++; best = null;
    }
    for (var i = 0; i < col.t.length; i++) {
      var v = values[i];
      if (v === null || v === undefined) {
        if (best !== null) point();
        pen = "M";
        continue;
      }
      var x = Math.max(0, Math.floor(W - (serverNow - col.t[i]) * W / span));
      if (best === null || x !== column) {
        if (best !== null) point();
        column = x; best = v;
      } else if (v > best) best = v;
    }
    if (best !== null) point();
    return [d.join(" "), n];
  }

  function last(values) {
    for (var i = values.length - 1; i >= 0; i--) if (values[i] !== null) return values[i];
    return null;
  }

  function find(selector, gpu, attr, key) {
    return document.querySelector(selector + "[data-gpu=\\"" + gpu + "\\"][" + attr + "=\\"" +
                                  key + "\\"]");
  }

  function draw() {
    document.querySelectorAll("svg.chart").forEach(function (svg) {
      var gpu = svg.dataset.gpu, key = svg.dataset.key, col = data[gpu];
      if (!col || !col[key]) return;
      var max = high(gpu, key), scale = top(col[key], max);
      var drawn = path(col, key, scale);
      svg.querySelector("path").setAttribute("d", drawn[0]);
      svg.dataset.points = String(drawn[1]);
      svg.dataset.max = max > 0 ? String(max) : "";
      var label = find("span", gpu, "data-top", key);
      if (label) label.textContent = scale.toFixed(0) + " " + units[key];
      var none = find("span", gpu, "data-nodata", key);
      if (none) none.hidden = drawn[1] > 0;
    });
    document.querySelectorAll("[data-sensor]").forEach(function (el) {
      var dev = devices[el.dataset.gpu];
      if (dev) el.textContent = dev.temperature ? dev.temperature.sensor : "";
    });
    document.querySelectorAll("[data-last]").forEach(function (el) {
      var col = data[el.dataset.gpu];
      if (!col || !col[el.dataset.last]) return;
      var v = last(col[el.dataset.last]);
      el.textContent = v === null ? "no data" : v.toFixed(0) + " " + units[el.dataset.last];
    });
  }

  function note(text, cls) {
    var p = document.createElement("p");
    p.className = cls || "none";
    p.textContent = text;
    return p;
  }

  function row(section, cells, tag) {  // cells: [label, text, class]
    var tr = section.insertRow();
    cells.forEach(function (c) {
      var cell = document.createElement(tag);
      cell.textContent = c[1];
      if (tag === "td") cell.dataset.label = c[0];
      if (c[2]) cell.className = c[2];
      tr.appendChild(cell);
    });
    return tr;
  }

  function gib(bytes) {
    return bytes === null ? "no data" : (bytes / 1073741824).toFixed(2) + " GiB";
  }

  function processes(all) {  // landing.processes_table
    document.querySelectorAll("div.processes").forEach(function (box) {
      var top = all[box.dataset.gpu];
      if (!top) return;  // GPU forgotten: keep what is shown
      var pods = top.rows.some(function (p) { return p.pod || p.container; });
      var head = ["pid", "process", "memory"].concat(pods ? ["pod", "container"] : []);
      var table = document.createElement("table"), rows = table.createTBody();
      table.className = "procs";
      row(table.createTHead(), head.map(function (h) { return [h, h, ""]; }), "th");
      top.rows.forEach(function (p) {
        var cells = [String(p.pid), p.process, gib(p.memory_bytes), p.pod, p.container];
        row(rows, head.map(function (h, i) { return [h, cells[i], ""]; }), "td");
      });
      box.replaceChildren(top.rows.length ? table : note("No processes reported."));
      if (top.more > 0) box.appendChild(note("and " + top.more + " more"));
      box.dataset.updated = String(serverNow);  // when this table was last refilled
    });
  }

  function gpuTable(list) {  // landing.gpu_row
    var tbody = document.getElementById("gpu-rows");
    var rows = document.createElement("tbody");
    rows.id = "gpu-rows";
    list.forEach(function (dev) {
      var status = dev.health.status, heat = dev.temperature ? dev.temperature.heat : "";
      var text = {gpu: dev.gpu, name: dev.name, vendor: dev.vendor, state: mark(dev.state),
                  health: mark(status)};
      var cls = {state: "state-" + dev.state, temperature: heat ? "heat-" + heat : "",
                 health: status ? "health-" + status : ""};
      var tr = row(rows, GPU_COLUMNS.map(function (c) {
        return [c[1], c[0] in text ? text[c[0]] : dev.cells[c[0]], cls[c[0]] || ""];
      }), "td");
      tr.dataset.gpu = dev.gpu;
      tr.className = "state-" + dev.state;
    });
    tbody.replaceWith(rows);
    rows.closest("table").hidden = list.length === 0;
    document.getElementById("no-gpu").hidden = list.length > 0;
    rows.dataset.updated = String(serverNow);
    var missing = list.filter(function (d) { return !document.getElementById("gpu-" + d.gpu); });
    var fresh = document.getElementById("new-gpu");
    fresh.hidden = missing.length === 0;
    fresh.textContent = missing.length ? "GPU " + missing.map(function (d) { return d.gpu; })
      .join(", ") + " appeared after this page loaded: reload for its charts." : "";
  }

  function healthList(list) {  // landing._health
    var box = document.getElementById("health"), ul = document.createElement("ul");
    list.forEach(function (d) {
      if (!d.health.status || d.health.status === "healthy") return;
      var li = document.createElement("li");
      li.className = "health-" + d.health.status;
      li.textContent = "GPU " + d.gpu + " (" + d.name + "): " + mark(d.health.status) + ": " +
        d.health.reasons.map(function (r) { return r.check + ": " + r.reason; }).join("; ");
      ul.appendChild(li);
    });
    if (ul.children.length) box.replaceChildren(ul);
    else if (list.length) box.replaceChildren(note("No health problem on any GPU."));
    else box.replaceChildren();
    box.dataset.updated = String(serverNow);
  }

  function backendTable(list, otlp) {  // landing.backend_rows
    var tbody = document.getElementById("backend-rows");
    var rows = document.createElement("tbody");
    rows.id = "backend-rows";
    list.forEach(function (b) {
      row(rows, [["backend", b.backend, ""], ["state", mark(b.state), "state-" + b.state],
                 ["reason", b.reason, ""], ["devices", String(b.devices), ""]], "td");
    });
    if (otlp) {
      row(rows, [["backend", "otlp push", ""],
                 ["state", mark(otlp.state), "state-" + (otlp.state === "ok" ? "up" : "down")],
                 ["reason", otlp.detail, ""], ["devices", "", ""]], "td");
    }
    tbody.replaceWith(rows);
    rows.dataset.updated = String(serverNow);
  }

  function merge(reply) {
    serverNow = reply.now;
    devices = {};
    (reply.devices || []).forEach(function (d) { devices[d.gpu] = d; });
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
    });
    Object.keys(data).forEach(function (gpu) {
      var col = data[gpu], old = 0;
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
        if (reply.devices) {  // null until the exporter has recorded a first sample
          gpuTable(reply.devices);
          healthList(reply.devices);
          backendTable(reply.backends, reply.otlp);
        }
        processes(reply.processes || {});
        body.dataset.live = "1";
        body.classList.remove("offline");
        document.getElementById("status").firstChild.textContent = "As of " +
          new Date(serverNow * 1000).toLocaleTimeString() + " (server time). ";
        if (live) live.textContent = "Live: refreshed every " + Math.max(1, every) + " s.";
      })
      .catch(function (e) {
        body.dataset.live = "0";
        body.classList.add("offline");
        if (live) live.textContent = "Not updating (" + e.message + "): the values below " +
          "are stale.";
      })
      .then(function () { setTimeout(refresh, Math.max(1000, every * 1000)); });
  }

  refresh();
})();
"""
APP_JS = (_APP_JS.replace("__MARKS__", json.dumps(MARKS, ensure_ascii=False))
          .replace("__GPU_COLUMNS__", json.dumps(GPU_COLUMNS))
          .replace("__BACKEND_COLUMNS__", json.dumps(BACKEND_COLUMNS)))

APP_CSS = """\
[hidden] { display: none !important; }
body { font-family: system-ui, sans-serif; margin: 1em 2em; color: #222; }
nav { margin: 0.5em 0; }
table { border-collapse: collapse; margin: 0.5em 0; }
td, th { border: 1px solid #bbb; padding: 0.2em 0.6em; text-align: left; }
th { background: #f0f0f0; }
section.gpu { border-top: 1px solid #ddd; margin-top: 1em; }
.charts { display: flex; flex-wrap: wrap; gap: 1em 1.5em; }
figure { margin: 0; }
figcaption { font-size: 0.9em; }
figcaption .sensor { color: #555; }
.plot { display: grid; grid-template-columns: 4.5em 300px; grid-template-rows: 30px 30px auto;
        font-size: 0.75em; color: #555; }
.plot .ytop { grid-column: 1; grid-row: 1; text-align: right; padding-right: 0.3em;
              white-space: nowrap; }
.plot .ybottom { grid-column: 1; grid-row: 2; align-self: end; text-align: right;
                 padding-right: 0.3em; }
.plot svg.chart, .plot .nodata { grid-column: 2; grid-row: 1 / 3; }
.plot .nodata { align-self: center; justify-self: center; color: #777; }
.plot .nodata[hidden] { display: none; }
.plot .xleft, .plot .xmid, .plot .xright { grid-row: 3; grid-column: 2; }
.plot .xmid { justify-self: center; }
.plot .xright { justify-self: end; }
svg.chart { width: 300px; height: 60px; background: #f6f6f6; color: #1565c0;
            border-left: 1px solid #999; border-bottom: 1px solid #999; box-sizing: border-box; }
svg.chart .grid { stroke: #ddd; stroke-width: 1; vector-effect: non-scaling-stroke; }
.none { color: #666; font-size: 0.9em; }
.empty { font-weight: bold; padding: 0.5em; border: 1px dashed #b26a00; }
td.state-up { color: #1b5e20; }
td.state-down, td.state-stale { font-weight: bold; }
td.state-down { color: #b71c1c; }
td.state-stale { color: #8d5a00; }
tr.state-down td, tr.state-stale td { background: #fbe9e7; }
.health-healthy { color: #1b5e20; }
.health-degraded { color: #8d5a00; font-weight: bold; }
.health-failed { color: #b71c1c; font-weight: bold; }
td.health-degraded { background: #fff3e0; }
td.health-failed { background: #ffebee; }
.heat-hot { color: #8d5a00; font-weight: bold; }
.heat-critical { color: #b71c1c; font-weight: bold; background: #ffebee; }
body.offline table, body.offline .charts { opacity: 0.55; }
body.offline #live { color: #b71c1c; font-weight: bold; }
@media (max-width: 640px) {
  body { margin: 0.5em; }
  table.cards thead { display: none; }
  table.cards, table.cards tbody, table.cards tr, table.cards td { display: block; }
  table.cards tr { border: 1px solid #bbb; margin: 0 0 0.5em; }
  table.cards td { border: none; border-bottom: 1px solid #eee; display: flex; gap: 0.5em; }
  table.cards td::before { content: attr(data-label); min-width: 7.5em; color: #555; }
  table.procs { font-size: 0.85em; }
  .plot { grid-template-columns: 4.5em minmax(0, 1fr); }
  svg.chart { width: 100%; }
  figure.chart { width: 100%; }
}
"""
