"""The script of the HTML report page: draws the figures and the volume browser.

The figures arrive as plotly figure dictionaries in ``#bellis-data``; the volume arrays
as base64 typed arrays, sliced here in the browser (one slice of one figure at a time,
so a large grid costs its bytes once). When every plot has rendered, ``<body>`` gets
``data-rendered="yes"``. ``window.bellisReport.volumes[div].show(metric, axis, index)``
redraws a volume view (the controls call it; so can a test).
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
  ids.forEach(function (id) {
    var f = D.figures[id];
    Plotly.newPlot("plot-" + id, f.data, f.layout, config).then(mark);
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
      Object.keys(v.labels).forEach(function (n) {
        if (n === "state" || n === "failures") { return; }
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
    api.volumes[v.div] = {show: show, state: state, task: v.task};
    return show(state.metric, state.axis, state.index);
  }
  D.volumes.forEach(function (v) { volume(v).then(mark); });
})();
"""
