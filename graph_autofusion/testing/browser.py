"""Headless Chromium driven over the DevTools protocol, for the HTML report's browser test.

    exe = find_chromium()                        # tools/chromium.sh: installs Debian's package
    with Chromium(exe) as page:
        page.open("file:///tmp/report.html")
        page.evaluate("document.querySelectorAll('#graph .gnode').length")
        page.click("#graph .grp")                # a real mouse click at the element's centre
        page.screenshot("shot.png")
        page.errors, page.requests               # script errors, every URL the page asked for

The protocol runs over ``--remote-debugging-pipe`` (the browser reads commands on its file
descriptor 3 and writes replies on 4, each a JSON message ending with a NUL byte): no network
port, no client package.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from graph_autofusion import env
from graph_autofusion.errors import GraphAutoFusionError

__all__ = ["BrowserError", "Chromium", "find_chromium"]


class BrowserError(GraphAutoFusionError):
    """Chromium is missing, failed to start, or a protocol command failed."""


def find_chromium() -> tuple[str | None, str]:
    """``(path, "")`` of a Chromium, installed by ``tools/chromium.sh`` when missing (as root,
    with apt-get), or ``(None, why)``."""
    named = env.chromium()
    if named and shutil.which(named):
        return shutil.which(named), ""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name), ""
    script = Path(__file__).resolve().parents[2] / "tools" / "chromium.sh"
    if not script.is_file():
        return None, "no chromium on PATH and no tools/chromium.sh to install it"
    proc = subprocess.run(["sh", str(script)], capture_output=True, text=True, timeout=900)
    path = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    if proc.returncode == 0 and path and os.access(path, os.X_OK):
        return path, ""
    return None, proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "unknown"


class Chromium:
    """One headless Chromium with one page (see the module docstring)."""

    def __init__(self, exe: str, *, width: int = 1400, height: int = 1000) -> None:
        self.exe, self.width, self.height = exe, width, height
        self.errors: list[str] = []
        self.requests: list[str] = []
        self._events: queue.Queue[dict[str, Any]] = queue.Queue()
        self._replies: dict[int, dict[str, Any]] = {}
        self._cv = threading.Condition()
        self._next = 0
        self.session: str | None = None

    # ------------------------------------------------------------------ process
    def __enter__(self) -> Chromium:
        self._profile = tempfile.mkdtemp(prefix="gaf-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def child_fds() -> None:  # the browser's fd 3 reads commands, fd 4 writes replies
            a = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD, 10)
            b = fcntl.fcntl(from_browser_w, fcntl.F_DUPFD, 10)
            os.dup2(a, 3)
            os.dup2(b, 4)

        args = [
            self.exe,
            "--headless",
            "--remote-debugging-pipe",
            "--disable-gpu",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--mute-audio",
            f"--user-data-dir={self._profile}",
            f"--window-size={self.width},{self.height}",
        ]
        if os.geteuid() == 0:
            args.append("--no-sandbox")  # Chromium refuses to run as root with its sandbox
        self.proc = subprocess.Popen(
            [*args, "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            pass_fds=(3, 4),
            preexec_fn=child_fds,
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        target = self.send("Target.createTarget", {"url": "about:blank"}, session=False)
        attached = self.send(
            "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True},
            session=False,
        )  # fmt: skip
        self.session = attached["sessionId"]
        for domain in ("Page", "Runtime", "Network", "Log"):
            self.send(f"{domain}.enable")
        self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": self.width, "height": self.height, "deviceScaleFactor": 1, "mobile": False},
        )
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.send("Browser.close", session=False, timeout=10)
        except BrowserError:
            pass
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_browser)
        shutil.rmtree(self._profile, ignore_errors=True)

    def _read(self) -> None:
        buf = b""
        while True:
            try:
                chunk = os.read(self._from_browser, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                with self._cv:
                    self._replies[-1] = {"closed": True}
                    self._cv.notify_all()
                os.close(self._from_browser)
                return
            buf += chunk
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                msg = json.loads(raw)
                if "id" in msg:
                    with self._cv:
                        self._replies[msg["id"]] = msg
                        self._cv.notify_all()
                else:
                    self._event(msg)

    def _event(self, msg: dict[str, Any]) -> None:
        method, params = msg.get("method", ""), msg.get("params", {})
        if method == "Runtime.exceptionThrown":
            d = params.get("exceptionDetails", {})
            text = d.get("exception", {}).get("description") or d.get("text", "")
            self.errors.append(f"exception: {text}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            args = [str(a.get("value", a.get("description", ""))) for a in params.get("args", [])]
            self.errors.append("console.error: " + " ".join(args))
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            self.errors.append("log: " + params["entry"].get("text", ""))
        elif method == "Network.requestWillBeSent":
            self.requests.append(params.get("request", {}).get("url", ""))
        self._events.put(msg)

    # ------------------------------------------------------------------ protocol
    def send(
        self, method: str, params: dict[str, Any] | None = None, *, session: bool = True,
        timeout: float = 60.0,
    ) -> dict[str, Any]:  # fmt: skip
        """Run one protocol command; returns its result (raises :class:`BrowserError`)."""
        with self._cv:
            self._next += 1
            mid = self._next
        msg: dict[str, Any] = {"id": mid, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        try:
            os.write(self._to_browser, json.dumps(msg).encode() + b"\0")
        except OSError as exc:
            raise BrowserError(f"chromium is gone ({exc}): {self._stderr()}") from exc
        deadline = time.monotonic() + timeout
        with self._cv:
            while mid not in self._replies:
                left = deadline - time.monotonic()
                if left <= 0 or -1 in self._replies:
                    raise BrowserError(f"no reply to {method}: {self._stderr()}")
                self._cv.wait(left)
            reply = self._replies.pop(mid)
        if "error" in reply:
            raise BrowserError(f"{method}: {reply['error'].get('message')}")
        return reply.get("result", {})

    def _stderr(self) -> str:
        if self.proc.poll() is None:
            return "still running"
        return (self.proc.stderr.read() or b"").decode(errors="replace")[-500:]

    def wait_event(self, method: str, timeout: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError(f"no {method} within {timeout:.0f} s")
            try:
                msg = self._events.get(timeout=left)
            except queue.Empty:
                continue
            if msg.get("method") == method:
                return msg.get("params", {})

    # ------------------------------------------------------------------ page
    def open(self, url: str, *, ready: str = "document.body.dataset.ready === '1'") -> None:
        """Load ``url`` and wait until ``ready`` (a JS expression) is true."""
        self.send("Page.navigate", {"url": url})
        self.wait_event("Page.loadEventFired")
        self.wait_for(ready)

    def evaluate(self, expression: str) -> Any:
        """The value of a JS expression in the page (a thrown error raises BrowserError)."""
        res = self.send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
        )
        if "exceptionDetails" in res:
            d = res["exceptionDetails"]
            raise BrowserError(f"{expression!r}: {d.get('exception', {}).get('description', d)}")
        return res.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout: float = 60.0) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise BrowserError(f"{expression!r} still false after {timeout:.0f} s")
            time.sleep(0.1)

    def click(self, selector: str) -> tuple[float, float]:
        """Scroll the first element matching ``selector`` into view and click its centre with
        real mouse events (moved, pressed, released); returns the point clicked."""
        sel = json.dumps(selector)
        point = self.evaluate(
            f"(() => {{ const el = document.querySelector({sel}); if (!el) return null;"
            " el.scrollIntoView({block: 'center', inline: 'center'});"
            " const r = el.getBoundingClientRect();"
            " return [r.left + r.width / 2, r.top + r.height / 2]; })()"
        )
        if not point:
            raise BrowserError(f"nothing matches {selector!r}")
        x, y = float(point[0]), float(point[1])
        self.send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y})
        for kind in ("mousePressed", "mouseReleased"):
            self.send(
                "Input.dispatchMouseEvent",
                {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1},
            )
        return x, y

    def screenshot(self, path: str | os.PathLike[str], *, full_page: bool = False) -> Path:
        """Save a PNG of the viewport (or the whole page)."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            params["captureBeyondViewport"] = True
        data = self.send("Page.captureScreenshot", params)["data"]
        dest = Path(path)
        dest.write_bytes(base64.b64decode(data))
        return dest
