"""Headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``:
NUL-terminated JSON on file descriptors 3 and 4, no websocket library needed), so a test
can load a page, change the fixture while the page is open, wait for the page's script to
show the change, read the DOM and take screenshots at a chosen width."""

from __future__ import annotations

import base64
import json
import os
import select
import subprocess
import time
from pathlib import Path
from typing import Any

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--no-first-run", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--remote-debugging-pipe")


class Browser:
    def __init__(self, chromium: str, profile: Path) -> None:
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()

        def fds() -> None:  # the child's fd 3 reads commands, fd 4 writes replies
            read, write = os.dup(to_chrome_r), os.dup(from_chrome_w)  # neither is 3 or 4 now
            os.dup2(read, 3)
            os.dup2(write, 4)

        self.proc = subprocess.Popen(
            [chromium, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=fds,
            pass_fds=(3, 4))
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buffer = b""
        self._id = 0
        self.session = ""
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target,
                                 flatten=True)["sessionId"]

    def call(self, method: str, timeout: float = 30.0, **params: Any) -> dict[str, Any]:
        self._id += 1
        message: dict[str, Any] = {"id": self._id, "method": method, "params": params}
        if self.session and not method.startswith(("Target.", "Browser.")):
            message["sessionId"] = self.session
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" in self._buffer:
                line, self._buffer = self._buffer.split(b"\0", 1)
                reply = json.loads(line)
                if reply.get("id") == self._id:
                    if "error" in reply:
                        raise RuntimeError(f"{method}: {reply['error']}")
                    return dict(reply.get("result", {}))
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_chrome], [], [], left)[0]:
                raise TimeoutError(method)
            chunk = os.read(self._from_chrome, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium exited")
            self._buffer += chunk

    def size(self, width: int, height: int) -> None:
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                  deviceScaleFactor=1, mobile=False)

    def go(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def js(self, expression: str) -> Any:
        reply = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return reply["result"].get("value")

    def wait(self, expression: str, timeout: float = 20.0) -> Any:
        """The value of ``expression`` once it is truthy; AssertionError after ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.js(expression)
            if value:
                return value
            time.sleep(0.1)
        raise AssertionError(f"not true after {timeout}s: {expression}")

    def screenshot(self, path: Path, width: int) -> tuple[int, int]:
        """The whole page at ``width`` CSS pixels as a PNG; (page width, page height):
        a page width above ``width`` means the layout runs off the screen."""
        self.size(width, 800)
        time.sleep(0.3)
        scroll = self.js("[document.documentElement.scrollWidth, "
                         "document.documentElement.scrollHeight]")
        self.size(width, int(scroll[1]))
        time.sleep(0.3)
        shot = self.call("Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(shot["data"]))
        return int(scroll[0]), int(scroll[1])

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=5)
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_chrome)
        os.close(self._from_chrome)
