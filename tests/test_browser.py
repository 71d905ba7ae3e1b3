"""A real browser drives the dashboard: headless Debian chromium (through the `playwright` package)
opens notebooks/09_dashboard.ipynb in JupyterLab, runs all cells, flips the `logprob_temperature`
checkbox of the StepPanel and checks that the summary numbers and the plots are redrawn.

The notebook is copied into a temporary directory that serves as the server's root, so the
browser's autosave never touches the committed notebook. Screenshots go to tests/artifacts/.
Needs /usr/bin/chromium (`make setup` installs Debian's `chromium` when run as root); playwright's
own browser download is never used.
"""

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "09_dashboard.ipynb"
ARTIFACTS = ROOT / "tests" / "artifacts"
pytestmark = pytest.mark.slow  # `make test-slow`: a JupyterLab server and Chromium per test
CHROMIUM = "/usr/bin/chromium"
VIEWPORT = {"width": 1600, "height": 1200}  # the lab's layout at this size is what the width checks measure
TOGGLE = "logprob_temperature"  # re-runs logprobs -> loss on the cached rollout: no new samples

# Budgets in seconds (2 slow CPU cores, possibly shared with a training run).
SERVER_START = 180
KERNEL_READY = 300
RUN_ALL = 1500
REDRAW = 600

# Isolated JupyterLab settings: no news toast over the page, every cell attached to the DOM.
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
}

# Browser-side state of the (only) notebook panel, in one evaluation.
NOTEBOOK_STATE_JS = """() => {
  const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
  if (!panel) return null;
  const indicator = panel.querySelector('.jp-Notebook-ExecutionIndicator');
  const kernelName = panel.querySelector('.jp-Toolbar-kernelName');
  const statusBar = [...document.querySelectorAll('.jp-StatusBar-TextItem')].map(e => e.textContent);
  const prompts = [...panel.querySelectorAll('.jp-CodeCell .jp-InputPrompt')].map(e => e.textContent.trim());
  const errors = [...panel.querySelectorAll('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')]
    .map(e => e.textContent).filter(t => /Traceback|\\w+Error\\b/.test(t));
  return {indicator: indicator ? indicator.getAttribute('data-status') : null,
          kernelName: kernelName ? kernelName.textContent.trim() : null,
          statusBar, prompts, errors};
}"""

# The StepPanel as rendered: its status line (summary numbers), plot images and per-sample table.
PANEL_STATE_JS = """() => {
  const status = [...document.querySelectorAll('.widget-html')].find(e => e.textContent.includes('re-ran'));
  if (!status) return null;
  const box = status.closest('.widget-vbox');
  const outs = box ? [...box.querySelectorAll('.widget-output')] : [];
  const table = outs.map(o => o.querySelector('table')).find(t => t);
  return {status: status.textContent.trim(),
          images: outs.flatMap(o => [...o.querySelectorAll('img')].map(i => i.getAttribute('src') || '')),
          table: table ? table.textContent : ''};
}"""


# The notebooks whose stored outputs are measured (never run here); 09's table is measured after its run.
WIDTH_CHECKED = ("03_rewards.ipynb", "05b_off_policy.ipynb", "06b_training.ipynb")

# Every table in an output of the (only) notebook panel: its first header cells, its width and the width of the
# output column it sits in (the output area's visible width).
TABLE_WIDTHS_JS = """(root) => {
  const scope = root ? document.querySelector(root) : document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
  if (!scope) return null;
  return [...scope.querySelectorAll('.jp-OutputArea-output')].flatMap(out => [...out.querySelectorAll('table')].map(t => ({
    headers: [...t.querySelectorAll('thead th')].map(th => th.textContent.trim()).filter(h => h).slice(0, 4),
    width: Math.ceil(Math.max(t.scrollWidth, t.getBoundingClientRect().width)),
    column: out.clientWidth,
    output_scroll: out.scrollWidth})));
}"""


def _too_wide(tables: list[dict]) -> list[str]:
    return [
        f"table {t['headers']} is {t['width']} px in a {t['column']} px column (+{t['width'] - t['column']} px)"
        for t in tables
        if t["width"] > t["column"] or t["output_scroll"] > t["column"]
    ]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _api(port: int, token: str, path: str):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def _copy_notebook_without_outputs(dest: Path) -> None:
    """The committed notebook, outputs and saved widget state stripped: all the page shows is fresh."""
    nb = json.loads(NOTEBOOK.read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
    nb["metadata"].pop("widgets", None)
    dest.write_text(json.dumps(nb, indent=1))


def _log_tail(log: Path, n: int = 3000) -> str:
    return log.read_text(errors="replace")[-n:] if log.exists() else ""


def _summary_numbers(status: str) -> dict[str, float]:
    """'re-ran logprobs, ... in 1.23 s; reward = 0.5, loss = 0.01' -> {'reward': 0.5, 'loss': 0.01}."""
    numbers = status.split(" s; ", 1)[1] if " s; " in status else ""
    return {k.strip(): float(v) for k, v in re.findall(r"([^,=]+?) = ([-+0-9.eE]+|nan|inf)", numbers)}


@pytest.fixture
def lab(tmp_path):
    """JupyterLab on 127.0.0.1 with a token, its root a temporary copy of the dashboard notebook."""
    root = tmp_path / "lab"
    root.mkdir()
    _copy_notebook_without_outputs(root / NOTEBOOK.name)
    with _jupyterlab(tmp_path, root) as server:
        yield server


@pytest.fixture
def lab_of_executed_notebooks(tmp_path):
    """JupyterLab whose root holds copies of the committed notebooks WIDTH_CHECKED, outputs and all (never run)."""
    root = tmp_path / "lab"
    root.mkdir()
    for name in WIDTH_CHECKED:
        shutil.copy(ROOT / "notebooks" / name, root / name)
    with _jupyterlab(tmp_path, root) as server:
        yield server


@contextmanager
def _jupyterlab(tmp_path: Path, root: Path):
    """JupyterLab serving `root`, with isolated settings; every process it started is ended on the way out."""
    config = tmp_path / "jupyter_config"
    for name, values in LAB_SETTINGS.items():
        path = config / "lab" / "user-settings" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    env = {k: v for k, v in os.environ.items() if k not in ("MPLBACKEND", "JUPYTER_PATH", "PYTHONPATH")}
    env.update(
        HF_HUB_OFFLINE="1",
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        JUPYTER_CONFIG_DIR=str(config),
        JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
        IPYTHONDIR=str(tmp_path / "ipython"),
        PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
        PYTHONPATH=str(ROOT),  # the kernel imports this checkout's grpo_debug (a worktree's too), not an installed one
    )
    port, token = _free_port(), secrets.token_hex(16)
    args = [
        sys.executable,
        "-m",
        "jupyter",
        "lab",
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        f"--ServerApp.token={token}",
        "--ServerApp.open_browser=False",
        f"--notebook-dir={root}",
    ]
    if os.getuid() == 0:
        args.append("--allow-root")
    log = tmp_path / "jupyterlab.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            args,
            cwd=root,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    descendants: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + SERVER_START
        while True:
            assert proc.poll() is None, f"JupyterLab exited with {proc.returncode}:\n{_log_tail(log)}"
            try:
                _api(port, token, "/api/status")
                break
            except (OSError, ValueError):
                assert time.monotonic() < deadline, f"JupyterLab did not answer in {SERVER_START} s:\n{_log_tail(log)}"
                time.sleep(1)
        yield {"port": port, "token": token, "root": root, "log": log, "proc": proc, "descendants": descendants}
    finally:
        # Kernels run in sessions of their own: note them before the server goes, end them by pid after.
        try:
            descendants.extend(psutil.Process(proc.pid).children(recursive=True))
        except psutil.Error:
            pass
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        for child in descendants:
            try:
                child.terminate()
            except psutil.Error:
                pass
        gone, alive = psutil.wait_procs(descendants, timeout=15)
        for child in alive:
            try:
                child.kill()
            except psutil.Error:
                pass


def _doctor_page_seen(path: Path, js: str, shot_name: str):
    """The doctor's page opened at 1280 x 800 once its verdict is drawn: what `js` reads of it, a full-page
    screenshot kept as ARTIFACTS/shot_name, the requests it made and its errors."""
    with _standalone_page(path, {"width": 1280, "height": 800}) as (page, requests, errors):
        page.wait_for_selector("#verdict", timeout=30_000)
        seen = page.evaluate(js)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = ARTIFACTS / shot_name
        page.screenshot(path=str(shot), full_page=True)
    return seen, shot, requests, errors


def _sync_playwright():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail(
            "the Python package `playwright` is missing: `make setup` installs it with the test extra "
            "(.venv/bin/pip install -e '.[test]'); never run `playwright install`, the test uses "
            f"{CHROMIUM}",
            pytrace=False,
        )
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(
            f"{CHROMIUM} is missing: `make setup` installs Debian's chromium when run as root, "
            "else `sudo apt-get install chromium`",
            pytrace=False,
        )
    return sync_playwright


class Page:
    """The page plus what a failure message needs: the browser console and the server log."""

    def __init__(self, page, lab):
        self.page, self.lab, self.console = page, lab, []
        page.on(
            "console", lambda m: self.console.append(f"{m.type}: {m.text}") if m.type in ("error", "warning") else None
        )
        page.on("pageerror", lambda e: self.console.append(f"pageerror: {e}"))

    def notebook(self) -> dict | None:
        return self.page.evaluate(NOTEBOOK_STATE_JS)

    def panel(self) -> dict | None:
        return self.page.evaluate(PANEL_STATE_JS)

    def kernel(self) -> dict | None:
        """The server's view of the notebook's kernel: execution_state and live websocket connections."""
        port, token = self.lab["port"], self.lab["token"]
        for session in _api(port, token, "/api/sessions"):
            if session.get("path", "").endswith(NOTEBOOK.name) and session.get("kernel"):
                return _api(port, token, f"/api/kernels/{session['kernel']['id']}")
        return None

    def context(self, what: str) -> str:
        return (
            f"{what}\nbrowser state: {self.notebook()}\npanel: {str(self.panel())[:600]}\nkernel: {self.kernel()}"
            f"\nbrowser console (last 20):\n"
            + "\n".join(self.console[-20:])
            + f"\nserver log:\n{_log_tail(self.lab['log'])}"
        )

    def wait(self, condition, seconds: float, what: str, poll: float = 1.0):
        """Poll `condition()` until it returns something truthy; fail with the whole picture on timeout."""
        deadline = time.monotonic() + seconds
        while True:
            value = condition()
            if value:
                return value
            if time.monotonic() > deadline:
                pytest.fail(self.context(f"timed out after {seconds:.0f} s waiting for {what}"), pytrace=False)
            self.page.wait_for_timeout(poll * 1000)

    def kernel_ready(self) -> bool:
        """Connected and idle on both sides: the page's status bar and toolbar, and the server's kernel
        model (execution_state idle, at least one websocket connection). The toolbar's execution
        indicator alone says 'idle' before any kernel is connected."""
        state = self.notebook()
        if not state or state["indicator"] != "idle" or not state["kernelName"] or "No Kernel" in state["kernelName"]:
            return False
        if not any(text.rstrip().endswith("| Idle") for text in state["statusBar"]):
            return False
        kernel = self.kernel()
        return bool(kernel and kernel.get("execution_state") == "idle" and kernel.get("connections", 0) >= 1)

    def kernel_ready_for(self, seconds: float) -> bool:
        """kernel_ready() held for `seconds` in a row: the start-up kernel_info/comm traffic is over."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if not self.kernel_ready():
                return False
            self.page.wait_for_timeout(500)
        return True

    def all_cells_done(self) -> bool:
        state = self.notebook()
        if state and state["errors"]:
            pytest.fail(self.context("a cell raised:\n" + "\n".join(state["errors"])[-3000:]), pytrace=False)
        return bool(
            state
            and state["prompts"]
            and all(re.fullmatch(r"\[\d+\]:", p) for p in state["prompts"])
            and self.kernel_ready()
        )

    def screenshot(self, name: str) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / name
        self.page.screenshot(path=str(path))
        return path


def test_dashboard_toggle_redraws_numbers_and_plot_in_a_real_browser(lab):
    sync_playwright = _sync_playwright()
    started = time.monotonic()
    url = f"http://127.0.0.1:{lab['port']}/lab/tree/{NOTEBOOK.name}?token={lab['token']}"
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"]
        )
        try:
            page = Page(browser.new_page(viewport=VIEWPORT), lab)
            try:
                _drive_dashboard(page, url)
            except BaseException:
                page.screenshot("browser_dashboard_failure.png")
                raise
        finally:
            browser.close()
    print(f"browser test took {time.monotonic() - started:.0f} s")


def _drive_dashboard(page: Page, url: str) -> None:
    page.page.goto(url, timeout=SERVER_START * 1000)
    page.page.wait_for_selector(".jp-NotebookPanel .jp-Notebook .jp-Cell", timeout=SERVER_START * 1000)

    # The trap: a Run All sent before the session is connected and idle is dropped without a word.
    page.wait(lambda: page.kernel_ready_for(3), KERNEL_READY, "the kernel to be connected and idle")

    page.page.locator(".jp-NotebookPanel .jp-Cell").first.click()  # the notebook is the current widget
    page.page.locator(".lm-MenuBar-item", has_text=re.compile(r"^Run$")).click()
    page.page.locator('.lm-Menu-item[data-command="runmenu:run-all"]').click()
    page.wait(
        lambda: any(p != "[ ]:" for p in (page.notebook() or {"prompts": []})["prompts"]),
        60,
        "Run All Cells to start (a cell prompt showing [*] or a number)",
    )
    page.wait(page.all_cells_done, RUN_ALL, "all cells to finish", poll=2)

    panel = page.wait(
        lambda: (s := page.panel()) and len(s["images"]) == 3 and s["table"] and s,
        120,
        "the StepPanel with its status, three plots and the per-sample table",
    )
    before = _summary_numbers(panel["status"])
    assert "max |sampler - recomputed|" in before and "loss" in before, panel["status"]
    checkbox = page.page.locator(".widget-checkbox", has_text=TOGGLE).locator("input[type=checkbox]")
    assert checkbox.is_checked(), f"{TOGGLE} starts on (the fixed configuration)"
    page.page.locator(".widget-html", has_text="re-ran").scroll_into_view_if_needed()
    page.screenshot("browser_dashboard_before.png")

    checkbox.click()
    assert not checkbox.is_checked()
    seen = []  # the redraw is done when two polls in a row see the same new status, plots and table

    def redrawn():
        s = page.panel()
        if not (s and s["status"] != panel["status"] and len(s["images"]) == 3 and s["table"] and page.kernel_ready()):
            return None
        seen.append(s)
        return s if len(seen) > 1 and seen[-2] == s else None

    after = page.wait(redrawn, REDRAW, f"the redraw after flipping {TOGGLE}")
    page.page.locator(".widget-html", has_text="re-ran").scroll_into_view_if_needed()
    shot = page.screenshot("browser_dashboard.png")

    numbers = _summary_numbers(after["status"])
    rerun = after["status"].split(" in ", 1)[0]
    assert "logprobs" in rerun and "rollout" not in rerun, (
        f"{TOGGLE} re-runs from logprobs on the cached rollout: {after['status']}"
    )
    assert numbers.keys() == before.keys(), (before, numbers)
    assert numbers != before, f"the summary numbers did not change:\n{panel['status']}\n{after['status']}"
    assert numbers["max |sampler - recomputed|"] != before["max |sampler - recomputed|"], (before, numbers)
    assert after["images"][0] != panel["images"][0], "the log-prob gap heatmap was not redrawn with new data"
    assert all(src.startswith("data:image/png") for src in after["images"]), [s[:40] for s in after["images"]]
    assert shot.stat().st_size > 10_000
    tables = page.page.evaluate(TABLE_WIDTHS_JS, ".jp-NotebookPanel:not(.lm-mod-hidden) .widget-vbox")
    every = page.page.evaluate(TABLE_WIDTHS_JS, None)  # the panel's and the static comparisons below it
    print("09's tables: " + "; ".join(f"{t['headers']} {t['width']} px / {t['column']} px" for t in every))
    assert tables, "the panel's per-sample table was not found"
    assert not _too_wide(every), "09's tables wider than the column:\n" + "\n".join(_too_wide(every))
    _screenshot_whole_notebook(page.page, "09_dashboard")


def _screenshot_whole_notebook(page, name: str) -> list[Path]:
    """The notebook top to bottom: the viewport made as tall as its content (slices of at most 12,000 px), then
    restored; one PNG per slice."""
    scroller = ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-WindowedPanel-outer"
    total = page.evaluate(f"() => document.querySelector('{scroller}').scrollHeight")
    size = page.viewport_size
    tall = min(total + 200, 12_000)
    page.set_viewport_size({"width": size["width"], "height": tall})
    shots = []
    try:
        for k, top in enumerate(range(0, total, tall - 200)):
            page.evaluate(f"() => {{ document.querySelector('{scroller}').scrollTop = {top}; }}")
            page.wait_for_timeout(300)
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            shots.append(ARTIFACTS / f"browser_{name}_{k + 1}.png")
            page.screenshot(path=str(shots[-1]))
    finally:
        page.set_viewport_size(size)
    return shots


def _stored_tables(name: str) -> int:
    stored = json.loads((ROOT / "notebooks" / name).read_text())
    return sum(
        "<table" in "".join(o.get("data", {}).get("text/html", ""))
        for c in stored["cells"]
        for o in c.get("outputs", [])
    )


def _measure_stored_notebook(page: Page, name: str) -> list[dict]:
    """Open `name` (outputs as stored), wait for its tables and images, screenshot it whole; its tables' widths."""
    expected = _stored_tables(name)
    images_loaded = "() => [...document.querySelectorAll('.jp-OutputArea-output img')].every(i => i.complete)"
    current = "() => (document.querySelector('.lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current') || {}).textContent"
    workspace = name.removesuffix(".ipynb").replace("_", "-")  # a fresh one: no notebook opened before comes back
    lab = f"http://127.0.0.1:{page.lab['port']}/lab/workspaces/{workspace}/tree/{name}?token={page.lab['token']}"
    page.page.goto(lab)
    page.wait(
        lambda: (
            (page.page.evaluate(current) or "").strip() == name
            and len(page.page.evaluate(TABLE_WIDTHS_JS, None) or []) >= expected
            and page.page.evaluate(images_loaded)
        ),
        SERVER_START,
        f"{name}'s {expected} stored tables and its images to render",
    )
    tables = page.page.evaluate(TABLE_WIDTHS_JS, None)
    _screenshot_whole_notebook(page.page, name.removesuffix(".ipynb"))
    page.page.close()
    return tables


def test_the_executed_notebooks_tables_fit_the_column(lab_of_executed_notebooks):
    """03, 05b and 06b as committed (their stored outputs, not run): no output table wider than the notebook's
    column at the lab's default layout (1600 x 1200); a screenshot of each notebook, top to bottom."""
    sync_playwright = _sync_playwright()
    lab = lab_of_executed_notebooks
    found: dict[str, list[dict]] = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"]
        )
        try:
            for name in WIDTH_CHECKED:
                found[name] = _measure_stored_notebook(Page(browser.new_page(viewport=VIEWPORT), lab), name)
        finally:
            browser.close()
    for name, tables in found.items():
        print(f"{name}: " + "; ".join(f"{t['headers']} {t['width']} px / {t['column']} px" for t in tables))
    wide = {name: _too_wide(tables) for name, tables in found.items() if _too_wide(tables)}
    assert not wide, "tables wider than the notebook column:\n" + "\n".join(
        f"{name}: {line}" for name, lines in wide.items() for line in lines
    )


@contextmanager
def _standalone_page(path: Path, viewport: dict | None = None):
    """(page, requests, page errors) of a page a headless chromium opened from disk at `path` (default 1280 x 900)."""
    sync_playwright = _sync_playwright()
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"]
        )
        try:
            page = browser.new_page(viewport=viewport or {"width": 1280, "height": 900})
            requests, errors = [], []
            page.on("request", lambda r: requests.append(r.url))
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(path.as_uri())
            yield page, requests, errors
        finally:
            browser.close()


def test_the_token_page_loads_and_recolours_in_a_real_browser(tmp_path):
    """`step --html` writes a page that a browser opens from disk, no server: its tokens are there, and switching
    the quantity recolours them."""
    path = tmp_path / "tokens.html"
    made = subprocess.run(
        [sys.executable, "-m", "grpo_debug", "step", "--set", "num_prompts=2", "num_generations=4"]
        + ["max_new_tokens=32", "--html", str(path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert made.returncode == 0, made.stderr
    colours_js = "() => [...document.querySelectorAll('span.gd-tok')].map(s => getComputedStyle(s).backgroundColor)"
    with _standalone_page(path) as (page, requests, errors):
        page.wait_for_selector("span.gd-tok", timeout=30_000)
        before = page.evaluate(colours_js)
        legend = page.evaluate("() => [...document.querySelectorAll('.gd-legend:not([hidden])')].map(l => l.dataset.q)")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "browser_token_page_advantage.png"))
        page.select_option("select.gd-quantity", "entropy")
        after = page.evaluate(colours_js)
        legend_after = page.evaluate(
            "() => [...document.querySelectorAll('.gd-legend:not([hidden])')].map(l => l.dataset.q)"
        )
        page.screenshot(path=str(ARTIFACTS / "browser_token_page_entropy.png"))
        page.select_option("select.gd-quantity", "advantage")
        back = page.evaluate(colours_js)
    assert not errors, errors
    assert all(u.startswith("file://") for u in requests), [u for u in requests if not u.startswith("file://")]
    assert len(before) > 8 and len(set(before)) > 1, "the tokens are there, coloured"
    changed = sum(a != b for a, b in zip(before, after))
    assert changed > len(before) // 4, f"only {changed} of {len(before)} tokens changed colour"
    assert (legend, legend_after) == (["advantage"], ["entropy"])
    assert back == before, "switching back restores the first colours"


# The doctor's page at 1280 x 800, measured in one evaluation: the verdict, the chain picture, each cause card's
# figures and their axis labels (the SVG's own text), its flip table, the folded groups, and any element wider than
# the viewport.
DOCTOR_PAGE_JS = """() => {
  const cards = [...document.querySelectorAll('div.card')].map(c => ({
    id: c.id,
    figures: [...c.querySelectorAll('svg.figure')].map(f => [...f.querySelectorAll('text')].map(t => t.textContent)),
    table: !!c.querySelector('table.flip')}));
  const wide = [...document.querySelectorAll('body *')].filter(e => e.getBoundingClientRect().right > innerWidth + 1)
    .map(e => e.tagName + (e.className && e.className.baseVal === undefined ? '.' + e.className : ''));
  return {verdict: (document.querySelector('#verdict') || {}).textContent || '',
          chain: !!document.querySelector('svg.chain line, svg.chain rect'),
          cards, wide, scroll: document.documentElement.scrollWidth, height: document.documentElement.scrollHeight,
          folded: [...document.querySelectorAll('details:not([open]) > summary')].map(s => s.textContent)};
}"""
AXES = {"position_ids": ("completion token position", "|log-prob gap| (nats)")}


def test_the_doctor_page_shows_its_verdict_chain_and_evidence_in_a_real_browser(tmp_path):
    """`doctor --html` on the bundled step with position_ids planted, opened from disk at 1280 x 800: the verdict
    line, the chain picture, each cause's card with its evidence figure (axes labelled) and its flip table, nothing
    wider than the viewport, the 26 checks within 3 screens with those that found nothing folded, nothing fetched
    from elsewhere; the screenshot is kept in tests/artifacts/."""
    path = tmp_path / "doctor.html"
    made = subprocess.run(
        [sys.executable, "-m", "grpo_debug", "doctor", "--set", "num_prompts=2", "num_generations=4"]
        + ["max_new_tokens=32", "position_ids=false", "--html", str(path), "--png", str(tmp_path / "png")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert made.returncode == 0, made.stderr
    seen, shot, requests, errors = _doctor_page_seen(path, DOCTOR_PAGE_JS, "browser_doctor_page.png")
    print(f"screenshot: {shot}; page {seen['height']} px high; cards {[c['id'] for c in seen['cards']]}")
    assert not errors, errors
    assert all(u.startswith("file://") for u in requests), [u for u in requests if not u.startswith("file://")]
    assert seen["verdict"].startswith("First cause: position_ids (problem)") and "Fix: " in seen["verdict"]
    assert seen["chain"], "no chain picture"
    assert seen["cards"] and seen["cards"][0]["id"] == "position_ids", seen["cards"]
    for card in seen["cards"]:
        assert card["figures"] and card["table"] is not None, f"{card['id']} has no evidence figure"
        labels = " ".join(card["figures"][0])
        for label in AXES.get(card["id"], ()):
            assert label in labels, f"{card['id']}'s figure has no axis label {label!r}: {labels[:300]}"
    assert seen["cards"][0]["table"], "position_ids's flip is not a table"
    assert not seen["wide"] and seen["scroll"] <= 1280, f"wider than the viewport: {seen['wide'][:5]}"
    assert any(s.endswith("checks found nothing") for s in seen["folded"]), seen["folded"]
    assert seen["height"] <= 3 * 800, f"the page is {seen['height']} px: more than 3 screens of 800"
    pngs = sorted(p.name for p in (tmp_path / "png").iterdir())
    assert pngs == [f"{k}-{c['id']}-evidence.png" for k, c in enumerate(seen["cards"], start=1)], pngs


# Each figure of each cause card: whether it is the card's horizon plot (the one with a caption) and, per axis, the
# texts that are no tick label (its label, and an offset such as 1e-7 where matplotlib writes one).
CAPTURE_PAGE_JS = """() => ({
  verdict: (document.querySelector('#verdict') || {}).textContent || '',
  chain: [...document.querySelectorAll('svg.chain rect')].length,
  cards: [...document.querySelectorAll('div.card')].map(c => ({
    id: c.id,
    text: c.textContent,
    table: [...c.querySelectorAll('table.flip th')].map(th => th.textContent),
    figures: [...c.querySelectorAll('svg.figure')].map(f => ({
      horizon: !!f.closest('figure').querySelector('figcaption'),
      axes: [...f.querySelectorAll('g[id^="matplotlib.axis"]')].map(a => [...a.children]
        .filter(g => !/^[xy]tick/.test(g.id)).flatMap(g => [...g.querySelectorAll('text')].map(t => t.textContent)))}))})),
  wide: [...document.querySelectorAll('body *')].filter(e => e.getBoundingClientRect().right > innerWidth + 1)
    .map(e => e.tagName + (e.className && e.className.baseVal === undefined ? '.' + e.className : '')),
  scroll: document.documentElement.scrollWidth})"""
CAPTURE_AXES = {"truncation": ("completion length (tokens)", "completions")}
HORIZON_AXES = ("step of the horizon", "batch reward", "KL to the start (nats/token)")


@pytest.mark.usefixtures("task_registry_restored")
def test_a_captures_doctor_page_with_its_task_and_horizon_in_a_real_browser(tmp_path):
    """`doctor CAPTURE --task user_train.py:digits --horizon 2 --horizon-seeds 2 --html` on a user's one-step TRL
    run of a tiny Llama (tests/tiny_capture.py: 75% of its completions cut at max_completion_length=8, a warning
    whose fix is followed over the horizon), opened from disk at 1280 x 800: the verdict names the first cause and
    its fix in the run's GRPOConfig, the chain picture, each cause's card with its evidence figure (axes labelled),
    its flip as a table and its horizon plot (axes labelled), nothing wider than the viewport, nothing fetched; the
    screenshot is kept in tests/artifacts/."""
    sys.path.insert(0, str(ROOT / "tests"))
    from tiny_capture import captured_step, grpo_debug

    capture = captured_step(tmp_path)
    (tmp_path / "user_train.py").write_text(  # the run's own reward function, by its name
        "def digits(completions, **kwargs):\n"
        "    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]\n"
    )
    path = tmp_path / "page.html"
    made = grpo_debug("doctor", capture, "--task", "user_train.py:digits", "--horizon", "2", "--horizon-seeds", "2",
                      "--html", path, cwd=tmp_path, timeout=300)  # fmt: skip
    assert made.returncode == 0, made.stderr[-3000:]
    seen, shot, requests, errors = _doctor_page_seen(path, CAPTURE_PAGE_JS, "browser_doctor_capture_page.png")
    print(f"screenshot: {shot}; verdict: {seen['verdict']}")
    assert not errors, errors
    assert all(u.startswith("file://") for u in requests), [u for u in requests if not u.startswith("file://")]
    cards = seen["cards"]
    assert cards and seen["verdict"].startswith(f"First cause: {cards[0]['id']} ("), (seen["verdict"], cards)
    assert cards[0]["id"] == "truncation", [c["id"] for c in cards]
    assert (
        "Fix: GRPOConfig(..., max_completion_length=32). What the fix did: followed 2 steps x 2 seeds"
        in (seen["verdict"])
    ), seen["verdict"]
    assert seen["chain"] >= len(cards), "the chain picture has no box per cause"
    followed = 0
    for card in cards:
        evidence = [f for f in card["figures"] if not f["horizon"]]
        assert len(evidence) == 1, f"{card['id']}: {len(evidence)} evidence figures"
        for figure in card["figures"]:
            assert figure["axes"] and all(figure["axes"]), f"{card['id']}: an axis without a label: {figure['axes']}"
        labels = {t for axis in evidence[0]["axes"] for t in axis}
        assert set(CAPTURE_AXES.get(card["id"], ())) <= labels, f"{card['id']}'s evidence axes: {labels}"
        assert card["table"][:3] == ["", "as run", "with the flip"] and "grad_norm" in card["table"], card["table"]
        assert "fix in your config: GRPOConfig(..., " in card["text"], card["text"][:500]
        horizons = [f for f in card["figures"] if f["horizon"]]
        for figure in horizons:
            labels = {t for axis in figure["axes"] for t in axis}
            assert set(HORIZON_AXES) <= labels, f"{card['id']}'s horizon axes: {labels}"
        followed += len(horizons)
    assert followed >= 1 and len(cards[0]["figures"]) == 2, "the first cause's fix was not followed over the horizon"
    assert not seen["wide"] and seen["scroll"] <= 1280, f"wider than the viewport: {seen['wide'][:5]}"
