"""Regenerate docs/images/report-bert.png: the HTML report of BERT (the zoo's ``bert``,
BERT-base, dynamo export), fused in safe mode with its speed check, opened in headless
Chromium with its first fused group shown on the graph and its details open.

    .venv/bin/python tools/report_screenshot.py [--out docs/images/report-bert.png]
        [--html /tmp/report-bert.html] [--model bert] [--no-speed-check]

Takes a few minutes on two cores (export when not cached, fuse, precision, measurements).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "images" / "report-bert.png"))
    ap.add_argument("--html", default="/tmp/report-bert.html")
    ap.add_argument("--model", default="bert")
    ap.add_argument("--no-speed-check", action="store_true")
    ap.add_argument("--width", type=int, default=1400)
    ap.add_argument("--height", type=int, default=900)
    args = ap.parse_args(argv)

    from graph_autofusion.api import GraphAutoFusion
    from graph_autofusion.testing.browser import Chromium, find_chromium
    from graph_autofusion.testing.models import export_onnx

    exe, why = find_chromium()
    if exe is None:
        print(f"no headless Chromium: {why}", file=sys.stderr)
        return 1
    path = export_onnx(args.model, "dynamo")
    gaf = GraphAutoFusion(str(path), preset="transformer")
    gaf.fuse(check_speed=not args.no_speed_check)
    page_path = gaf.write_html_report(args.html)
    print(f"report: {page_path}")
    with Chromium(exe, width=args.width, height=args.height) as page:
        page.open(page_path.resolve().as_uri())
        page.click("#cand-table tr.o-fused")  # shows its group on the graph, details open
        page.wait_for("document.getElementById('details').dataset.kind === 'group'")
        page.evaluate(
            "document.getElementById('graph-section').scrollIntoView();"
            " window.scrollTo(0, window.scrollY - 40)"
        )
        if page.errors:
            print("page errors: " + "; ".join(page.errors), file=sys.stderr)
            return 1
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(out)
    print(f"screenshot: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
