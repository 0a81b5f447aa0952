"""Inline CSS and JavaScript of the HTML report (no file or network is ever loaded)."""
from __future__ import annotations

CSS = r"""
:root {
  --bg: #f6f7f9; --card: #ffffff; --fg: #1f2933; --muted: #5f6b7a; --line: #e3e7ed;
  --grid: #edf0f4; --axis: #9aa5b1; --accent: #2563eb; --good: #047857; --good-bg: #e7f6ef;
  --bad: #b42318; --warn-bg: #fff7e6; --live: #94a3b8; --chip: #eef2f7;
  --seg-live: #3b82f6; --seg-round: #f59e0b; --seg-partial: #f87171; --seg-free: #e5e7eb;
  --seg-cached: #cbd5e1;
}
@media (prefers-color-scheme: dark) {
  :root {
    --bg: #0f141a; --card: #171d25; --fg: #e6e9ee; --muted: #9aa6b4; --line: #2a323d;
    --grid: #222a34; --axis: #6b7785; --accent: #60a5fa; --good: #34d399; --good-bg: #12372b;
    --bad: #f87171; --warn-bg: #3a2e12; --live: #64748b; --chip: #222a34;
    --seg-free: #2a323d; --seg-cached: #475569;
  }
}
* { box-sizing: border-box; }
html { -webkit-text-size-adjust: 100%; }
body {
  margin: 0; background: var(--bg); color: var(--fg);
  font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial,
        "Noto Sans", "Liberation Sans", sans-serif;
}
header.top { background: var(--card); border-bottom: 1px solid var(--line); }
.wrap { max-width: 1180px; margin: 0 auto; padding: 0 24px; }
header.top .wrap { padding-top: 22px; padding-bottom: 14px; }
h1 { font-size: 24px; margin: 0 0 4px; letter-spacing: -0.01em; }
h2 { font-size: 19px; margin: 0 0 12px; letter-spacing: -0.005em; }
h3 { font-size: 15px; margin: 18px 0 8px; }
.sub { color: var(--muted); font-size: 14px; }
.sub b { color: var(--fg); font-weight: 600; }
nav.toc { margin-top: 12px; display: flex; flex-wrap: wrap; gap: 6px; }
nav.toc a {
  font-size: 13px; color: var(--fg); text-decoration: none; background: var(--chip);
  padding: 3px 10px; border-radius: 999px; border: 1px solid var(--line);
}
nav.toc a:hover { border-color: var(--accent); color: var(--accent); }
main .wrap { padding-top: 20px; padding-bottom: 40px; }
section.card {
  background: var(--card); border: 1px solid var(--line); border-radius: 10px;
  padding: 20px 22px; margin: 0 0 18px; box-shadow: 0 1px 2px rgba(16, 24, 40, 0.04);
}
p { margin: 0 0 10px; }
.muted { color: var(--muted); }
.small { font-size: 13px; }
.verdict { font-size: 17px; line-height: 1.55; margin: 0 0 14px; }
.kpis { display: grid; grid-template-columns: repeat(auto-fit, minmax(190px, 1fr)); gap: 12px; }
.kpi { border: 1px solid var(--line); border-radius: 8px; padding: 10px 14px; }
.kpi .label { color: var(--muted); font-size: 12px; text-transform: uppercase; letter-spacing: 0.04em; }
.kpi .value { font-size: 22px; font-weight: 650; font-variant-numeric: tabular-nums; }
.kpi .note { color: var(--muted); font-size: 12.5px; }
table { border-collapse: collapse; width: 100%; font-size: 14px; }
th, td { padding: 7px 10px; border-bottom: 1px solid var(--line); text-align: left; vertical-align: top; }
th { font-size: 12px; color: var(--muted); font-weight: 600; text-transform: uppercase;
     letter-spacing: 0.03em; white-space: nowrap; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tbody tr:hover { background: var(--chip); }
td.best { color: var(--good); font-weight: 650; }
tr.subject td:first-child { font-weight: 650; }
.swatch { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin-right: 7px;
          vertical-align: baseline; }
.bar { position: relative; height: 6px; background: var(--chip); border-radius: 3px; margin-top: 4px;
       min-width: 80px; }
.bar > span { position: absolute; left: 0; top: 0; bottom: 0; border-radius: 3px; background: var(--accent); }
td.site { width: 45%; font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, "Liberation Mono", monospace;
          font-size: 12.5px; word-break: break-all; }
.chart { position: relative; }
.chart svg { display: block; width: 100%; height: auto; overflow: visible; }
.legend { display: flex; flex-wrap: wrap; gap: 6px 16px; margin: 4px 0 8px; font-size: 13px; }
.legend .item { cursor: pointer; user-select: none; white-space: nowrap; }
.legend .item.off { opacity: 0.35; }
.legend .line { display: inline-block; width: 18px; height: 3px; border-radius: 2px; margin-right: 6px;
                vertical-align: middle; }
svg text { fill: var(--muted); font-size: 12px; font-family: inherit; }
svg .grid { stroke: var(--grid); stroke-width: 1; }
svg .axis { stroke: var(--axis); stroke-width: 1; }
svg .live-area { fill: var(--live); fill-opacity: 0.35; stroke: var(--live); stroke-width: 1; }
svg .series { fill: none; stroke-width: 1.8; stroke-linejoin: round; }
svg .guide { stroke: var(--fg); stroke-opacity: 0.35; stroke-width: 1; stroke-dasharray: 3 3; }
svg .peak-dot { fill: var(--fg); }
svg .peak-label { fill: var(--fg); font-size: 12px; font-weight: 600; paint-order: stroke;
                   stroke: var(--card); stroke-width: 4px; stroke-linejoin: round; }
svg rect.hbar { fill: var(--accent); }
svg rect.hbar.bytes { fill: #0d9488; }
svg rect.hbar:hover { fill-opacity: 0.75; }
.tip {
  position: absolute; pointer-events: none; z-index: 10; display: none; min-width: 150px;
  background: var(--card); color: var(--fg); border: 1px solid var(--line); border-radius: 8px;
  box-shadow: 0 6px 18px rgba(16, 24, 40, 0.16); padding: 8px 10px; font-size: 12.5px;
  font-variant-numeric: tabular-nums; white-space: nowrap;
}
.tip .t { font-weight: 650; margin-bottom: 4px; }
.tip .r { display: flex; justify-content: space-between; gap: 14px; }
.two { display: grid; grid-template-columns: 1fr 1fr; gap: 22px; }
@media (max-width: 900px) { .two { grid-template-columns: 1fr; } }
.stack { display: flex; height: 26px; border-radius: 6px; overflow: hidden; border: 1px solid var(--line);
         margin: 6px 0 8px; }
.stack > div { height: 100%; }
.stack-legend { display: flex; flex-wrap: wrap; gap: 6px 18px; font-size: 13px; }
.segmap { font-size: 12px; }
.segmap .row { display: grid; grid-template-columns: 190px 1fr; gap: 10px; align-items: center; margin: 2px 0; }
.segmap .lab { color: var(--muted); white-space: nowrap; overflow: hidden; text-overflow: ellipsis;
               font-variant-numeric: tabular-nums; }
.segmap svg { display: block; width: 100%; height: 12px; }
.note-box { background: var(--warn-bg); border-radius: 8px; padding: 10px 12px; font-size: 14px; }
footer { color: var(--muted); font-size: 12.5px; text-align: center; padding: 10px 0 30px; }
code { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, "Liberation Mono", monospace;
       font-size: 0.92em; background: var(--chip); padding: 1px 5px; border-radius: 4px; }
@media print {
  body { background: #fff; }
  section.card { box-shadow: none; break-inside: avoid; }
  nav.toc { display: none; }
}
"""

# The page's only script: tooltips and legend toggles. It reads data from the JSON block with
# id "vk-data" and touches nothing outside the page.
JS = r"""
(function () {
  "use strict";
  var dataEl = document.getElementById("vk-data");
  var DATA = dataEl ? JSON.parse(dataEl.textContent) : {};
  var UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];

  function fmtBytes(n) {
    if (n === null || n === undefined || isNaN(n)) { return "\u2014"; }
    var neg = n < 0, v = Math.abs(n), u = 0;
    while (v >= 1024 && u < UNITS.length - 1) { v /= 1024; u += 1; }
    var s = u === 0 ? String(Math.round(v)) : (v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2));
    return (neg ? "-" : "") + s + " " + UNITS[u];
  }
  function fmtInt(n) { return Math.round(n).toLocaleString("en-US"); }

  function makeTip(container) {
    var tip = document.createElement("div");
    tip.className = "tip";
    container.appendChild(tip);
    return tip;
  }
  function placeTip(tip, container, clientX, clientY) {
    var box = container.getBoundingClientRect();
    var x = clientX - box.left + 14, y = clientY - box.top + 14;
    tip.style.display = "block";
    var w = tip.offsetWidth, h = tip.offsetHeight;
    if (x + w > box.width) { x = clientX - box.left - w - 14; }
    if (x < 0) { x = 0; }
    if (y + h > box.height) { y = Math.max(0, clientY - box.top - h - 14); }
    tip.style.left = x + "px";
    tip.style.top = y + "px";
  }
  function row(label, value, color) {
    var r = document.createElement("div");
    r.className = "r";
    var a = document.createElement("span");
    if (color) {
      var sw = document.createElement("span");
      sw.className = "swatch";
      sw.style.background = color;
      a.appendChild(sw);
    }
    a.appendChild(document.createTextNode(label));
    var b = document.createElement("span");
    b.textContent = value;
    r.appendChild(a);
    r.appendChild(b);
    return r;
  }

  function svgPoint(svg, clientX, clientY) {
    var m = svg.getScreenCTM();
    if (!m) { return null; }
    var p = svg.createSVGPoint();
    p.x = clientX; p.y = clientY;
    return p.matrixTransform(m.inverse());
  }

  // Line chart: memory over the trace.
  function setupTimeline(chart) {
    var spec = DATA.timeline;
    if (!spec) { return; }
    var svg = chart.querySelector("svg");
    var overlay = svg.querySelector(".overlay");
    var guide = svg.querySelector(".guide");
    var tip = makeTip(chart);
    var hidden = {};
    function hide() { tip.style.display = "none"; if (guide) { guide.setAttribute("visibility", "hidden"); } }
    function show(ev) {
      var p = svgPoint(svg, ev.clientX, ev.clientY);
      if (!p) { return; }
      var n = spec.x.length;
      if (n === 0) { return; }
      var f = (p.x - spec.left) / spec.width;
      if (f < 0 || f > 1) { hide(); return; }
      var i = Math.min(n - 1, Math.max(0, Math.floor(f * n)));
      var gx = spec.left + (i + 0.5) * spec.width / n;
      if (guide) {
        guide.setAttribute("x1", gx); guide.setAttribute("x2", gx);
        guide.setAttribute("visibility", "visible");
      }
      tip.textContent = "";
      var head = document.createElement("div");
      head.className = "t";
      var hi = i + 1 < n ? spec.x[i + 1] - 1 : spec.n_ops - 1;
      head.textContent = hi > spec.x[i] ? "ops " + fmtInt(spec.x[i]) + "\u2013" + fmtInt(hi)
                                        : "op " + fmtInt(spec.x[i]);
      tip.appendChild(head);
      for (var k = 0; k < spec.series.length; k++) {
        var s = spec.series[k];
        if (hidden[s.key]) { continue; }
        tip.appendChild(row(s.name, fmtBytes(s.values[i]), s.color));
      }
      placeTip(tip, chart, ev.clientX, ev.clientY);
    }
    overlay.addEventListener("mousemove", show);
    overlay.addEventListener("mouseleave", hide);
    var items = chart.parentNode.querySelectorAll(".legend .item");
    Array.prototype.forEach.call(items, function (item) {
      item.addEventListener("click", function () {
        var key = item.getAttribute("data-key");
        hidden[key] = !hidden[key];
        item.classList.toggle("off", !!hidden[key]);
        var els = svg.querySelectorAll('[data-series="' + key + '"]');
        Array.prototype.forEach.call(els, function (el) {
          el.setAttribute("visibility", hidden[key] ? "hidden" : "visible");
        });
      });
    });
  }

  // Any element with data-tip gets a simple tooltip inside its .chart container.
  function setupSimpleTips(container) {
    var tip = makeTip(container);
    var els = container.querySelectorAll("[data-tip]");
    Array.prototype.forEach.call(els, function (el) {
      el.addEventListener("mousemove", function (ev) {
        tip.textContent = "";
        var lines = el.getAttribute("data-tip").split("\n");
        var head = document.createElement("div");
        head.className = "t";
        head.textContent = lines[0];
        tip.appendChild(head);
        for (var i = 1; i < lines.length; i++) {
          var d = document.createElement("div");
          d.textContent = lines[i];
          tip.appendChild(d);
        }
        placeTip(tip, container, ev.clientX, ev.clientY);
      });
      el.addEventListener("mouseleave", function () { tip.style.display = "none"; });
    });
  }

  var timeline = document.getElementById("timeline-chart");
  if (timeline) { setupTimeline(timeline); }
  Array.prototype.forEach.call(document.querySelectorAll(".chart.tips"), setupSimpleTips);
})();
"""
