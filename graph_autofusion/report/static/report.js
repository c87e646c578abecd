/* graph-autofusion HTML report: draws the model graphs (layout by the vendored dagre),
 * zoom and pan, collapsible blocks, clickable fused groups with their details, and makes
 * the tables sortable and filterable. Reads only the JSON block #gaf-data; every text it
 * writes goes through textContent (never innerHTML), so names cannot inject markup. */
(function () {
  "use strict";
  var DATA = JSON.parse(document.getElementById("gaf-data").textContent);
  var NS = "http://www.w3.org/2000/svg"; // the SVG namespace name, not a resource
  var COLLAPSE_OVER = 150; // operator count above which blocks start collapsed
  var svg = document.getElementById("graph");
  var status = document.getElementById("graph-status");
  var details = document.getElementById("details");
  var state = { which: null, collapsed: {}, view: { x: 0, y: 0, k: 1 }, layout: null };
  window.GAF = { data: DATA, state: state };

  function el(tag, attrs, text) {
    var e = document.createElementNS(NS, tag);
    for (var k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function h(tag, text, cls) {
    var e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }
  function fmt(x, d) {
    if (x === null || x === undefined) return "?";
    if (typeof x !== "number") return String(x);
    return x.toFixed(d === undefined ? 2 : d);
  }
  function arrow(p, d) { return p ? fmt(p[0], d) + " \u2192 " + fmt(p[1], d) : "?"; }

  // ------------------------------------------------------------------ graph layout
  function nodeWidth(label, most) { return Math.max(46, Math.min(most || 190, 7 * label.length + 16)); }
  function shortOp(op) { var i = op.lastIndexOf("::"); return i >= 0 ? op.slice(i + 2) : op; }

  function members(view) {
    var m = {};
    view.nodes.forEach(function (n, i) { if (n[2] >= 0) (m[n[2]] = m[n[2]] || []).push(i); });
    return m;
  }

  function build(view, collapsed) {
    var g = new dagre.graphlib.Graph({ compound: true });
    g.setGraph({ rankdir: "TB", nodesep: 16, ranksep: 26, edgesep: 8, marginx: 24, marginy: 24 });
    g.setDefaultEdgeLabel(function () { return {}; });
    var vis = [], byBlock = members(view);
    view.nodes.forEach(function (n, i) {
      var b = n[2];
      if (b >= 0 && collapsed[b]) { vis[i] = "b" + b; return; }
      vis[i] = "n" + i;
      var label = n[4] === 0 ? shortOp(n[1]) : n[0];
      g.setNode(vis[i], { width: nodeWidth(label), height: 26, idx: i, label: label });
    });
    Object.keys(byBlock).forEach(function (b) {
      var ids = byBlock[b], label = view.blocks[b];
      if (collapsed[b]) {
        var fused = {};
        ids.forEach(function (i) { if (view.nodes[i][3] >= 0) fused[view.nodes[i][3]] = 1; });
        var nf = Object.keys(fused).length;
        var text = label + "  (" + ids.length + " ops" + (nf ? ", " + nf + " fused" : "") + ")";
        g.setNode("b" + b, { width: nodeWidth(text, 420), height: 34, block: +b, label: text, fused: nf });
      } else {
        g.setNode("B" + b, { cluster: "block", block: +b, label: label });
        ids.forEach(function (i) { g.setParent(vis[i], "B" + b); });
      }
    });
    var byGroup = {};
    view.nodes.forEach(function (n, i) {
      if (n[3] >= 0 && vis[i][0] === "n") (byGroup[n[3]] = byGroup[n[3]] || []).push(i);
    });
    Object.keys(byGroup).forEach(function (gi) {
      var ids = byGroup[gi], b = view.nodes[ids[0]][2];
      var same = ids.every(function (i) { return view.nodes[i][2] === b; });
      if (!same) return; // spans blocks: its nodes are marked, not outlined
      g.setNode("G" + gi, { cluster: "group", group: +gi });
      if (b >= 0) g.setParent("G" + gi, "B" + b);
      ids.forEach(function (i) { g.setParent(vis[i], "G" + gi); });
    });
    var seen = {};
    view.edges.forEach(function (e) {
      var a = vis[e[0]], c = vis[e[1]], key = a + ">" + c;
      if (a !== c && !seen[key]) { seen[key] = 1; g.setEdge(a, c); }
    });
    dagre.layout(g);
    return g;
  }

  // ------------------------------------------------------------------ drawing
  var root = el("g", { id: "viewport" });
  var defs = el("defs");
  var marker = el("marker", { id: "arr", viewBox: "0 0 8 8", refX: "8", refY: "4",
    markerWidth: "7", markerHeight: "7", orient: "auto" });
  marker.appendChild(el("path", { d: "M0,0 L8,4 L0,8 z", fill: "#a4adba" }));
  defs.appendChild(marker);
  svg.appendChild(defs);
  svg.appendChild(root);

  function applyView() {
    var v = state.view;
    root.setAttribute("transform", "translate(" + v.x + "," + v.y + ") scale(" + v.k + ")");
  }

  function draw() {
    var view = DATA.graphs[state.which];
    var t0 = performance.now();
    var g = build(view, state.collapsed[state.which]);
    state.layout = g;
    while (root.firstChild) root.removeChild(root.firstChild);
    var lc = el("g"), lg = el("g"), le = el("g"), ln = el("g");
    root.appendChild(lc); root.appendChild(lg); root.appendChild(le); root.appendChild(ln);
    g.nodes().forEach(function (id) {
      var d = g.node(id);
      if (!d || !d.cluster) return;
      var x = d.x - d.width / 2, y = d.y - d.height / 2;
      if (d.cluster === "block") {
        var c = el("g", { "class": "cluster", "data-block": d.block });
        c.appendChild(el("rect", { x: x, y: y, width: d.width, height: d.height, rx: 8 }));
        var t = el("text", { x: x + 6, y: y + 12 }, "\u25BE " + d.label);
        t.addEventListener("click", function (ev) { ev.stopPropagation(); toggleBlock(d.block); });
        c.appendChild(t);
        lc.appendChild(c);
      } else {
        var grp = DATA.groups[d.group];
        var r = el("g", { "class": "grp st-" + grp.status, "data-group": d.group });
        r.appendChild(el("rect", { x: x - 3, y: y - 3, width: d.width + 6, height: d.height + 6 }));
        r.addEventListener("click", function (ev) { ev.stopPropagation(); showGroup(d.group); });
        lg.appendChild(r);
      }
    });
    g.edges().forEach(function (e) {
      var pts = g.edge(e).points;
      var dd = "M" + pts.map(function (p) { return p.x.toFixed(1) + "," + p.y.toFixed(1); }).join(" L");
      le.appendChild(el("path", { "class": "edge", d: dd, "marker-end": "url(#arr)" }));
    });
    g.nodes().forEach(function (id) {
      var d = g.node(id);
      if (!d || d.cluster) return;
      var x = d.x - d.width / 2, y = d.y - d.height / 2, node;
      if (d.block !== undefined) {
        node = el("g", { "class": "gnode block" + (d.fused ? " has-fused" : ""), "data-block": d.block });
        node.addEventListener("click", function (ev) { ev.stopPropagation(); if (!moved) toggleBlock(d.block); });
      } else {
        var n = view.nodes[d.idx];
        var cls = "gnode" + (n[4] ? " io" : "") + (n[3] >= 0 ? " in-group" : "");
        node = el("g", { "class": cls, "data-node": d.idx });
        if (n[3] >= 0) node.setAttribute("data-group", n[3]);
        node.appendChild(el("title", {}, n[0] + " (" + n[1] + ")"));
        node.addEventListener("click", function (ev) { ev.stopPropagation(); if (!moved) showNode(d.idx); });
      }
      node.appendChild(el("rect", { x: x, y: y, width: d.width, height: d.height, rx: 4 }));
      node.appendChild(el("text", { x: d.x, y: d.y + 4, "text-anchor": "middle" }, d.label));
      ln.appendChild(node);
    });
    var gw = g.graph();
    var hidden = (view.hidden_edges || []).length;
    status.textContent = view.ops + " operators, " + g.nodeCount() + " drawn, layout " +
      Math.round(performance.now() - t0) + " ms" + (hidden ? "; " + hidden +
      " edges of widely read values not drawn (a node's details list them)" : "") +
      "; wheel: zoom, drag: pan";
    state.size = { w: gw.width || 1, h: gw.height || 1 };
    svg.setAttribute("data-rendered", state.which);
  }

  var READABLE = 0.5; // the smallest scale whose labels can be read
  function fit(whole) {
    // the whole graph when it is readable so (or when asked: the "fit" button); else its
    // top at a readable scale, to pan and zoom from
    var r = svg.getBoundingClientRect(), s = state.size;
    var k = Math.min(r.width / s.w, r.height / s.h, 1.5);
    if (k >= READABLE || whole === true) {
      state.view = { k: k, x: (r.width - s.w * k) / 2, y: Math.max(0, (r.height - s.h * k) / 2) };
    } else {
      k = Math.max(READABLE, Math.min(1, r.width / s.w));
      state.view = { k: k, x: (r.width - s.w * k) / 2, y: 10 };
    }
    applyView();
  }
  function centerOn(x, y, k) {
    var r = svg.getBoundingClientRect();
    state.view = { k: k, x: r.width / 2 - x * k, y: r.height / 2 - y * k };
    applyView();
  }

  function show(which) {
    if (!DATA.graphs[which]) return;
    state.which = which;
    if (!state.collapsed[which]) {
      var view = DATA.graphs[which], c = {};
      if (view.ops > COLLAPSE_OVER) view.blocks.forEach(function (_, b) { c[b] = true; });
      state.collapsed[which] = c;
    }
    document.querySelectorAll("[data-show]").forEach(function (b) {
      b.classList.toggle("on", b.getAttribute("data-show") === which);
    });
    draw(); fit();
  }
  function toggleBlock(b) {
    var c = state.collapsed[state.which];
    c[b] = !c[b];
    var before = state.view;
    draw();
    var d = state.layout.node(c[b] ? "b" + b : "B" + b);
    if (d) centerOn(d.x, d.y, Math.max(before.k, 0.6)); else fit();
    showBlock(b);
  }
  function setAll(flag) {
    var c = state.collapsed[state.which];
    DATA.graphs[state.which].blocks.forEach(function (_, b) { c[b] = flag; });
    draw(); fit();
  }

  // ------------------------------------------------------------------ zoom and pan
  var drag = null, moved = false;
  svg.addEventListener("wheel", function (ev) {
    ev.preventDefault();
    var r = svg.getBoundingClientRect(), v = state.view;
    var k = Math.max(0.05, Math.min(4, v.k * Math.exp(-ev.deltaY * 0.0015)));
    var px = ev.clientX - r.left, py = ev.clientY - r.top;
    state.view = { k: k, x: px - (px - v.x) * k / v.k, y: py - (py - v.y) * k / v.k };
    applyView();
  }, { passive: false });
  svg.addEventListener("mousedown", function (ev) {
    drag = { x: ev.clientX, y: ev.clientY, vx: state.view.x, vy: state.view.y }; moved = false;
  });
  window.addEventListener("mousemove", function (ev) {
    if (!drag) return;
    var dx = ev.clientX - drag.x, dy = ev.clientY - drag.y;
    if (Math.abs(dx) + Math.abs(dy) > 4) { moved = true; svg.classList.add("panning"); }
    if (moved) { state.view.x = drag.vx + dx; state.view.y = drag.vy + dy; applyView(); }
  });
  window.addEventListener("mouseup", function () {
    drag = null; svg.classList.remove("panning");
    setTimeout(function () { moved = false; }, 0);
  });
  function zoomBy(f) {
    var r = svg.getBoundingClientRect();
    var v = state.view, k = v.k * f, cx = r.width / 2, cy = r.height / 2;
    state.view = { k: k, x: cx - (cx - v.x) * f, y: cy - (cy - v.y) * f };
    applyView();
  }

  // ------------------------------------------------------------------ details panel
  function kv(rows) {
    var t = h("table");
    rows.forEach(function (r) {
      if (r[1] === undefined) return;
      var tr = h("tr");
      tr.appendChild(h("th", r[0]));
      var td = h("td", r[1]);
      if (r[2]) td.className = r[2];
      tr.appendChild(td);
      t.appendChild(tr);
    });
    return t;
  }
  function list(title, items, limit) {
    var box = h("div");
    box.appendChild(h("h4", title + " (" + items.length + ")"));
    var ul = h("ul");
    items.slice(0, limit || 40).forEach(function (s) { ul.appendChild(h("li", s)); });
    if (items.length > (limit || 40)) ul.appendChild(h("li", "\u2026", "muted"));
    box.appendChild(ul);
    return box;
  }
  function clearSel() {
    document.querySelectorAll(".sel").forEach(function (e) { e.classList.remove("sel"); });
  }
  function panel(title, kind) {
    while (details.firstChild) details.removeChild(details.firstChild);
    details.setAttribute("data-kind", kind);
    details.appendChild(h("h3", title));
    return details;
  }

  function showGroup(gi) {
    var grp = DATA.groups[gi];
    var c = grp.candidate !== null ? DATA.candidates[grp.candidate] : null;
    var p = panel(grp.key, "group");
    p.setAttribute("data-group", gi);
    clearSel();
    document.querySelectorAll('#graph [data-group="' + gi + '"]').forEach(function (e) {
      e.classList.add("sel");
    });
    var s = grp.safety || {};
    p.appendChild(kv([
      ["status", grp.status, grp.status === "applied" ? "pass" : "fail"],
      ["rule", grp.rule],
      ["fused operators", grp.fused_ops.join(", ") || "?"],
      ["code", grp.code],
      ["why", grp.message],
    ]));
    if (c) {
      p.appendChild(h("h4", "cost model estimate (" + DATA.profile + ")"));
      p.appendChild(kv([
        ["operators", c.ops.join(" + ")],
        ["HBM accesses", arrow(c.hbm_accesses, 0)],
        ["time \u00b5s", arrow(c.time_us, 2)],
        ["GFLOPS", arrow(c.gflops, 1)],
        ["local memory KiB", fmt(c.local_memory_bytes / 1024, 1) + " / " +
          fmt(c.local_memory_capacity / 1024, 1)],
        ["saving", c.saving === null ? "?" : fmt(100 * c.saving, 1) + "%"],
        ["verdict", c.verdict, "v-" + c.verdict],
        ["reason", c.reason],
      ]));
    }
    if (grp.safety) {
      p.appendChild(h("h4", "safe mode: verdict and precision"));
      p.appendChild(kv([
        ["verdict", s.passed ? "passed" : "failed: " + s.code, s.passed ? "pass" : "fail"],
        ["cosine", fmt(s.cosine, 9)],
        ["max abs error", fmt(s.max_abs, 6)],
        ["max rel error", fmt(s.max_rel, 6)],
        ["Monte-Carlo spread", fmt(s.mc_spread, 6)],
        ["measured \u00b5s", s.time_unfused_us === null ? "not measured" :
          fmt(s.time_unfused_us, 2) + " \u2192 " + fmt(s.time_fused_us, 2)],
      ]));
      Object.keys(s.outputs || {}).forEach(function (o) {
        var st = s.outputs[o];
        p.appendChild(kv([["%" + o, "cosine " + fmt(st.cosine, 9) + ", max abs " + fmt(st.max_abs, 6)]]));
      });
    }
    p.appendChild(list("replaced nodes", grp.nodes));
    if (grp.new_nodes.length) p.appendChild(list("nodes computing it now", grp.new_nodes));
  }
  function showNode(i) {
    var n = DATA.graphs[state.which].nodes[i];
    if (n[3] >= 0) { showGroup(n[3]); return; }
    var view = DATA.graphs[state.which];
    var p = panel(n[0], "node");
    clearSel();
    p.appendChild(kv([
      ["operator", n[1]],
      ["block", n[2] >= 0 ? view.blocks[n[2]] : "(top level)"],
      ["graph", state.which + " fusion"],
    ]));
    var feeds = [], reads = [];
    (view.hidden_edges || []).forEach(function (e) {
      if (e[0] === i) feeds.push(view.nodes[e[1]][0]);
      if (e[1] === i) reads.push(view.nodes[e[0]][0]);
    });
    if (feeds.length) p.appendChild(list("also read by (edges not drawn)", feeds));
    if (reads.length) p.appendChild(list("also reads from (edges not drawn)", reads));
  }
  function showBlock(b) {
    var view = DATA.graphs[state.which], ids = members(view)[b] || [];
    var p = panel(view.blocks[b], "block");
    var ops = {};
    ids.forEach(function (i) { ops[view.nodes[i][1]] = (ops[view.nodes[i][1]] || 0) + 1; });
    p.appendChild(kv([["operators", String(ids.length)],
      ["state", state.collapsed[state.which][b] ? "collapsed (click to expand)" : "expanded"]]));
    p.appendChild(list("operator types", Object.keys(ops).sort().map(function (o) {
      return o + " \u00d7" + ops[o];
    })));
  }

  function revealGroup(gi) {
    var grp = DATA.groups[gi];
    var which = grp.nodes.length && DATA.graphs.before ? "before" : "after";
    if (state.which !== which) show(which);
    var view = DATA.graphs[which], c = state.collapsed[which];
    var idx = [];
    view.nodes.forEach(function (n, i) { if (n[3] === gi) idx.push(i); });
    var changed = false;
    idx.forEach(function (i) { var b = view.nodes[i][2]; if (b >= 0 && c[b]) { c[b] = false; changed = true; } });
    if (changed) draw();
    var d = state.layout.node("G" + gi) || (idx.length ? state.layout.node("n" + idx[0]) : null);
    if (d) centerOn(d.x, d.y, 1);
    showGroup(gi);
    document.getElementById("graph-section").scrollIntoView();
    window.scrollTo(0, window.scrollY);
  }
  window.GAF.revealGroup = revealGroup;

  // ------------------------------------------------------------------ tables
  function sortable(table) {
    var ths = table.tHead.rows[0].cells;
    Array.prototype.forEach.call(ths, function (th, col) {
      th.addEventListener("click", function () {
        var asc = th.getAttribute("aria-sort") !== "ascending";
        Array.prototype.forEach.call(ths, function (o) { o.removeAttribute("aria-sort"); });
        th.setAttribute("aria-sort", asc ? "ascending" : "descending");
        var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
        var num = th.getAttribute("data-type") === "num";
        rows.sort(function (a, b) {
          var x = a.cells[col], y = b.cells[col];
          var u = x.hasAttribute("data-v") ? x.getAttribute("data-v") : x.textContent;
          var w = y.hasAttribute("data-v") ? y.getAttribute("data-v") : y.textContent;
          var r = num ? (parseFloat(u) || 0) - (parseFloat(w) || 0) : u.localeCompare(w);
          return asc ? r : -r;
        });
        rows.forEach(function (r) { body.appendChild(r); });
      });
    });
  }
  document.querySelectorAll("table.sortable").forEach(sortable);

  function filterTable(table, inputs, counter) {
    function apply() {
      var text = (inputs.text && inputs.text.value || "").toLowerCase(), shown = 0;
      var rows = table.tBodies[0].rows;
      Array.prototype.forEach.call(rows, function (r) {
        var ok = !text || r.textContent.toLowerCase().indexOf(text) >= 0;
        Object.keys(inputs).forEach(function (k) {
          if (k !== "text" && inputs[k].value && r.getAttribute("data-" + k) !== inputs[k].value) ok = false;
        });
        r.style.display = ok ? "" : "none";
        if (ok) shown++;
      });
      if (counter) counter.textContent = "showing " + shown + " of " + rows.length;
    }
    Object.keys(inputs).forEach(function (k) { inputs[k].addEventListener("input", apply); });
    apply();
  }
  var ct = document.getElementById("cand-table");
  if (ct) {
    filterTable(ct, {
      text: document.getElementById("cand-filter"),
      verdict: document.getElementById("cand-verdict"),
      outcome: document.getElementById("cand-outcome"),
    }, document.getElementById("cand-count"));
  }
  var vt = document.getElementById("value-table");
  if (vt) filterTable(vt, { text: document.getElementById("value-filter") }, document.getElementById("value-count"));

  document.querySelectorAll("[data-group]:not(#graph *)").forEach(function (e) {
    e.addEventListener("click", function () { revealGroup(+e.getAttribute("data-group")); });
  });

  // ------------------------------------------------------------------ toolbar and start
  document.querySelectorAll("[data-show]").forEach(function (b) {
    b.addEventListener("click", function () { show(b.getAttribute("data-show")); });
  });
  var actions = { fit: function () { fit(true); }, expand: function () { setAll(false); }, collapse: function () { setAll(true); },
    zoomin: function () { zoomBy(1.25); }, zoomout: function () { zoomBy(0.8); } };
  document.querySelectorAll("[data-act]").forEach(function (b) {
    b.addEventListener("click", function () { actions[b.getAttribute("data-act")](); });
  });
  var find = document.getElementById("graph-find");
  if (find) find.addEventListener("change", function () {
    var q = find.value.toLowerCase(), view = DATA.graphs[state.which];
    for (var i = 0; i < view.nodes.length; i++) {
      if (view.nodes[i][0].toLowerCase().indexOf(q) < 0) continue;
      var b = view.nodes[i][2], c = state.collapsed[state.which];
      if (b >= 0 && c[b]) { c[b] = false; draw(); }
      var d = state.layout.node("n" + i);
      if (d) { centerOn(d.x, d.y, 1.2); showNode(i); }
      var e = svg.querySelector('[data-node="' + i + '"]');
      if (e) { clearSel(); e.classList.add("sel"); }
      return;
    }
  });
  if (DATA.graphs.before || DATA.graphs.after) show(DATA.graphs.before ? "before" : "after");
  document.body.setAttribute("data-ready", "1");
})();
