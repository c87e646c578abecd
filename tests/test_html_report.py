"""The self-contained HTML report (F14): page content, escaping, offline, and a real browser.

The browser test fuses MiniLM (a small BERT, real weights) through the Python API, writes the
report, opens it in headless Chromium over the DevTools protocol (Debian's package, installed
by tools/chromium.sh when missing; skipped only where it cannot be), and checks that the graph
is drawn, that a real mouse click on a fused group opens its details, and that the page asked
for nothing but its own file.
"""

from __future__ import annotations

import html
import json
import os
import re

import pytest

from graph_autofusion.ir.text import parse_model
from graph_autofusion.patterns.library import builtin_rules
from graph_autofusion.planner.analysis import analyze_model
from graph_autofusion.report.graph_view import FANOUT_LIMIT, block_of, graph_view, node_scope
from graph_autofusion.report.html_report import render_html_report, script_json
from graph_autofusion.report.report_data import report_data

HOSTILE = "</script><img src=x onerror=alert(1)>&amp;"

MATMUL_BIAS = """
graph g(%x: f32[256,1024], %s: f32[256,1024]) -> (%y, %z) {
  init %w: f32[1024,1024] = zeros
  init %b: f32[1024] = zeros
  %t: f32[256,1024] = MatMul(%x, %w) @mm
  %y: f32[256,1024] = Add(%t, %b) @bias
  %r: f32[256,1024] = Relu(%s) @relu
  %z: f32[256,1024] = Mul(%r, %s) @mul
}
"""


def _analysis(name: str = "m"):
    m = parse_model(MATMUL_BIAS)
    m.graph.nodes[2].name = HOSTILE  # the Relu: in a cluster's node list and in the graph
    return analyze_model(m, builtin_rules().preset("transformer"), "ascend910b", model_name=name)


def _embedded(page: str) -> dict:
    block = re.search(r'<script type="application/json" id="gaf-data">(.*?)</script>', page, re.S)
    assert block is not None
    return json.loads(block.group(1))


def test_hostile_names_are_escaped_in_the_tables_and_the_json_block():
    rep = _analysis(name=HOSTILE)
    page = rep.to_html()
    assert HOSTILE not in page and "<img" not in page
    assert html.escape(HOSTILE) in page  # the title and the candidate table, escaped
    # three closing tags only: the JSON block, dagre's and the page's own script
    assert page.count("</script>") == 3 and page.count("<script") == 3
    data = _embedded(page)  # the JSON block still carries the names exactly
    assert data["model"] == HOSTILE
    assert HOSTILE in [n[0] for n in data["graphs"]["before"]["nodes"]]
    assert "\\u003c/script\\u003e" in script_json({"k": "</script>"})


def test_candidate_table_has_one_row_per_candidate_and_the_plan_outlined():
    rep = _analysis()
    page = rep.to_html()
    body = page.split('id="cand-table"', 1)[1].split("</tbody>", 1)[0]
    rows = re.findall(r"<tr[ >]", body.split("<tbody>", 1)[1])
    assert len(rows) == len(rep.candidates) == 3
    for c in rep.candidates:
        assert html.escape(c.key) in body
    data = _embedded(page)
    assert data["kind"] == "analysis" and len(data["candidates"]) == 3
    planned = [g for g in data["groups"] if g["status"] == "planned"]
    assert len(planned) == len(rep.chosen) == 2
    drawn = {n[0]: n[3] for n in data["graphs"]["before"]["nodes"]}
    for i, g in enumerate(data["groups"]):  # each group's nodes are marked with it
        assert all(drawn[name] == i for name in g["nodes"])
    assert data["hardware"]["name"] == "ascend910b" and "memory_bandwidth_gbs" in data["hardware"]


def test_page_is_self_contained_offline():
    page = _analysis().to_html()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.I)
    assert "<link" not in page and "@import" not in page and "url(http" not in page
    assert "sourceMappingURL" not in page
    assert "<script src" not in page and "dagre" in page and "MIT" in page


def test_blocks_come_from_module_paths_and_hubs_are_not_drawn_across_blocks():
    lines = ["graph g(%x: f32[4,8]) -> (%y) {", "  %h0: f32[4,8] = Relu(%x) @/embeddings/Relu"]
    for i in range(FANOUT_LIMIT + 2):  # %h0 read by every layer: a hub
        prev = f"%h{i}"
        lines.append(f"  %a{i}: f32[4,8] = Add({prev}, %h0) @/encoder/layer.{i}/Add")
        lines.append(f"  %h{i + 1}: f32[4,8] = Tanh(%a{i}) @/encoder/layer.{i}/act/Tanh")
    lines += [f"  %y: f32[4,8] = Relu(%h{FANOUT_LIMIT + 2}) @/Relu_out", "}"]
    m = parse_model("\n".join(lines))
    nodes = m.graph.nodes
    assert node_scope(nodes[2]) == ["encoder", "layer", "0", "act"]
    assert block_of(nodes[1]) == "encoder.layer.0" and block_of(nodes[0]) is None
    nodes[0].meta["onnx_metadata_props"] = [
        ("pkg.torch.onnx.name_scopes", "['', 'model', 'model.h.3', 'model.h.3.mlp', 'relu']")
    ]
    assert block_of(nodes[0]) == "model.h.3"  # the exporter's scopes come first
    view = graph_view(m.graph, {nodes[1].name: 0})
    assert len(view["blocks"]) == FANOUT_LIMIT + 3
    assert view["nodes"][1][3] == 0 and view["nodes"][2][3] == -1
    hidden = {tuple(e) for e in view["hidden_edges"]}
    assert len(hidden) == FANOUT_LIMIT + 2 and all(src == 0 for src, _ in hidden)
    assert not hidden & {tuple(e) for e in view["edges"]}
    kinds = [n[4] for n in view["nodes"]]
    assert kinds.count(1) == 1 and kinds.count(2) == 1  # %x in, %y out


def test_fuse_and_analyze_cli_write_the_report(tmp_path, capsys):
    import onnx

    from graph_autofusion.cli import main
    from graph_autofusion.frontend.onnx_export import to_onnx

    model = tmp_path / "mm.onnx"
    onnx.save(to_onnx(parse_model(MATMUL_BIAS)), str(model))
    page_a, page_f = tmp_path / "a" / "analysis.html", tmp_path / "fuse.html"
    page_a.parent.mkdir()
    assert main(["-q", "analyze", str(model), "--hardware", "ascend910b", "--brief",
                 "--html", str(page_a)]) == 0  # fmt: skip
    assert main(["-q", "fuse", str(model), "-o", str(tmp_path / "f.onnx"), "--no-speed-check",
                 "--hardware", "ascend910b", "--html", str(page_f)]) == 0  # fmt: skip
    assert sorted(os.listdir(page_a.parent)) == ["analysis.html"]  # written atomically
    a, f = _embedded(page_a.read_text("utf-8")), _embedded(page_f.read_text("utf-8"))
    assert a["kind"] == "analysis" and f["kind"] == "fuse"
    assert f["graphs"]["after"] is not None and f["summary"]["safe_mode"] is True
    assert f["precision"] is not None and f["precision"]["outputs"]
    assert "HTML report written" in capsys.readouterr().err


def test_report_data_of_a_fuse_result_marks_applied_groups_in_both_graphs():
    from graph_autofusion.api import GraphAutoFusion

    gaf = GraphAutoFusion(parse_model(MATMUL_BIAS), hardware="ascend910b")
    gaf.fuse(check_speed=False)
    data = report_data(result=gaf.result, model_name="mm")
    applied = [g for g in data["groups"] if g["status"] == "applied"]
    assert len(applied) == len(gaf.result.lowered) >= 1
    page = render_html_report(data)
    for g in applied:
        i = data["groups"].index(g)
        assert g["safety"]["passed"] and g["safety"]["cosine"] > 0.999
        after = {n[0]: n[3] for n in data["graphs"]["after"]["nodes"]}
        assert g["new_nodes"] and all(after[n] == i for n in g["new_nodes"])
        assert f'data-group="{i}"' in page  # its table row and chart bar open it
    assert len(data["timing"]) == len(applied)


# ----------------------------------------------------------------------------- real browser
@pytest.fixture(scope="module")
def chromium():
    from graph_autofusion.testing.browser import find_chromium

    exe, why = find_chromium()
    if exe is None:
        pytest.skip(f"headless Chromium unavailable ({why}); install Debian's chromium package")
    return exe


#: The first applied group's element with a point of it in the viewport that the group itself
#: (not an operator drawn over it) receives, found after scrolling it into view: where the
#: layout leaves no such point (the graph's own pan and zoom may keep it out of the viewport),
#: ``[null, null, group]``.
_GROUP_POINT = """(() => {
  const groups = [...document.querySelectorAll('#graph .grp.st-applied')];
  for (const g of groups) {
    g.scrollIntoView({block: 'center', inline: 'center'});
    const r = g.getBoundingClientRect();
    const x0 = Math.max(0, r.left), x1 = Math.min(innerWidth, r.right);
    const y0 = Math.max(0, r.top), y1 = Math.min(innerHeight, r.bottom);
    if (x1 <= x0 || y1 <= y0) continue;
    for (let i = 1; i < 8; i++) for (let j = 1; j < 8; j++) {
      const x = x0 + (x1 - x0) * i / 8, y = y0 + (y1 - y0) * j / 8;
      const hit = document.elementFromPoint(x, y);
      if (hit && hit.closest('.grp, .gnode') === g) return [x, y, g.dataset.group];
    }
  }
  return groups.length ? [null, null, groups[0].dataset.group] : null;
})()"""


def _click_a_fused_group(page) -> str:
    """Click an applied fused group: real mouse events (moved, pressed, released) on a point
    the group receives, checked with ``elementFromPoint`` first; where the layout leaves none
    in the viewport, a click event dispatched on the group's element. Returns its index."""
    found = page.evaluate(_GROUP_POINT)
    assert found, "no applied group drawn"
    x, y, group = found
    if x is None:
        page.evaluate(
            f"document.querySelector('#graph .grp[data-group=\"{group}\"]')"
            ".dispatchEvent(new MouseEvent('click', {bubbles: true}))"
        )
        return group
    page.send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y})
    for kind in ("mousePressed", "mouseReleased"):
        page.send(
            "Input.dispatchMouseEvent",
            {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1},
        )
    return group


@pytest.mark.xdist_group("browser")
def test_bert_report_in_headless_chromium(chromium, tmp_path):
    from graph_autofusion.api import GraphAutoFusion
    from graph_autofusion.testing.browser import Chromium
    from graph_autofusion.testing.models import export_onnx

    gaf = GraphAutoFusion(str(export_onnx("minilm", "dynamo")), preset="transformer")
    gaf.fuse(check_speed=False)
    path = gaf.write_html_report(tmp_path / "report.html")
    applied = [i for i, g in enumerate(_embedded(path.read_text("utf-8"))["groups"])
               if g["status"] == "applied"]  # fmt: skip
    assert applied, "MiniLM fuses its BiasGelu groups"
    with Chromium(chromium, width=1400, height=1000) as page:
        page.open(path.resolve().as_uri())
        assert page.evaluate("document.getElementById('graph').dataset.rendered") == "before"
        drawn = page.evaluate("document.querySelectorAll('#graph .gnode').length")
        blocks = page.evaluate("document.querySelectorAll('#graph .gnode.block').length")
        assert drawn > 20 and blocks == 6  # 285 operators: the six layers start collapsed
        page.click("#graph .gnode.block.has-fused")  # expand a layer holding a fused group
        page.wait_for("document.querySelectorAll('#graph .grp.st-applied').length > 0")
        hit = _click_a_fused_group(page)
        panel = page.wait_for(
            "document.getElementById('details').dataset.kind === 'group' &&"
            " [document.getElementById('details').dataset.group,"
            "  document.querySelector('#details h3').textContent,"
            "  document.getElementById('details').textContent]"
        )
        gi = int(panel[0])
        assert str(gi) == hit and gi in applied
        group = gaf.result.lowered[applied.index(gi)]
        assert panel[1] == group.key
        for needle in ("rule", "BiasGelu", "HBM accesses", "verdict", "cosine", "replaced nodes"):
            assert needle in panel[2], needle
        shot = page.screenshot(tmp_path / "report.png")
        assert page.errors == []
        assert all(u.startswith(("file:", "data:", "about:")) for u in page.requests)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
