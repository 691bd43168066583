"""Open a page in headless Chromium through the DevTools protocol (choreographer, a kaleido
dependency) and return what a person would see: console messages, uncaught exceptions,
values of JavaScript expressions and a screenshot."""

from __future__ import annotations

import asyncio
import base64
import shutil
from dataclasses import dataclass
from dataclasses import field

import pytest


def chromium_or_skip() -> None:
    """Skip the calling test cleanly when no Chromium (or choreographer) is installed."""
    if not any(shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")):
        pytest.skip("no Chromium on PATH (CI installs Debian's chromium package)")
    pytest.importorskip("choreographer")


@dataclass
class Page:
    """What the browser reported for one page load."""

    console: list[tuple[str, str]] = field(default_factory=list)  # (type, text)
    exceptions: list[str] = field(default_factory=list)
    values: dict[str, object] = field(default_factory=dict)
    screenshot: bytes = b""

    @property
    def errors(self) -> list[str]:
        return [t for kind, t in self.console if kind in ("error", "assert")] + self.exceptions


async def _open(url: str, expressions: dict[str, str], settle_s: float, width: int, height: int) -> Page:
    import choreographer

    page = Page()

    async def on_console(ev):
        p = ev["params"]
        page.console.append((p.get("type", ""), " ".join(str(a.get("value", a.get("description", "")))
                                                          for a in p.get("args", []))))

    async def on_exception(ev):
        d = ev["params"]["exceptionDetails"]
        page.exceptions.append(d.get("exception", {}).get("description") or d.get("text", ""))

    async with choreographer.Browser(headless=True) as browser:
        tab = await browser.create_tab("about:blank")
        tab.subscribe("Runtime.consoleAPICalled", on_console, repeating=True)
        tab.subscribe("Runtime.exceptionThrown", on_exception, repeating=True)
        await tab.send_command("Runtime.enable")
        await tab.send_command("Page.enable")
        await tab.send_command("Emulation.setDeviceMetricsOverride",
                               params={"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
        loaded = tab.subscribe_once("Page.loadEventFired")
        await tab.send_command("Page.navigate", params={"url": url})
        await asyncio.wait_for(loaded, 60)
        await asyncio.sleep(settle_s)
        for name, expr in expressions.items():
            r = await tab.send_command("Runtime.evaluate", params={"expression": expr, "returnByValue": True})
            page.values[name] = r["result"]["result"].get("value")
        shot = await tab.send_command("Page.captureScreenshot", params={"format": "png"})
        page.screenshot = base64.b64decode(shot["result"]["data"])
    return page


def open_page(url: str, expressions: dict[str, str] | None = None, settle_s: float = 2.0,
              width: int = 1280, height: int = 2400) -> Page:
    """Load ``url`` headless, wait ``settle_s``, evaluate ``expressions``, take a screenshot."""
    return asyncio.run(_open(url, expressions or {}, settle_s, width, height))
