"""A real headless Chromium driven over the Chrome DevTools protocol (no browser download, no framework)."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import websocket

FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
)


def chromium_binary() -> str | None:
    """Debian's chromium, if installed."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Chrome:
    """One browser with one page; collects console errors and uncaught exceptions."""

    def __init__(self, binary: str, *, width: int = 1400, height: int = 1000) -> None:
        self.profile = Path(tempfile.mkdtemp(prefix="zoo-chrome-"))
        self.proc = subprocess.Popen(
            [binary, *FLAGS, f"--user-data-dir={self.profile}", "--remote-debugging-port=0",
             f"--window-size={width},{height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        port = self._port()
        targets = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10).read())
        page = next(t for t in targets if t["type"] == "page")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=30, suppress_origin=True)
        self._id = 0
        self.errors: list[str] = []
        self.events: list[dict[str, Any]] = []
        for method in ("Page.enable", "Runtime.enable", "Log.enable"):
            self.send(method)

    def _port(self) -> int:
        active = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if active.exists() and active.read_text().strip():
                return int(active.read_text().split()[0])
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {self.proc.returncode}")
            time.sleep(0.05)
        raise TimeoutError("chromium did not open its DevTools port")

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        """Call a DevTools method and wait for its reply, collecting events on the way."""
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            msg = self._receive()
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def _receive(self) -> dict[str, Any]:
        msg = json.loads(self.ws.recv())
        method = msg.get("method")
        if method:
            self.events.append(msg)
        params = msg.get("params", {})
        if method == "Runtime.exceptionThrown":
            self.errors.append(json.dumps(params["exceptionDetails"])[:500])
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            self.errors.append(" ".join(str(a.get("value", a.get("description"))) for a in params["args"]))
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            self.errors.append(f"{params['entry'].get('url', '')}: {params['entry']['text']}")
        return msg

    def open(self, url: str, *, timeout_s: float = 30) -> None:
        """Navigate and wait for the load event."""
        self.events.clear()
        self.send("Page.navigate", url=url)
        deadline = time.monotonic() + timeout_s
        while not any(e["method"] == "Page.loadEventFired" for e in self.events):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not load")
            self._receive()

    def eval(self, expression: str) -> Any:
        """Evaluate JS in the page and return its JSON value."""
        res = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in res:
            raise RuntimeError(f"{expression}: {res['exceptionDetails']}")
        return res["result"].get("value")

    def wait_for(self, expression: str, *, timeout_s: float = 10) -> Any:
        """Poll a JS expression until it is truthy."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = self.eval(expression)
            if value:
                return value
            time.sleep(0.05)
        raise TimeoutError(f"never true: {expression}")

    def download_to(self, folder: Path) -> None:
        """Let the page save downloads (a link with ``download``) into ``folder``."""
        self.send("Browser.setDownloadBehavior", behavior="allow", downloadPath=str(folder))

    def set_width(self, width: int, height: int = 1000) -> None:
        """Lay the page out at this viewport size (until ``reset_size``)."""
        self.send("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)

    def reset_size(self) -> None:
        self.send("Emulation.clearDeviceMetricsOverride")

    def screenshot(self, path: Path) -> None:
        """Save a full-page PNG."""
        size = self.eval("[document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
        self.send("Emulation.setDeviceMetricsOverride", width=size[0], height=size[1], deviceScaleFactor=1,
                  mobile=False)
        data = self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        """Stop the browser and remove its profile."""
        try:
            self.ws.close()
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            shutil.rmtree(self.profile, ignore_errors=True)
