#!/usr/bin/env python3
"""Open an HTML file in real headless Chromium: collect JavaScript errors, headings, network use,
and save a screenshot.

How it works: a copy of the page gets a small collector script injected (the original is never
modified). The collector records ``error`` / ``unhandledrejection`` events and ``console.error``
calls from the first moment, then, once the page has loaded, moves a synthetic mouse over every
chart and tooltip target and clicks every legend entry (so event handlers run too), and writes
what it saw as JSON into the DOM. ``chromium --headless --dump-dom`` prints that DOM; this script
reads the JSON back. Chromium also runs with the network mapped to nowhere, so a page that tries
to load anything from outside shows up as an error and in ``resources``.

A second Chromium run takes the screenshot of the *original* page (``--screenshot``).

Usage::

    python3 tools/browser_check.py report.html --screenshot report.png [--window-size 1400,2000]

Exit status: 0 no errors, 1 errors found, 2 Chromium missing or failed. Set ``VRAMKIT_CHROMIUM``
to use a specific browser binary.
"""
from __future__ import annotations

import argparse
import html
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Any

__all__ = ["find_chromium", "check_page", "ChromiumError"]

_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome",
               "headless_shell")
_RESULT_ID = "__vk_browser_check"

_COLLECTOR_HEAD = r"""<script>
(function () {
  var errs = window.__vkErrors = [];
  window.addEventListener("error", function (e) {
    var t = e.target;
    if (t && t !== window && (t.src || t.href)) {
      errs.push("failed to load " + (t.src || t.href));
    } else {
      errs.push("error: " + (e.message || "unknown") + " at " + (e.filename || "?") + ":" +
                (e.lineno || 0) + ":" + (e.colno || 0));
    }
  }, true);
  window.addEventListener("unhandledrejection", function (e) {
    errs.push("unhandled rejection: " + (e.reason && (e.reason.stack || e.reason.message) || String(e.reason)));
  });
  var origError = console.error;
  console.error = function () {
    errs.push("console.error: " + Array.prototype.map.call(arguments, String).join(" "));
    return origError.apply(console, arguments);
  };
})();
</script>"""

_COLLECTOR_TAIL = r"""<script>
window.addEventListener("load", function () {
  var errs = window.__vkErrors || ["collector missing"];
  var exercised = 0;
  function fire(el, type, fx, fy) {
    var r = el.getBoundingClientRect();
    var ev = new MouseEvent(type, {bubbles: true, cancelable: true, view: window,
      clientX: r.left + r.width * fx, clientY: r.top + r.height * fy});
    el.dispatchEvent(ev);
    exercised += 1;
  }
  try {
    var targets = document.querySelectorAll(".overlay, [data-tip], svg, canvas");
    Array.prototype.forEach.call(targets, function (el) {
      [0.02, 0.25, 0.5, 0.75, 0.98].forEach(function (f) { fire(el, "mousemove", f, 0.5); });
      fire(el, "mouseleave", 0.5, 0.5);
    });
    var clickable = document.querySelectorAll(".legend .item, button, [data-key]");
    Array.prototype.forEach.call(clickable, function (el) { el.click(); el.click(); exercised += 2; });
  } catch (e) {
    errs.push("exercise failed: " + (e && (e.stack || e.message) || String(e)));
  }
  var resources = [];
  try {
    resources = performance.getEntriesByType("resource").map(function (r) { return r.name; });
  } catch (e) { /* old browsers */ }
  var headings = Array.prototype.map.call(document.querySelectorAll("h1, h2, h3"), function (h) {
    return {level: h.tagName.toLowerCase(), text: h.textContent.trim()};
  });
  var out = document.createElement("pre");
  out.id = "__ID__";
  out.style.display = "none";
  out.textContent = JSON.stringify({errors: errs, resources: resources, headings: headings,
    title: document.title, exercised: exercised,
    size: [document.documentElement.scrollWidth, document.documentElement.scrollHeight]});
  document.body.appendChild(out);
});
</script>""".replace("__ID__", _RESULT_ID)


class ChromiumError(RuntimeError):
    """Chromium is missing or did not produce a result."""


def find_chromium() -> str | None:
    """Path of a Chromium/Chrome binary, or None (``VRAMKIT_CHROMIUM`` overrides the search)."""
    env = os.environ.get("VRAMKIT_CHROMIUM")
    if env:
        return env if os.path.isfile(env) or shutil.which(env) else None
    for name in _CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


def _instrument(page: str) -> str:
    head = re.search(r"<head[^>]*>", page, flags=re.IGNORECASE)
    if head:
        page = page[:head.end()] + _COLLECTOR_HEAD + page[head.end():]
    else:
        page = _COLLECTOR_HEAD + page
    tail = page.lower().rfind("</body>")
    if tail >= 0:
        return page[:tail] + _COLLECTOR_TAIL + page[tail:]
    return page + _COLLECTOR_TAIL


def _base_flags(profile: str) -> list[str]:
    return ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--no-first-run", "--no-default-browser-check", "--disable-extensions",
            "--disable-background-networking", "--disable-sync", "--mute-audio",
            "--hide-scrollbars", "--force-color-profile=srgb", "--force-device-scale-factor=1",
            # nothing outside the page can be reached: such loads fail and are reported
            "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost",
            "--enable-logging=stderr", "--v=0", f"--user-data-dir={profile}"]


def _console_errors(stderr: str) -> list[str]:
    out = []
    for line in stderr.splitlines():
        if "CONSOLE" in line and ("Uncaught" in line or ":ERROR:" in line or "Error" in line):
            out.append(line.strip())
    return out


def check_page(html_path: str, screenshot: str | None = None, window_size: tuple[int, int] = (1400, 2000),
               timeout: float = 120.0, chromium: str | None = None) -> dict[str, Any]:
    """Load ``html_path`` in headless Chromium and report what happened.

    Returns a dict: ``errors`` (JS errors, failed loads, console.error calls, and error lines
    from Chromium's console log), ``resources`` (URLs the page fetched), ``headings`` (list of
    ``{"level", "text"}``), ``title``, ``exercised`` (synthetic events sent), ``screenshot`` (the
    saved path or None), ``ok`` (no errors and no resources).

    Raises
    ------
    ChromiumError
        No browser found, or it produced no result within ``timeout`` seconds.
    """
    browser = chromium or find_chromium()
    if not browser:
        raise ChromiumError("Chromium not found (install the 'chromium' package or set VRAMKIT_CHROMIUM)")
    with open(html_path, "r", encoding="utf-8") as f:
        page = f.read()
    with tempfile.TemporaryDirectory(prefix="vk-browser-") as tmp:
        probe = os.path.join(tmp, "page.html")
        with open(probe, "w", encoding="utf-8") as f:
            f.write(_instrument(page))
        w, h = window_size
        cmd = [browser, *_base_flags(os.path.join(tmp, "profile-dom")), f"--window-size={w},{h}",
               "--virtual-time-budget=15000", "--dump-dom", "file://" + probe]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise ChromiumError(f"Chromium did not finish within {timeout:.0f} s") from None
        m = re.search(r'<pre id="%s"[^>]*>(.*?)</pre>' % _RESULT_ID, proc.stdout, flags=re.DOTALL)
        if not m:
            tail = (proc.stderr or "")[-2000:]
            raise ChromiumError(f"Chromium produced no result (exit {proc.returncode}); stderr tail:\n{tail}")
        result = json.loads(html.unescape(m.group(1)))
        errors = list(result.get("errors", []))
        for line in _console_errors(proc.stderr or ""):
            # Chromium's log repeats what the collector saw; keep only what it missed.
            quoted = re.search(r'"(.*)"', line)
            message = quoted.group(1) if quoted else line
            if not any(message.replace("Uncaught ", "") in e for e in errors):
                errors.append(line)
        result["errors"] = errors
        result["screenshot"] = None
        if screenshot:
            shot = os.path.abspath(screenshot)
            os.makedirs(os.path.dirname(shot), exist_ok=True)
            original = os.path.join(tmp, "original.html")
            shutil.copyfile(html_path, original)
            cmd = [browser, *_base_flags(os.path.join(tmp, "profile-shot")), f"--window-size={w},{h}",
                   "--virtual-time-budget=5000", f"--screenshot={shot}", "file://" + original]
            try:
                subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            except subprocess.TimeoutExpired:
                raise ChromiumError(f"Chromium screenshot did not finish within {timeout:.0f} s") from None
            if os.path.isfile(shot) and os.path.getsize(shot) > 0:
                result["screenshot"] = shot
            else:
                result["errors"].append("screenshot was not written")
    result["ok"] = not result["errors"] and not result.get("resources")
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("html", help="the HTML file to open")
    ap.add_argument("--screenshot", help="save a PNG screenshot here")
    ap.add_argument("--window-size", default="1400,2000", help="WIDTH,HEIGHT in CSS pixels")
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--json", action="store_true", help="print the full result as JSON")
    args = ap.parse_args(argv)
    try:
        w, h = (int(v) for v in args.window_size.split(","))
    except ValueError:
        ap.error("--window-size must be WIDTH,HEIGHT")
    try:
        res = check_page(args.html, args.screenshot, (w, h), args.timeout)
    except (ChromiumError, OSError) as exc:
        print(f"browser_check: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        for err in res["errors"]:
            print(f"JS error: {err}")
        for url in res.get("resources", []):
            print(f"loaded from outside the page: {url}")
        print(f"headings: {len(res['headings'])}, synthetic events: {res.get('exercised', 0)}, "
              f"screenshot: {res['screenshot'] or '-'}")
        print("OK" if res["ok"] else "PROBLEMS FOUND")
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
