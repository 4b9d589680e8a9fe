"""Headless Chromium driven over the DevTools protocol: log in, open pages, read and shoot them.

``Browser`` starts one Chromium (its own profile, so its own cookies) and drives one tab
through the DevTools websocket: navigate, wait for a condition in the page, type into a form
as a user does (real input events, so React forms see them), click, evaluate JavaScript,
emulate dark mode and save screenshots. Only ``websockets`` (pinned) is needed.
"""

from __future__ import annotations

import base64
import itertools
import json
import shutil
import subprocess
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from websockets.sync.client import connect


def chromium_path() -> str | None:
    """Return the Chromium executable, or None when it is not installed."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


class BrowserError(RuntimeError):
    """The browser did not reach the expected state; the message says what it showed."""


class Browser:
    """One headless Chromium with one tab, stopped by ``close`` (or ``with``)."""

    def __init__(self, executable: str, profile: Path, width: int = 1280,
                 height: int = 900) -> None:
        profile.mkdir(parents=True, exist_ok=True)
        (profile / "DevToolsActivePort").unlink(missing_ok=True)
        self._proc = subprocess.Popen(
            [executable, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--remote-debugging-port=0",
             f"--user-data-dir={profile}", f"--window-size={width},{height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise BrowserError("Chromium did not open its DevTools port")
            time.sleep(0.1)
        port = port_file.read_text().split()[0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            page = next(t for t in json.loads(r.read()) if t["type"] == "page")
        self._stack = ExitStack()
        self._ws = self._stack.enter_context(connect(page["webSocketDebuggerUrl"],
                                                     max_size=None))
        self._ids = itertools.count(1)
        self.send("Page.enable")
        self.send("Emulation.setDeviceMetricsOverride", width=width, height=height,
                  deviceScaleFactor=1, mobile=False)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the browser (only the process this object started)."""
        stack = getattr(self, "_stack", None)
        if stack is not None:
            stack.close()
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=10)

    # --- protocol -------------------------------------------------------------------------
    def send(self, method: str, **params: Any) -> dict[str, Any]:
        """Call one DevTools method and return its result (events in between are skipped)."""
        call_id = next(self._ids)
        self._ws.send(json.dumps({"id": call_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self._ws.recv(timeout=60))
            if msg.get("id") == call_id:
                if "error" in msg:
                    raise BrowserError(f"{method}: {msg['error']}")
                return dict(msg.get("result", {}))

    def evaluate(self, expression: str) -> Any:
        """Return the value of a JavaScript expression in the page (promises awaited)."""
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True,
                           awaitPromise=True)
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    # --- user actions ---------------------------------------------------------------------
    def goto(self, url: str, until: str = "true", timeout: float = 30) -> None:
        """Open ``url`` and wait until the page is loaded and ``until`` (JS) is true."""
        self.send("Page.navigate", url=url)
        self.wait_for(until, timeout)

    def wait_for(self, condition: str, timeout: float = 30) -> None:
        """Wait until the document is loaded and the JS ``condition`` holds."""
        deadline = time.monotonic() + timeout
        expr = f"document.readyState === 'complete' && !!({condition})"
        while True:
            try:
                if self.evaluate(expr):
                    return
            except BrowserError:
                pass  # the page is being replaced by a navigation: ask again
            if time.monotonic() > deadline:
                raise BrowserError(f"waited {timeout:.0f} s for {condition} at {self.url()}; "
                                   f"page text: {self.text()[:500]!r}")
            time.sleep(0.2)

    def type_into(self, selector: str, text: str) -> None:
        """Focus the element matching ``selector`` and type ``text`` into it."""
        if not self.evaluate(f"(e => e ? (e.focus(), true) : false)"
                             f"(document.querySelector({json.dumps(selector)}))"):
            raise BrowserError(f"no element {selector} at {self.url()}")
        self.send("Input.insertText", text=text)

    def click(self, selector: str) -> None:
        """Click the element matching ``selector``."""
        if not self.evaluate(f"(e => e ? (e.click(), true) : false)"
                             f"(document.querySelector({json.dumps(selector)}))"):
            raise BrowserError(f"no element {selector} at {self.url()}")

    def press(self, selector: str) -> None:
        """Click the element matching ``selector`` with real mouse events at its centre.

        For widgets that listen to pointer events rather than ``click`` (Ark UI accordions,
        as in Airflow's trigger form).
        """
        box = self.evaluate(
            f"(e => {{ if (!e) return null; e.scrollIntoView({{block: 'center'}}); "
            f"const r = e.getBoundingClientRect(); return [r.x + r.width / 2, "
            f"r.y + r.height / 2]; }})(document.querySelector({json.dumps(selector)}))")
        if not box:
            raise BrowserError(f"no element {selector} at {self.url()}")
        x, y = box
        self.send("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)
        for kind in ("mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left",
                      clickCount=1)

    def dark_mode(self, on: bool = True) -> None:
        """Emulate the system's dark (or light) colour scheme preference."""
        self.send("Emulation.setEmulatedMedia", features=[
            {"name": "prefers-color-scheme", "value": "dark" if on else "light"}])

    # --- reading --------------------------------------------------------------------------
    def url(self) -> str:
        return str(self.evaluate("location.href"))

    def text(self) -> str:
        return str(self.evaluate("document.body ? document.body.innerText : ''"))

    def html(self) -> str:
        return str(self.evaluate("document.documentElement.outerHTML"))

    def cookies(self) -> dict[str, str]:
        """Return the browser's cookies by name (HttpOnly ones included)."""
        return {c["name"]: c["value"] for c in self.send("Network.getAllCookies")["cookies"]}

    def screenshot(self, path: Path, full_page: bool = True) -> Path:
        """Save a PNG of the tab (the whole page by default) to ``path``."""
        path.parent.mkdir(parents=True, exist_ok=True)
        data = self.send("Page.captureScreenshot", format="png",
                         captureBeyondViewport=full_page)["data"]
        path.write_bytes(base64.b64decode(data))
        return path
