"""The live page: one static HTML document, its script inline (no CDN, no build step).

It fetches ``api/state.json`` (with the page's own token) every 1.5 s and redraws in
place: the per-task counts, the block map (a canvas: one slice of the grid, chosen with a
slider over axis 0, or the max projection over it, coloured by state with the report's
colours), the details of the block under the pointer (or the one named by ``#block=ID``
or ``#cell=N`` in the URL; ``#proj=1`` shows the max projection) and the errors grouped
by distinct error. When a refresh has drawn, ``<body>`` carries ``data-rendered="yes"``
and ``window.bellisLive`` the state.
"""

from __future__ import annotations

from typing import Final

__all__ = ["PAGE"]

PAGE: Final = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>bellis: live</title>
<style>
body{font-family:system-ui,sans-serif;margin:16px;color:#222}
table{border-collapse:collapse;margin:8px 0}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f4f4f4}td.l,th.l{text-align:left}
canvas{border:1px solid #999;image-rendering:pixelated;cursor:crosshair}
.legend span{display:inline-block;margin-right:12px}
.legend i{display:inline-block;width:12px;height:12px;margin-right:4px;border:1px solid #999}
pre{background:#f8f8f8;padding:6px;white-space:pre-wrap}
#status{color:#555}
.note{color:#777}
.rising{color:#d62728;font-weight:bold}
</style></head>
<body data-rendered="no">
<h1>bellis: live</h1>
<div id="status">loading...</div>
<h2>Tasks</h2>
<table id="counts"><thead><tr><th class="l">task</th><th>blocks</th><th>done</th>
<th>failed</th><th>untouched</th><th>retried</th><th>failed attempts</th>
<th>skipped as done</th><th>running</th><th>orphaned</th><th>blocks/s now</th>
<th>blocks/s overall</th><th>ETA</th></tr></thead><tbody></tbody></table>
<h2>Block map</h2>
<div>task <select id="task"></select>
<label>slice (axis 0) <input id="slice" type="range" min="0" max="0" value="0"></label>
<span id="slice-n"></span>
<label><input id="maxproj" type="checkbox"> max projection over axis 0</label></div>
<div class="legend" id="legend"></div>
<canvas id="map" width="10" height="10"></canvas>
<pre id="block">hover over a block (or open #block=ID / #cell=N)</pre>
<h2>Workers, last minutes</h2>
<div id="lanes-note" class="note">no lanes yet: they come from the store's per-block
stamps (resource_tracking=True) or from the window of recent blocks a run writes into its
store (live_lanes.json, every 2 s), and no block of this store has come back</div>
<div class="legend" id="lane-legend"><span><i style="background:#2ca02c"></i>block</span>
<span><i style="background:#d62728"></i>failed attempt</span>
<span><i style="border:2px solid #9467bd"></i>straggler (the original)</span>
<span><i style="border:2px solid #1f77b4"></i>backup copy</span>
<span><i style="background:repeating-linear-gradient(45deg,#bbb 0 2px,#fff 2px 4px)"></i>
the copy that lost (stopped)</span>
<span><i style="border:2px dashed #1f77b4"></i>a race still going</span></div>
<canvas id="lanes" width="10" height="10"></canvas>
<pre id="lane-block">hover over a block of a lane</pre>
<h2>Block wall time</h2>
<canvas id="walls" width="10" height="10"></canvas>
<div id="trend"></div>
<h2>Errors</h2><div id="errors">none</div>
<h2>Files</h2><div id="links"></div><div id="files"></div>
<script>
(function(){
"use strict";
var token = new URLSearchParams(location.search).get("token") || "";
var state = null, codes = {}, drawn = null, follow = true, hoverCell = null;
var PRIORITY = [0, 1, 3, 4, 5, 2]; // max projection: failed > retried > done > partly ...
function $(id){ return document.getElementById(id); }
function text(el, s){ el.textContent = s; }
function fmtRate(r){ return r === null || r === undefined ? "-" : r.toFixed(2); }
function fmtDur(s){
  if (s === null || s === undefined) return "?";
  s = Math.round(s); var h = Math.floor(s/3600), m = Math.floor(s%3600/60), x = s%60;
  if (h) return h + "h" + String(m).padStart(2, "0") + "m";
  return m ? m + "m" + String(x).padStart(2, "0") + "s" : x + "s";
}
function fmtEta(t){
  if (!t.running) return "-";
  if (!t.eta_seconds) return "unknown";
  var lo = t.eta_seconds[0], hi = t.eta_seconds[1];
  return fmtDur(lo) + " to " + (hi === null ? "?" : fmtDur(hi));
}
function cell(v){ return v === null || v === undefined ? "n/a" : String(v); }
function decode(b64){
  var s = atob(b64), a = new Uint8Array(s.length);
  for (var i = 0; i < s.length; i++) a[i] = s.charCodeAt(i);
  return a;
}
function pyramid(dims, edge){
  if (edge <= 0) return 0; var v = 1;
  for (var k = 0; k < dims; k++) v = v * (edge + k) / (k + 1);
  return Math.round(v);
}
function cantor(index){
  var c = index.map(function(x){ return x > 0 ? x : 0; });
  if (!c.length) return 0;
  var r = c[0], total = c[0];
  for (var d = 1; d < c.length; d++){ total += c[d]; r += pyramid(d + 1, total); }
  return r;
}
function renderCounts(){
  var body = $("counts").tBodies[0]; body.innerHTML = "";
  state.tasks.forEach(function(t){
    var tr = document.createElement("tr"); tr.setAttribute("data-task", t.name);
    if (t.error){
      tr.innerHTML = "<td class=l></td><td colspan=12 class=l></td>";
      text(tr.children[0], t.name); text(tr.children[1], t.error);
    } else {
      var vals = [t.name, t.blocks === null ? "<= " + t.cells + " cells" : t.blocks, t.done,
        t.failed, t.untouched, t.retried, t.failed_attempts, cell(t.skipped),
        cell(t.running_blocks), cell(t.orphaned), fmtRate(t.rate_recent),
        fmtRate(t.rate_overall), fmtEta(t)];
      var keys = ["name","blocks","done","failed","untouched","retried","failed_attempts",
        "skipped","running","orphaned","rate_recent","rate_overall","eta"];
      vals.forEach(function(v, i){
        var td = document.createElement("td"); if (!i) td.className = "l";
        td.setAttribute("data-key", keys[i]); text(td, String(v)); tr.appendChild(td);
      });
    }
    body.appendChild(tr);
  });
}
function currentTask(){
  var name = $("task").value;
  for (var i = 0; i < state.tasks.length; i++)
    if (state.tasks[i].name === name) return state.tasks[i];
  return state.tasks[0];
}
function renderSelect(){
  var sel = $("task"), names = state.tasks.map(function(t){ return t.name; });
  var have = Array.prototype.map.call(sel.options, function(o){ return o.value; });
  if (have.join("\\n") !== names.join("\\n")){
    var keep = sel.value; sel.innerHTML = "";
    names.forEach(function(n){
      var o = document.createElement("option"); o.value = o.text = n; sel.appendChild(o);
    });
    var want = new URLSearchParams(location.hash.substr(1)).get("task");
    if (names.indexOf(keep) >= 0) sel.value = keep;
    else if (want !== null && names.indexOf(want) >= 0) sel.value = want;
  }
}
function scale(m){
  return Math.max(1, Math.min(16, Math.floor(720 / Math.max(m.shape[1], m.shape[2]))));
}
function drawMap(){
  var t = currentTask(), cv = $("map"), ctx = cv.getContext("2d");
  if (!t || !t.map){ cv.width = cv.height = 1; drawn = null; return; }
  var m = t.map, a = decode(m.codes), d0 = m.shape[0], h = m.shape[1], w = m.shape[2];
  var sl = $("slice"); sl.max = String(d0 - 1);
  if (+sl.value > d0 - 1) sl.value = String(d0 - 1);
  var z = +sl.value, proj = $("maxproj").checked;
  text($("slice-n"), proj ? "all " + d0 : (z + " of 0.." + (d0 - 1)));
  var k = scale(m); cv.width = w * k; cv.height = h * k;
  var img = ctx.createImageData(w, h), rgb = state.colours.map(function(c){
    return [parseInt(c.substr(1,2),16), parseInt(c.substr(3,2),16), parseInt(c.substr(5,2),16)];
  });
  var plane = new Uint8Array(w * h);
  for (var y = 0; y < h; y++) for (var x = 0; x < w; x++){
    var v;
    if (proj){
      v = 0;
      for (var zz = 0; zz < d0; zz++){
        var c = a[(zz*h + y)*w + x]; if (PRIORITY[c] > PRIORITY[v]) v = c;
      }
    }
    else v = a[(z*h + y)*w + x];
    plane[y*w + x] = v;
    var p = (y*w + x) * 4, col = rgb[v] || [0,0,0];
    img.data[p] = col[0]; img.data[p+1] = col[1]; img.data[p+2] = col[2]; img.data[p+3] = 255;
  }
  var tmp = document.createElement("canvas"); tmp.width = w; tmp.height = h;
  tmp.getContext("2d").putImageData(img, 0, 0);
  ctx.imageSmoothingEnabled = false; ctx.drawImage(tmp, 0, 0, w * k, h * k);
  drawn = {task: t, z: z, proj: proj, plane: plane, k: k, codes: a};
}
function describe(t, z, y, x, proj){
  var m = t.map, h = m.shape[1], w = m.shape[2], tile = m.tile;
  var code = proj ? drawn.plane[y*w + x] : drawn.codes[(z*h + y)*w + x];
  var lines = ["task " + t.name, "state " + state.states[code]];
  if (tile[0] * tile[1] * tile[2] > 1){
    var span = [z, y, x].map(function(c, i){
      return (c * tile[i]) + ".." + ((c + 1) * tile[i] - 1);
    });
    lines.push("tile of " + tile.join(" x ") + " cells: cells [" + span.join(", ") + "]");
    return {text: lines.join("\\n"), code: code};
  }
  var nd = m.ndim, v = [z, y, x], coord = v.slice(3 - nd);
  var flat = (z*h + y)*w + x;
  lines.push("cell " + coord.join(", ") + " (flat " + flat + ")" +
    (proj ? " (projection: the max over axis 0)" : ""));
  if (m.first_cell && code !== 0){
    var idx = v.map(function(c, i){ return c - m.first_cell[i]; }).slice(3 - nd);
    lines.push("block id " + cantor(idx) + " (grid index " + idx.join(", ") + ")");
  }
  if (m.intervals && code !== 0){
    var iv = [m.intervals[0][m.intervals[0].length > 1 ? z : 0],
              m.intervals[1][m.intervals[1].length > 1 ? y : 0],
              m.intervals[2][x]].slice(3 - nd);
    if (iv.every(function(q){ return q; }))
      lines.push("ROI [" + iv.map(function(q){ return q[0] + ":" + q[1]; }).join(", ") + ")");
  }
  var det = proj ? null : m.details[String(flat)];
  lines.push("failed attempts " + (det ? det.attempts : (code === 0 || proj ? "-" : "0")));
  if (det && det.error) lines.push("last error " + det.error);
  return {text: lines.join("\\n"), code: code, flat: flat};
}
function pixelAt(x, y){
  var k = drawn.k, ctx = $("map").getContext("2d");
  var p = ctx.getImageData(x*k + (k>>1), y*k + (k>>1), 1, 1).data;
  return "#" + [p[0], p[1], p[2]].map(function(c){
    return c.toString(16).padStart(2, "0");
  }).join("");
}
function showCell(z, y, x){
  if (!drawn) return;
  var d = describe(drawn.task, z, y, x, drawn.proj), pre = $("block");
  text(pre, d.text); pre.setAttribute("data-state", String(d.code));
  pre.setAttribute("data-pixel", pixelAt(x, y));
}
function fromHash(){
  if (!drawn || !location.hash) return;
  var q = new URLSearchParams(location.hash.substr(1)), m = drawn.task.map;
  if (!m) return;
  if (q.has("proj") && $("maxproj").checked !== (q.get("proj") === "1")){
    $("maxproj").checked = q.get("proj") === "1"; drawMap();
  }
  var h = m.shape[1], w = m.shape[2], flat = null;
  if (q.has("cell")) flat = +q.get("cell");
  if (q.has("block") && m.first_cell){
    var want = +q.get("block"), nd = m.ndim;
    for (var f = 0; f < m.shape[0]*h*w && flat === null; f++){
      var v = [Math.floor(f/(h*w)), Math.floor(f/w)%h, f%w];
      var idx = v.map(function(c, i){ return c - m.first_cell[i]; }).slice(3 - nd);
      if (idx.every(function(c){ return c >= 0; }) && cantor(idx) === want) flat = f;
    }
  }
  if (flat === null || flat < 0 || flat >= m.shape[0]*h*w) return;
  var z = Math.floor(flat/(h*w));
  if (!drawn.proj && z !== drawn.z){ $("slice").value = String(z); drawMap(); }
  showCell(z, Math.floor(flat/w)%h, flat%w);
}
function renderErrors(){
  var box = $("errors"); box.innerHTML = ""; var any = false;
  state.tasks.forEach(function(t){
    (t.errors || []).forEach(function(g){
      any = true; var div = document.createElement("div"); div.className = "group";
      var h = document.createElement("b");
      text(h, t.name + ": " + g.title + " (" + g.count + " failed attempts)");
      div.appendChild(h);
      var pre = document.createElement("pre");
      text(pre, (g.where ? "at " + g.where + "\\n" : "") + "blocks (grid cells) " +
        g.blocks.map(function(b){ return "(" + b.join(",") + ")"; }).join(" ") +
        (g.log ? "\\nlog tail: " + g.log : ""));
      div.appendChild(pre); box.appendChild(div);
    });
  });
  if (!any) text(box, "none");
  var links = $("links"), q = "?token=" + encodeURIComponent(token);
  if (!links.children.length){
    [["report-link", state.report_url, "the HTML report"],
     ["trace-link", state.trace_url, "the trace (Chrome JSON: open it in ui.perfetto.dev)"]]
      .forEach(function(l){
        var a = document.createElement("a"); a.id = l[0]; a.href = l[1] + q;
        a.target = "_blank"; a.rel = "noopener"; text(a, l[2]);
        links.appendChild(a); links.appendChild(document.createTextNode(" "));
      });
  }
  links.setAttribute("data-finished", state.finished ? "yes" : "no");
  links.firstChild.textContent = state.finished ? "the HTML report" :
    "the HTML report (so far)";
  var files = $("files"); files.innerHTML = "";
  state.tasks.forEach(function(t){
    var p = document.createElement("pre");
    text(p, t.name + ": store " + t.path + "\\nruns " + t.runs_jsonl +
      "\\nreport: " + t.report_hint);
    files.appendChild(p);
  });
}
var LANE_H = 18, LANE_LABEL = 90, LANE_W = 720, lanesDrawn = null;
function renderRecent(){
  var t = currentTask(), r = t && t.recent, cv = $("lanes"), ctx = cv.getContext("2d");
  var hc = $("walls"), hctx = hc.getContext("2d"), tr = $("trend");
  var note = $("lanes-note");
  if (!note.getAttribute("data-text")) note.setAttribute("data-text", note.textContent);
  text(note, r && r.error ? r.error : t && t.from_driver ?
    "no block has come back yet" : note.getAttribute("data-text"));
  if (r && r.error) r = null;
  note.style.display = r ? "none" : "";
  if (!r){
    cv.width = cv.height = hc.width = hc.height = 1; lanesDrawn = null; text(tr, "");
    cv.setAttribute("data-workers", "0"); cv.setAttribute("data-running-marks", "0");
    hc.setAttribute("data-blocks", "0"); return;
  }
  var span = Math.max(1e-3, r.end - r.start), done = state.colours[2];
  cv.width = LANE_LABEL + LANE_W; cv.height = r.lanes.length * LANE_H;
  ctx.fillStyle = "#ffffff"; ctx.fillRect(0, 0, cv.width, cv.height);
  ctx.font = "11px sans-serif";
  r.lanes.forEach(function(lane, i){
    var y = i * LANE_H;
    ctx.fillStyle = state.colours[1]; ctx.fillRect(LANE_LABEL, y + 2, LANE_W, LANE_H - 4);
    ctx.fillStyle = "#333333";
    ctx.fillText("worker " + lane.worker + " (" + lane.blocks.length + ")", 2, y + 13);
    lane.blocks.forEach(function(b){
      var x0 = LANE_LABEL + b[0] / span * LANE_W;  // (seconds after r.start)
      var x1 = LANE_LABEL + b[1] / span * LANE_W;
      ctx.fillStyle = b[5] ? state.colours[4] : done;
      ctx.fillRect(Math.max(LANE_LABEL, x0), y + 2, Math.max(1, x1 - x0), LANE_H - 4);
    });
  });
  var marks = r.marks || [], shown = 0, going = 0;
  marks.forEach(function(m){
    var i = laneIndex(r, m.worker);
    if (i < 0 || m.end < r.start) return;
    var y = i * LANE_H, x0 = LANE_LABEL + Math.max(0, m.start - r.start) / span * LANE_W;
    var w = Math.max(3, (m.end - Math.max(m.start, r.start)) / span * LANE_W);
    if (m.won === false){  // the copy that lost ran until it was stopped: hatched
      for (var hx = 0; hx < w; hx += 4){
        ctx.fillStyle = (hx / 4) % 2 ? "#ffffff" : "#bbbbbb";
        ctx.fillRect(x0 + hx, y + 2, Math.min(4, w - hx), LANE_H - 4);
      }
    }
    ctx.strokeStyle = m.kind === "backup" ? "#1f77b4" : "#9467bd"; ctx.lineWidth = 2;
    if (m.running){  // a race still going: both copies run, up to now (dashed)
      ctx.setLineDash([4, 3]); going++;
    }
    ctx.strokeRect(x0, y + 2, w, LANE_H - 4); ctx.setLineDash([]); shown++;
  });
  lanesDrawn = {r: r, span: span};
  cv.setAttribute("data-workers", String(r.lanes.length));
  cv.setAttribute("data-blocks", String(r.blocks));
  cv.setAttribute("data-source", r.source || "store");
  cv.setAttribute("data-marks", String(shown));
  cv.setAttribute("data-running-marks", String(going));
  cv.setAttribute("data-backup-cells", marks.filter(function(m){ return m.kind === "backup"; })
    .map(function(m){ return String(m.cell); }).join(" "));
  var h = r.histogram, n = h.counts.length, top = Math.max.apply(null, h.counts.concat([1]));
  hc.width = 24 * Math.max(n, 1) + 40; hc.height = 120;
  hctx.fillStyle = "#ffffff"; hctx.fillRect(0, 0, hc.width, hc.height);
  hctx.fillStyle = done;
  h.counts.forEach(function(c, i){
    var bh = Math.round(c / top * 100); hctx.fillRect(20 + i * 24, 105 - bh, 20, bh);
  });
  hctx.fillStyle = "#333333"; hctx.font = "10px sans-serif";
  if (n) hctx.fillText("0 .. " + h.edges[n].toFixed(3) + " s", 20, 118);
  var total = h.counts.reduce(function(a, c){ return a + c; }, 0);
  hc.setAttribute("data-blocks", String(total));
  var f = r.trend, line = total + " blocks in the last " + fmtDur(r.end - r.start);
  if (f) line += "; trend " + (f.slope_per_minute >= 0 ? "+" : "") +
    f.slope_per_minute.toFixed(3) + " s per minute (" + Math.round(f.rise * 100) +
    "% over the window, r " + f.r.toFixed(2) + ")" +
    (f.rising ? ": RISING, blocks grow slower (memory pressure? a filling disk?)" : "");
  text(tr, line); tr.setAttribute("data-rising", f && f.rising ? "yes" : "no");
  tr.className = f && f.rising ? "rising" : "";
}
function laneIndex(r, worker){
  for (var i = 0; i < r.lanes.length; i++) if (r.lanes[i].worker === worker) return i;
  return -1;
}
function markText(m){
  return (m.kind === "backup" ? "backup copy" : "straggler (the original)") + " of cell " +
    m.cell + ": " + (m.running ? "running, " + (m.end - m.start).toFixed(3) + " s so far" :
    m.won ? "won" : "lost, stopped after " + (m.end - m.start).toFixed(3) + " s");
}
function laneAt(x, y){
  if (!lanesDrawn) return;
  var r = lanesDrawn.r, lane = r.lanes[Math.floor(y / LANE_H)];
  if (!lane || x < LANE_LABEL) return;
  var t = (x - LANE_LABEL) / LANE_W * lanesDrawn.span, pre = $("lane-block");
  var px = lanesDrawn.span / LANE_W, marked = (r.marks || []).filter(function(m){
    return m.worker === lane.worker && r.start + t >= m.start - 3 * px &&
      r.start + t <= m.end + 3 * px;
  }).map(markText).join("; ");
  if (marked){ text(pre, "worker " + lane.worker + ": " + marked); return; }
  for (var i = 0; i < lane.blocks.length; i++){
    var b = lane.blocks[i];
    if (t >= b[0] - px && t <= b[1] + px){
      text(pre, "worker " + lane.worker + ": cell (flat) " + b[2] + ", wall " +
        (b[1] - b[0]).toFixed(3) + " s, ended " +
        new Date((r.start + b[1]) * 1000).toLocaleTimeString() +
        (b[3] === null ? "" : ", peak RSS " + b[3] + " MB") +
        (b[4] === null ? "" : ", CPU " + Math.round(b[4] * 100) + "%") +
        (b[5] ? ", failed" : ""));
      return;
    }
  }
  text(pre, "worker " + lane.worker + ": idle");
}
function render(){
  var running = state.tasks.filter(function(t){ return t.running; }).length;
  text($("status"), (state.finished ? "run finished (no run holds the stores)" :
    !state.run_known ? "run state unknown (a store without a lock file: daisy 2.0.0's)" :
    "run in progress (" + running + " tasks)") +
    "; updated " + new Date(state.time * 1000).toLocaleTimeString());
  document.body.setAttribute("data-finished", state.finished ? "yes" : "no");
  renderLegend(); renderCounts(); renderSelect(); drawMap(); renderRecent();
  renderErrors();
  if (hoverCell) showCell(hoverCell[0], hoverCell[1], hoverCell[2]); else fromHash();
  window.bellisLive = state;
  document.body.setAttribute("data-rendered", "yes");
}
function refresh(){
  fetch("api/state.json?token=" + encodeURIComponent(token), {cache: "no-store"})
    .then(function(r){ if (!r.ok) throw new Error("HTTP " + r.status); return r.json(); })
    .then(function(s){ state = s; render(); })
    .catch(function(e){ text($("status"), "cannot fetch the state: " + e); })
    .finally(function(){ setTimeout(refresh, 1500); });
}
var legend = $("legend");
function renderLegend(){
  if (legend.children.length) return;
  state.states.forEach(function(n, i){
    var s = document.createElement("span"), sw = document.createElement("i");
    sw.style.background = state.colours[i]; s.appendChild(sw);
    s.appendChild(document.createTextNode(n)); legend.appendChild(s);
  });
}
$("map").addEventListener("mousemove", function(e){
  if (!drawn || !drawn.task.map) return;
  var r = e.target.getBoundingClientRect(), k = drawn.k;
  var x = Math.floor((e.clientX - r.left) / k), y = Math.floor((e.clientY - r.top) / k);
  if (x < 0 || y < 0 || x >= drawn.task.map.shape[2] || y >= drawn.task.map.shape[1]) return;
  hoverCell = [drawn.z, y, x]; showCell(drawn.z, y, x);
});
$("slice").addEventListener("input", function(){ hoverCell = null; drawMap(); });
$("maxproj").addEventListener("change", function(){ hoverCell = null; drawMap(); });
$("task").addEventListener("change", function(){
  hoverCell = null; drawMap(); renderRecent();
});
$("lanes").addEventListener("mousemove", function(e){
  var r = e.target.getBoundingClientRect(); laneAt(e.clientX - r.left, e.clientY - r.top);
});
window.addEventListener("hashchange", function(){ hoverCell = null; fromHash(); });
refresh();
})();
</script></body></html>
"""
