"""A real headless Chromium (the distribution's package) driven by Playwright, for page tests.

Playwright is only the driver here: it never downloads a browser. The flags are the ones that
work on a machine with no network (no background connections, no component updates).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path

CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return None


def unavailable() -> str | None:
    """Why no browser test can run here, or None when one can."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install -e '.[test]')"
    if chromium_path() is None:
        return "no Chromium here (Debian: apt-get install chromium)"
    return None


@contextlib.contextmanager
def browser():
    """A launched headless Chromium with a new empty profile."""
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="reproarchive-chromium-") as profile, sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            profile, executable_path=chromium_path(), headless=True, args=CHROMIUM_FLAGS,
            viewport={"width": 1400, "height": 1000})
        try:
            yield context
        finally:
            context.close()


class PageLog:
    """Console errors, uncaught exceptions and network requests of one page."""

    def __init__(self, page):
        self.errors: list[str] = []
        self.requests: list[str] = []
        page.on("console", lambda m: self.errors.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))
        page.on("request", lambda r: self.requests.append(r.url))


def open_page(context, path: Path, *, timeout_ms: float = 30000):
    """Open a local HTML file and wait until the page says it has drawn (``body[data-ready]``)."""
    page = context.new_page()
    log = PageLog(page)
    page.goto(Path(path).resolve().as_uri())
    page.wait_for_selector("body[data-ready]", timeout=timeout_ms)
    return page, log
