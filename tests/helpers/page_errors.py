"""The errors a page threw while a browser test drove it, so that the test fails on them.

A script error in the page (a widget's view that fails as it is shown, a rejected promise nobody handled) fails
none of a test's own checks when the part of the page they look at still came up; a user sees it in the browser's
console (#42: "Cannot read properties of undefined (reading 'then')", thrown by every view of the live chart while
the test passed). `watch_page_errors(page)` records, from the moment it is called:

- every uncaught exception and unhandled rejection in the page (Playwright's `pageerror`), with its stack;
- console messages of type error that come from ortlab's own code: logged by the sidebar's bundle (served from
  lab/extensions/ortlab-sidebar/), or naming ortlab (the sidebar's own messages start "ortlab:"). JupyterLab and
  other extensions log errors of their own that are no fault of ours (a websocket closed as the test ends, say):
  those are not failures here. Nor is chromium's network log ("Failed to load resource: ... 404"), whose source
  is the request's URL, not a script: ortlab's pages get 4xx answers by design (the sidebar's form sends a bad
  spec and shows the server's 400; "Open in a notebook" asks whether the notebook exists), and what a failed
  request breaks is for the test's own checks to see.

`assert_no_page_errors(errors)` fails with every one of them listed. Benchmarks that drive chromium pass one
`PageErrors` to each page they open and put its `errors` in their report, for their test to check.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

SIDEBAR_BUNDLE = "/ortlab-sidebar/"  # in the URL of the script that logged it
ORTLAB_MARK = "ortlab"  # in the message
NETWORK_LOG = "Failed to load resource"


@dataclass
class PageErrors:
    errors: list[str] = field(default_factory=list)


def _from_ortlab(message) -> bool:
    if message.text.startswith(NETWORK_LOG):
        return False
    url = (message.location or {}).get("url") or ""
    return SIDEBAR_BUNDLE in url or ORTLAB_MARK in message.text.lower()


def watch_page_errors(page, into: PageErrors | None = None, label: str = "") -> PageErrors:
    """Record `page`'s errors (see the module's docstring) into `into` (a new `PageErrors` if None), each prefixed
    with `label` if given; returns it."""
    seen = into if into is not None else PageErrors()
    prefix = f"[{label}] " if label else ""

    def on_page_error(error) -> None:
        stack = getattr(error, "stack", None) or ""
        # Chromium's stack starts with the message itself; show it once.
        text = stack if stack.startswith(f"{error.name}: {error.message}") else f"{error.message}\n{stack}"
        seen.errors.append(f"{prefix}pageerror: {text.rstrip()}")

    def on_console(message) -> None:
        if message.type == "error" and _from_ortlab(message):
            location = message.location or {}
            where = f"{location.get('url', '')}:{location.get('lineNumber', '')}"
            seen.errors.append(f"{prefix}console error at {where}: {message.text}")

    page.on("pageerror", on_page_error)
    page.on("console", on_console)
    return seen


def assert_no_page_errors(seen: PageErrors) -> None:
    """Fail, listing them, if the page threw or ortlab's code logged an error."""
    assert not seen.errors, f"the page had {len(seen.errors)} error(s):\n\n" + "\n\n".join(seen.errors)


def wait_until(predicate, timeout: float, what: str, poll_s: float = 0.3):
    """`predicate()`'s first truthy value within `timeout` seconds (a page is polled, not awaited: what the tests
    watch is the kernel's widgets and the run folder as much as the DOM); else an AssertionError naming `what`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
