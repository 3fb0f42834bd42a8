/* The live page's script (exporter/serve/landing.py draws the page it refreshes).

Polls /api/v1/history?since=<last time it has> (only the new samples, from the ring
buffer) every collection interval, at least a second apart, and
- redraws the charts drawn server-side with the same geometry (a 300 x 60 viewBox, the
  x axis the whole --web.history window, the y axis 0-100 % for ratios, 0 to the GPU's
  power limit or critical temperature where known (the reply's per-GPU "max", kept
  after a GPU is lost), a gap where a value is unknown, "no data" where there is none);
  a caption gives the newest value only while the GPU is up;
- rebuilds the GPUs table, the health problems and the backends table from the reply's
  devices, backends and otlp (their text is the server's "cells"; the marks, columns
  and process-row count are exporter/serve/view.py's and landing.py's, filled in where
  this file is served), and each GPU's top processes;
- says "Not updating ... stale" when a poll fails.
Every table is built with DOM methods only: process, pod and GPU names are user- or
vendor-controlled text, so they go in through textContent, never as markup. */
"use strict";
(function () {
  var W = 300, H = 60;
  var MARKS = __MARKS__;
  var GPU_COLUMNS = __GPU_COLUMNS__, BACKEND_COLUMNS = __BACKEND_COLUMNS__;
  var TOP_PROCESSES = __TOP_PROCESSES__;
  var WORDS = __WORDS__;  // view.State, HealthStatus, OtlpState: word by member name
  var body = document.body;
  var span = parseFloat(body.dataset.window), every = parseFloat(body.dataset.interval);
  var data = {}, units = {}, fixed = {}, scales = {}, devices = {}, since = 0, serverNow = 0;

  function mark(word) { return MARKS[word] || word || "no data"; }

  function live(gpu) { return !!devices[gpu] && devices[gpu].state === WORDS.UP; }

  function top(values, high) {
    if (high > 0) return high;
    var m = 0;
    for (var i = 0; i < values.length; i++) if (values[i] !== null && values[i] > m) m = values[i];
    return 1.25 * m || 1;
  }

  function high(gpu, key) {  // landing._chart: the series' top, else the GPU's own
    return fixed[key] || (scales[gpu] && scales[gpu][key]) || 0;
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
    return document.querySelector(selector + "[data-gpu=\"" + gpu + "\"][" + attr + "=\"" +
                                  key + "\"]");
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
      var v = live(el.dataset.gpu) ? last(col[el.dataset.last]) : null;
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

  function size(n) {  // view.size
    if (typeof n !== "number") return "no data";
    var big = [["TiB", 1099511627776], ["GiB", 1073741824]];
    for (var i = 0; i < big.length; i++) {
      if (n >= big[i][1]) return (n / big[i][1]).toFixed(2) + " " + big[i][0];
    }
    var small = [["MiB", 1048576], ["KiB", 1024]];
    for (var j = 0; j < small.length; j++) {
      if (n >= small[j][1]) {
        var v = n / small[j][1];
        return v.toFixed(v < 10 ? 1 : 0) + " " + small[j][0];
      }
    }
    return n.toFixed(0) + " B";
  }

  function processes(all) {  // landing.processes_table
    document.querySelectorAll("div.processes").forEach(function (box) {
      var top = all[box.dataset.gpu];
      if (!top) return;  // GPU forgotten: keep what is shown
      var shown = top.rows.slice(0, TOP_PROCESSES);
      var more = top.rows.length - shown.length + (top.more || 0);
      var pods = shown.some(function (p) { return p.pod || p.container; });
      var head = ["pid", "process", "memory"].concat(pods ? ["pod", "container"] : []);
      var table = document.createElement("table"), rows = table.createTBody();
      table.className = "procs";
      row(table.createTHead(), head.map(function (h) { return [h, h, ""]; }), "th");
      shown.forEach(function (p) {
        var cells = [String(p.pid), p.process, size(p.memory_bytes), p.pod, p.container];
        row(rows, head.map(function (h, i) { return [h, cells[i], ""]; }), "td");
      });
      box.replaceChildren(shown.length ? table : note("No processes reported."));
      if (more > 0) box.appendChild(note("and " + more + " more"));
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
      var cls = {state: "state-" + (dev.state || "none"), temperature: heat ? "heat-" + heat : "",
                 health: status ? "health-" + status : ""};
      var tr = row(rows, GPU_COLUMNS.map(function (c) {
        return [c[1], c[0] in text ? text[c[0]] : dev.cells[c[0]], cls[c[0]] || ""];
      }), "td");
      tr.dataset.gpu = dev.gpu;
      tr.className = "state-" + (dev.state || "none");
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
      if (!d.health.status || d.health.status === WORDS.HEALTHY) return;
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
      row(rows, [["backend", b.backend, ""], ["state", mark(b.state), "state-" + (b.state || "none")],
                 ["reason", b.reason, ""], ["devices", String(b.devices), ""]], "td");
    });
    if (otlp) {
      row(rows, [["backend", "otlp push", ""],
                 ["state", mark(otlp.state),
                  "state-" + (otlp.state === WORDS.OK ? WORDS.UP : WORDS.DOWN)],
                 ["reason", otlp.detail, ""], ["devices", "", ""]], "td");
    }
    tbody.replaceWith(rows);
    rows.dataset.updated = String(serverNow);
  }

  function merge(reply) {
    serverNow = reply.now;
    devices = {};
    (reply.devices || []).forEach(function (d) { devices[d.gpu] = d; });
    reply.series.forEach(function (s) { units[s.key] = s.unit; fixed[s.key] = s.max || 0; });
    reply.gpus.forEach(function (g) {
      scales[g.gpu] = g.max || {};
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
    fetch("/api/v1/history?processes=" + TOP_PROCESSES + (since ? "&since=" + since : ""),
          {cache: "no-store"})
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
