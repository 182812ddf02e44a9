"""The script of the HTML report page: draws the figures and the volume browser.

The figures arrive as plotly figure dictionaries in ``#bellis-data``; the volume arrays
as base64 typed arrays, sliced here in the browser (one slice of one figure at a time,
so a large grid costs its bytes once). When every plot has rendered, ``<body>`` gets
``data-rendered="yes"``. ``window.bellisReport.volumes[div].show(metric, axis, index)``
redraws a volume view (the controls call it; so can a test).

The failed attempts of each block arrive in ``#bellis-failures`` (``_failures``). A click
on a cell of a volume view, on a red or orange bar of the timeline (its ``customdata``
names the block) or on a block link of the Failures section shows that block's attempts,
tracebacks and log lines in the ``.detail`` box below it:
``window.bellisReport.showBlock(store, "y,x", box, failures)`` does the same. Everything
from a run is put in the page as text (``textContent``), never as markup.
"""

from __future__ import annotations

__all__ = ["PAGE_JS"]

PAGE_JS = r"""
(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("bellis-data").textContent);
  var config = {responsive: true, displaylogo: false};
  var ids = Object.keys(D.figures);
  var pending = ids.length + D.volumes.length;
  var api = {volumes: {}};
  window.bellisReport = api;
  function mark() {
    pending -= 1;
    if (pending <= 0) { document.body.setAttribute("data-rendered", "yes"); }
  }
  if (pending === 0) { document.body.setAttribute("data-rendered", "yes"); }
  var FE = document.getElementById("bellis-failures");
  var FD = FE ? JSON.parse(FE.textContent) : {stores: {}};
  api.failures = FD;
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) { e.className = cls; }
    if (text !== undefined && text !== null) { e.textContent = String(text); }
    return e;
  }
  function box(target) {
    return typeof target === "string" ? document.getElementById(target) : target;
  }
  function heading(b, text) {
    b.textContent = "";
    var head = el("div", "head");
    var close = el("a", "close", "close");
    close.href = "#"; close.style.cssFloat = "right";
    close.addEventListener("click", function (e) { e.preventDefault(); b.textContent = ""; });
    head.appendChild(close);
    head.appendChild(el("b", null, text));
    b.appendChild(head);
  }
  // one block's recorded failed attempts, into the box `target`; `failures` is the
  // store's count of them where the caller knows it
  function showBlock(store, key, target, failures) {
    var b = box(target);
    if (!b) { return null; }
    var S = FD.stores[String(store)] || null;
    var attempts = S && S.blocks[key] ? S.blocks[key] : [];
    heading(b, (S ? S.task + ": " : "") + "block (" + key.split(",").join(", ") + ")");
    if (!attempts.length) {
      var why = "No failed attempt of this block was recorded.";
      if (S && !S.file && failures > 0) {
        why = "This store counts " + failures + " failed attempt(s) of this block but has " +
          "no errors.jsonl (written by daisy 2.0.0 or an older bellis): no traceback is known.";
      } else if (S && (failures > 0 || S.counted[key])) {
        why = "The store counts " + (failures > 0 ? failures : "some") + " failed attempt(s)" +
          " of this block, but no record of them is in this page: its error went past the " +
          "records errors.jsonl keeps per distinct error, or past the page's bound. " +
          "bellis status " + S.path + " --block " + key + " shows what errors.jsonl holds.";
      }
      b.appendChild(el("p", "empty", why));
      return b;
    }
    var n = attempts.length;
    b.appendChild(el("p", "meta", n + " recorded failed attempt" + (n === 1 ? "" : "s") +
      (failures > n ? " of the " + failures + " the store counts" : "")));
    attempts.forEach(function (a) {
      var d = el("div", "attempt");
      var what = a.type ? a.type + (a.message ? ": " + a.message : "") : a.message;
      var title = el("div");
      title.appendChild(el("b", null, "attempt " + a.attempt + " [" + a.kind + "] "));
      title.appendChild(document.createTextNode(what || ""));
      d.appendChild(title);
      var who = [a.worker !== null && a.worker !== undefined ? "worker " + a.worker
                                                              : "no worker"];
      if (a.host) { who.push("host " + a.host); }
      if (a.pid !== null && a.pid !== undefined) { who.push("pid " + a.pid); }
      if (a.job) { who.push("job " + a.job); }
      if (a.time) { who.push("at " + a.time + " UTC"); }
      if (a.run) { who.push("in the run started " + a.run + " UTC"); }
      d.appendChild(el("div", "meta", who.join(", ")));
      if (a.where) { d.appendChild(el("div", "meta", "in " + a.where)); }
      if (a.traceback) { d.appendChild(el("pre", "tb", a.traceback.replace(/\n+$/, ""))); }
      if (a.log) {
        d.appendChild(el("div", "meta", "log " + a.log +
          (a.log_line !== null && a.log_line !== undefined ? ", line " + a.log_line : "") +
          (a.log_lines.length ? ":" : " (not readable here)")));
        if (a.log_lines.length) { d.appendChild(el("pre", "log", a.log_lines.join("\n"))); }
      }
      if (a.out_lines && a.out_lines.length) {
        d.appendChild(el("div", "meta", "last lines of " + a.out_log + " before it:"));
        d.appendChild(el("pre", "log", a.out_lines.join("\n")));
      }
      b.appendChild(d);
    });
    return b;
  }
  // a downsampled cell covers k blocks per axis: list those with records
  function listBlocks(store, lo, k, target, failures) {
    var b = box(target);
    if (!b) { return null; }
    var S = FD.stores[String(store)] || null;
    heading(b, (S ? S.task + ": " : "") + "blocks (" + lo.map(function (g) {
      return (g * k) + ".." + (g * k + k - 1); }).join(", ") + ")");
    var keys = S ? Object.keys(S.blocks).filter(function (key) {
      var c = key.split(",").map(Number);
      return c.length === lo.length && c.every(function (x, a) {
        return x >= lo[a] * k && x < lo[a] * k + k; });
    }) : [];
    if (!keys.length) {
      b.appendChild(el("p", "empty", failures > 0
        ? "No record of the failed attempts of these blocks is in this page."
        : "No failed attempt in these blocks."));
      return b;
    }
    var p = el("p", "meta", "blocks with recorded failed attempts (click one): ");
    keys.slice(0, 50).forEach(function (key, i) {
      var a = el("a", "blk", "(" + key.split(",").join(", ") + ")");
      a.href = "#";
      a.addEventListener("click", function (e) {
        e.preventDefault(); showBlock(store, key, b, undefined);
      });
      if (i) { p.appendChild(document.createTextNode(", ")); }
      p.appendChild(a);
    });
    if (keys.length > 50) { p.appendChild(document.createTextNode(" and more")); }
    b.appendChild(p);
    return b;
  }
  api.showBlock = showBlock;
  document.querySelectorAll("a.blk[data-block]").forEach(function (a) {
    a.addEventListener("click", function (e) {
      e.preventDefault();
      showBlock(a.getAttribute("data-store"), a.getAttribute("data-block"),
                "failures-detail", undefined);
    });
  });

  ids.forEach(function (id) {
    var f = D.figures[id];
    Plotly.newPlot("plot-" + id, f.data, f.layout, config).then(function (gd) {
      if (id === "timeline") {  // a red or orange bar: the block's failed attempts
        gd.on("plotly_click", function (ev) {
          var pt = ev && ev.points && ev.points[0];
          var cd = pt && pt.customdata;
          if (cd) { showBlock(cd[0], cd[1], "timeline-detail", cd[2]); }
        });
      }
      mark();
    });
  });

  function decode(spec) {
    var bin = atob(spec.bdata);
    var buf = new ArrayBuffer(bin.length);
    var u8 = new Uint8Array(buf);
    for (var i = 0; i < bin.length; i++) { u8[i] = bin.charCodeAt(i); }
    if (spec.dtype === "u4") { return new Uint32Array(buf); }
    if (spec.dtype === "f8") { return new Float64Array(buf); }
    return new Float32Array(buf);
  }
  // state codes -1..3: STATES[code + 1]; -1 is a cell no block maps to (read context)
  var STATES = ["no block", "untouched", "done", "done after failed attempts", "failed"];
  var STATE_SCALE = [[0, "#ffffff"], [0.2, "#ffffff"], [0.2, "#e6e6e6"], [0.4, "#e6e6e6"],
                     [0.4, "#2ca02c"], [0.6, "#2ca02c"], [0.6, "#ff7f0e"], [0.8, "#ff7f0e"],
                     [0.8, "#d62728"], [1, "#d62728"]];
  // verify codes 0..2 (bellis verify): VERIFY[code]; a block not done has none
  var VERIFY = ["unverifiable (no checksum)", "verified", "mismatched"];
  var VERIFY_SCALE = [[0, "#bdbdbd"], [0.333, "#bdbdbd"], [0.333, "#2ca02c"],
                      [0.667, "#2ca02c"], [0.667, "#d62728"], [1, "#d62728"]];
  function fmt(v, unit) {
    if (v !== v) { return "-"; }
    if (unit === "B") {
      var u = ["B", "KiB", "MiB", "GiB", "TiB"], i = 0;
      while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
      return v.toFixed(i ? 1 : 0) + " " + u[i];
    }
    if (unit === "s") { return v < 1 ? (v * 1000).toFixed(1) + " ms" : v.toFixed(2) + " s"; }
    return String(v);
  }

  function volume(v) {
    var S = v.shape, nd = S.length, k = v.factor;
    var M = {};
    Object.keys(v.metrics).forEach(function (n) { M[n] = decode(v.metrics[n]); });
    var W = v.worker ? decode(v.worker) : null;
    var box = document.getElementById(v.div + "-controls");
    var sel = document.createElement("select");
    Object.keys(v.labels).forEach(function (n) {
      var o = document.createElement("option"); o.value = n; o.textContent = v.labels[n][0];
      sel.appendChild(o);
    });
    var lab = document.createElement("label"); lab.textContent = "figure ";
    lab.appendChild(sel); box.appendChild(lab);
    var axisSel = null, slider = null, out = null;
    var state = {metric: "state", axis: 0, index: 0};
    if (nd === 3) {
      axisSel = document.createElement("select");
      [0, 1, 2].forEach(function (a) {
        var o = document.createElement("option"); o.value = a; o.textContent = "axis " + a;
        axisSel.appendChild(o);
      });
      var l2 = document.createElement("label"); l2.textContent = "slice along ";
      l2.appendChild(axisSel); box.appendChild(l2);
      slider = document.createElement("input"); slider.type = "range"; slider.min = 0;
      out = document.createElement("span");
      var l3 = document.createElement("label"); l3.textContent = "index ";
      l3.appendChild(slider); l3.appendChild(out); box.appendChild(l3);
      // start on the slice along axis 0 with the most failures (else the blocks' middle one)
      var best = -1, bestN = 0, F = M.failures, plane = S[1] * S[2];
      for (var z = 0; z < S[0]; z++) {
        var n = 0;
        for (var q = z * plane; q < (z + 1) * plane; q++) { if (F[q] > 0) { n++; } }
        if (n > bestN) { bestN = n; best = z; }
      }
      state.index = best >= 0 ? best : (v.start != null ? v.start : Math.floor(S[0] / 2));
    }
    if (k > 1) {
      var note = document.createElement("span");
      note.textContent = " each cell shows the maximum over " + k + " blocks per axis";
      box.appendChild(note);
    }
    function flatOf(c) {
      var f = 0;
      for (var a = 0; a < nd; a++) { f = f * S[a] + c[a]; }
      return f;
    }
    function describe(c, f) {
      var grid = v.ndim === 1 ? [c[1]] : c;
      var lines = ["<b>" + v.task + "</b>"];
      if (k === 1 && M.state[f] === -1) {
        lines.push("cell (" + grid.join(", ") + "): no block (read context)");
      } else if (k === 1) {
        lines.push("block (" + grid.join(", ") + ")");
        if (v.rois) {  // from StoreLayout.write_interval, as the table and the trace
          var iv = grid.map(function (g, a) { return v.rois[a][g]; });
          lines.push("ROI [" + iv.map(function (x) { return x[0] + ":" + x[1]; })
            .join(", ") + ")");
        }
      } else {
        lines.push("blocks (" + grid.map(function (g) {
          return (g * k) + ".." + (g * k + k - 1); }).join(", ") + ")");
      }
      lines.push("state " + STATES[M.state[f] + 1] + (k > 1 ? " (worst)" : ""));
      if (M.failures[f] > 0) { lines.push("failed attempts " + M.failures[f]); }
      if (W && M.state[f] > 0 && W[f] !== 4294967295 && M.wall_seconds &&
          M.wall_seconds[f] === M.wall_seconds[f]) { lines.push("worker " + W[f]); }
      if (M.verified && M.verified[f] === M.verified[f]) {
        lines.push("verify " + VERIFY[M.verified[f]] + (k > 1 ? " (worst)" : ""));
      }
      Object.keys(v.labels).forEach(function (n) {
        if (n === "state" || n === "failures" || n === "verified") { return; }
        var val = M[n][f];
        if (val === val) { lines.push(v.labels[n][0] + " " + fmt(val, v.labels[n][1])); }
      });
      return lines.join("<br>");
    }
    function show(metric, axis, index) {
      state.metric = metric; state.axis = axis; state.index = index;
      sel.value = metric;
      var rows, cols, ra, ca;
      if (nd === 3) {
        var rest = [0, 1, 2].filter(function (a) { return a !== axis; });
        ra = rest[0]; ca = rest[1]; rows = S[ra]; cols = S[ca];
        axisSel.value = axis; slider.max = S[axis] - 1; slider.value = index;
        out.textContent = " " + index + " of 0.." + (S[axis] - 1);
      } else { ra = 0; ca = 1; rows = S[0]; cols = S[1]; }
      var z = [], text = [], A = M[metric];
      for (var i = 0; i < rows; i++) {
        var zr = [], tr = [];
        for (var j = 0; j < cols; j++) {
          var c = [0, 0, 0].slice(0, nd);
          if (nd === 3) { c[axis] = index; }
          c[ra] = i; c[ca] = j;
          var f = flatOf(c);
          var val = A[f];
          zr.push(val === val ? val : null);
          tr.push(describe(c, f));
        }
        z.push(zr); text.push(tr);
      }
      var unit = v.labels[metric][1];
      var trace = {type: "heatmap", z: z, text: text, hovertemplate: "%{text}<extra></extra>",
                   xgap: cols <= 64 ? 1 : 0, ygap: rows <= 64 ? 1 : 0};
      if (metric === "state") {
        trace.zmin = -1.5; trace.zmax = 3.5; trace.colorscale = STATE_SCALE;
        trace.colorbar = {tickvals: [-1, 0, 1, 2, 3], ticktext: STATES};
      } else if (metric === "verified") {
        trace.zmin = -0.5; trace.zmax = 2.5; trace.colorscale = VERIFY_SCALE;
        trace.colorbar = {tickvals: [0, 1, 2], ticktext: VERIFY};
      } else {
        trace.colorscale = metric === "failures" ? "Reds" : "Viridis";
        trace.colorbar = {title: {text: unit}};
        if (metric === "failures") { trace.zmin = 0; }
      }
      var title = v.task + ": " + v.labels[metric][0] +
        (nd === 3 ? " (slice " + index + " along axis " + axis + ")" : "");
      var layout = {title: {text: title, font: {size: 14}, x: 0.01, xanchor: "left"},
                    height: 460,
                    margin: {l: 60, r: 20, t: 40, b: 50},
                    // explicit ranges: a slice along another axis has another shape, and
                    // Plotly.react would otherwise keep the previous slice's ranges
                    xaxis: {title: {text: v.ndim === 1 ? "grid axis 0" : "grid axis " + ca},
                            range: [-0.5, cols - 0.5], autorange: false,
                            constrain: "domain", dtick: cols <= 20 ? 1 : null,
                            zeroline: false, showgrid: false},
                    yaxis: {title: {text: v.ndim === 1 ? "" : "grid axis " + ra},
                            range: [rows - 0.5, -0.5], autorange: false,
                            scaleanchor: "x", constrain: "domain",
                            dtick: rows <= 20 ? 1 : null, zeroline: false, showgrid: false}};
      return Plotly.react("plot-" + v.div, [trace], layout, config);
    }
    sel.addEventListener("change", function () { show(sel.value, state.axis, state.index); });
    if (nd === 3) {
      axisSel.addEventListener("change", function () {
        var a = Number(axisSel.value);
        show(state.metric, a, Math.min(state.index, S[a] - 1));
      });
      slider.addEventListener("input", function () {
        show(state.metric, state.axis, Number(slider.value));
      });
    }
    // a click on a cell: its block's failed attempts, below the view
    function clicked(ev) {
      var pt = ev && ev.points && ev.points[0];
      if (!pt || !pt.pointNumber) { return; }
      var i = pt.pointNumber[0], j = pt.pointNumber[1], ra = 0, ca = 1;
      var c = [0, 0, 0].slice(0, nd);
      if (nd === 3) {
        var rest = [0, 1, 2].filter(function (a) { return a !== state.axis; });
        ra = rest[0]; ca = rest[1]; c[state.axis] = state.index;
      }
      c[ra] = i; c[ca] = j;
      var f = flatOf(c);
      var grid = v.ndim === 1 ? [c[1]] : c;
      if (k === 1) { showBlock(v.store, grid.join(","), v.div + "-detail", M.failures[f]); }
      else { listBlocks(v.store, grid, k, v.div + "-detail", M.failures[f]); }
    }
    api.volumes[v.div] = {show: show, state: state, task: v.task};
    return show(state.metric, state.axis, state.index).then(function (gd) {
      gd.on("plotly_click", clicked);
      return gd;
    });
  }
  D.volumes.forEach(function (v) { volume(v).then(mark); });
})();
"""
