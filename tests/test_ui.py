"""The Dagster UI in a real browser: `dagster dev` on a free port, driven by headless Chromium over the
DevTools protocol. The graph shows every asset, a click materializes one, the run view says it succeeded,
and the asset graph is screenshotted (with HANDHOLD_UPDATE_SCREENSHOT=1 it becomes docs/asset-graph.png, the
README's picture). Every process started is stopped."""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from websockets.sync.client import connect

from assets.graph import all_assets
from assets.instance import ensure_dagster_home

REPO = Path(__file__).resolve().parent.parent
SCREENSHOT = REPO / "docs" / "asset-graph.png"  # rewritten only with HANDHOLD_UPDATE_SCREENSHOT=1
ASSET_NAMES = sorted(key.to_user_string() for a in all_assets for key in a.keys)
SMALL_ASSET = "sandbox_base_image"  # present after `make test`'s set-up: materializes in a second
pytestmark = [pytest.mark.slow, pytest.mark.docker]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list[str], log: Path, **kwargs) -> subprocess.Popen:
    """A process leading a session of its own, with SIGINT at its default (a background shell ignores it,
    and `dagster dev` makes SIGTERM do what SIGINT does)."""
    return subprocess.Popen(cmd, start_new_session=True, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL), **kwargs)


def session_members(sid: int) -> list[int]:
    """Live processes (zombies left out) of session `sid`, read from /proc."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if entry.name.isdigit() and int(fields[3]) == sid and fields[0] != "Z":
            pids.append(int(entry.name))
    return pids


def stop(proc: subprocess.Popen, grace: float = 30) -> None:
    """SIGTERM the leader, give the session `grace` seconds to exit, SIGKILL what is left, and make sure
    nothing of it survives."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while session_members(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.3)
    for pid in session_members(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(10)
    deadline = time.monotonic() + 10
    while session_members(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not session_members(proc.pid), f"processes left behind: {session_members(proc.pid)}"


def poll(what: str, check, timeout: float, every: float = 0.5, detail=lambda: ""):
    """check()'s first truthy value within `timeout` seconds, else a failure saying what was awaited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    pytest.fail(f"no {what} within {timeout:.0f} s. {detail()}")


def graphql(base: str, query: str, **variables) -> dict:
    body = json.dumps({"query": query, "variables": variables}).encode()
    request = urllib.request.Request(f"{base}/graphql", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)["data"]


class Page:
    """A Chromium tab over the DevTools protocol: navigate, evaluate, click, press keys, screenshot."""

    def __init__(self, ws):
        self.ws, self.ids = ws, itertools.count(1)

    def send(self, method: str, **params) -> dict:
        sent = next(self.ids)
        self.ws.send(json.dumps({"id": sent, "method": method, "params": params}))
        while True:  # events arrive in between; only the answer matters here
            message = json.loads(self.ws.recv(timeout=60))
            if message.get("id") == sent:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]

    def js(self, expression: str):
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        return result["result"].get("value")

    def goto(self, url: str) -> None:
        self.send("Page.navigate", url=url)

    def text(self) -> str:
        return self.js("document.body ? document.body.innerText : ''") or ""

    def button(self, label: str) -> list[float] | None:
        """The centre of the visible button labelled `label`, scrolled into view."""
        return self.js(f"""(() => {{
            const b = [...document.querySelectorAll("button")].find(b => b.innerText.trim() === {json.dumps(label)}
                && b.offsetParent !== null && !b.disabled);
            if (!b) return null;
            b.scrollIntoView({{block: "center"}});
            const r = b.getBoundingClientRect();
            return [r.x + r.width / 2, r.y + r.height / 2];
        }})()""")

    def click(self, x: float, y: float) -> None:
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    def press(self, key: str, code: str, modifiers: int = 0) -> None:
        for kind in ("keyDown", "keyUp"):
            self.send("Input.dispatchKeyEvent", type=kind, key=key, code=code, modifiers=modifiers,
                      windowsVirtualKeyCode=ord(key.upper()))

    def screenshot(self) -> bytes:
        return base64.b64decode(self.send("Page.captureScreenshot", format="png")["data"])


@pytest.fixture(scope="module")
def dagster_ui(tmp_path_factory, base_image):  # base_image: what SMALL_ASSET makes (tests/conftest.py)
    """`dagster dev` (as `make dev` starts it: the code location from pyproject.toml) on a free port, with a
    fresh DAGSTER_HOME; its base URL."""
    tmp = tmp_path_factory.mktemp("dagster-ui")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("DAGSTER_HOME", str(tmp / "home"))
        ensure_dagster_home()
        environ = dict(os.environ)
    port = free_port()
    log = tmp / "dagster-dev.log"
    proc = start([sys.executable, "-m", "dagster", "dev", "-h", "127.0.0.1", "-p", str(port)], log, cwd=REPO,
                 env=environ)
    base = f"http://127.0.0.1:{port}"
    try:
        def loaded():
            if proc.poll() is not None:
                pytest.fail(f"dagster dev exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                entries = graphql(base, "{ workspaceOrError { ... on Workspace { locationEntries "
                                        "{ name loadStatus } } } }")["workspaceOrError"]["locationEntries"]
            except OSError:
                return None
            return entries if entries and all(e["loadStatus"] == "LOADED" for e in entries) else None

        entries = poll("loaded code location", loaded, timeout=180, every=1,
                       detail=lambda: log.read_text()[-3000:])
        assert [e["name"] for e in entries] == ["handhold"]
        yield base
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """A tab of Debian's Chromium, headless; fails (never skips) when it is not installed."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        pytest.fail("the UI test drives Debian's `chromium`, which is not installed: `apt-get install -y "
                    "chromium` (`make test` does it as root on Debian).")
    profile = tmp_path_factory.mktemp("chromium")
    proc = start([chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                  "--no-first-run", "--remote-debugging-port=0", f"--user-data-dir={profile}",
                  "--window-size=1600,1000", "about:blank"], profile.parent / "chromium.log")
    try:
        active = profile / "DevToolsActivePort"
        poll("Chromium DevTools port", lambda: active.exists() and active.read_text().split(), timeout=60,
             detail=lambda: (profile.parent / "chromium.log").read_text()[-2000:])
        port = active.read_text().split()[0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30) as response:
            target = next(t for t in json.load(response) if t["type"] == "page")
        with connect(target["webSocketDebuggerUrl"], max_size=None, open_timeout=30) as ws:
            tab = Page(ws)
            tab.send("Emulation.setDeviceMetricsOverride", width=1600, height=900, deviceScaleFactor=1, mobile=False)
            yield tab
    finally:
        stop(proc)


def graph_labels(page: Page) -> set[str]:
    """The texts of the asset graph's nodes (rendered in the SVG canvas)."""
    return set(page.js("""[...document.querySelectorAll("svg foreignObject *")]
        .filter(e => e.children.length === 0).map(e => e.textContent.trim())""") or [])


def open_asset_graph(page: Page, base: str) -> set[str]:
    """The global lineage page with every group expanded; the asset names its nodes show."""
    page.goto(f"{base}/asset-groups")
    poll("asset graph page", lambda: "Global asset lineage" in page.text(), timeout=60, detail=page.text)
    page.js("localStorage.setItem('communityNux', '\"1\"')")  # the newsletter dialog would cover the page
    if skip := page.button("Skip"):
        page.click(*skip)
    poll("asset groups in the graph", lambda: graph_labels(page), timeout=60, detail=page.text)
    if not set(ASSET_NAMES) <= graph_labels(page):
        page.press("e", "KeyE", modifiers=1)  # Alt+E: the graph's "Expand all groups"
    return poll("every asset in the graph", lambda: (labels := graph_labels(page)) >= set(ASSET_NAMES) and labels,
                timeout=60, detail=lambda: f"missing: {sorted(set(ASSET_NAMES) - graph_labels(page))}")


def test_asset_graph_shows_every_asset(dagster_ui, page):
    labels = open_asset_graph(page, dagster_ui)
    assert set(ASSET_NAMES) <= labels
    nodes = graphql(dagster_ui, "{ assetNodes { assetKey { path } } }")["assetNodes"]
    assert sorted("/".join(n["assetKey"]["path"]) for n in nodes) == ASSET_NAMES


def test_materialize_from_the_ui_succeeds_in_the_run_view(dagster_ui, page):
    page.goto(f"{dagster_ui}/assets/{SMALL_ASSET}")
    poll("asset page", lambda: "Code location" in page.text() and "handhold" in page.text(), timeout=60,
         detail=page.text)
    page.click(*poll("Materialize button", lambda: page.button("Materialize"), timeout=60, detail=page.text))
    # The UI answers with a toast linking to the run it launched.
    href = poll("launched-run toast", lambda: page.js(
        "(document.querySelector(\"a[href^='/runs/']\") || {}).pathname"), timeout=30, every=0.2,
                detail=page.text)
    run_id = href.rsplit("/", 1)[1]

    page.goto(f"{dagster_ui}/runs/{run_id}")

    def finished():
        text = page.text()
        assert "Failure" not in text and "RUN_FAILURE" not in text, f"run {run_id} failed:\n{text[-3000:]}"
        return "RUN_SUCCESS" in text and "Success" in text

    poll(f"success in the view of run {run_id}", finished, timeout=180, every=1, detail=lambda: page.text()[-3000:])
    run = graphql(dagster_ui, "query($id: ID!) { runOrError(runId: $id) { ... on Run { status assetSelection "
                              "{ path } } } }", id=run_id)["runOrError"]
    assert run == {"status": "SUCCESS", "assetSelection": [{"path": [SMALL_ASSET]}]}

    open_asset_graph(page, dagster_ui)
    if navigation := page.button("Hide navigation"):  # the graph gets the width when drawn again
        page.click(*navigation)
    open_asset_graph(page, dagster_ui)
    time.sleep(2)  # let the nodes settle (fit to the canvas, the new materialization shown)
    png = page.screenshot()
    assert png.startswith(b"\x89PNG") and len(png) > 20_000
    if os.environ.get("HANDHOLD_UPDATE_SCREENSHOT") == "1":  # the README's picture; a test run leaves it be
        SCREENSHOT.write_bytes(png)
