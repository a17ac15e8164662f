"""The inspector in a real browser, in both notebook UIs that issue 12 names: JupyterLab 4 and
the classic notebook (Notebook 7), both served by one Jupyter server on 127.0.0.1 with a token,
Debian's chromium driven headless by Playwright, tests/browser/inspector.ipynb run in the page.
The tree's nodes and accepted path must be drawn, and moving the cycle slider, changing the
method and clicking a node must redraw them. Screenshots go to the test's temporary folder; with
LAB_SCREENSHOTS=1 (on an idle machine: the pictures show tokens per second) JupyterLab's replace
figures/inspector_*.png, the ones the README shows.

Without chromium (`make setup-browser` installs it), playwright or a UI's package (notebook,
jupyterlab: dependencies in pyproject.toml) the test is skipped and says why."""
import importlib.util
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

from lab.figures import record
from lab.paths import FIGURES_DIR, NOTEBOOKS_DIR

try:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright
except ImportError:  # the test skips and says why
    sync_playwright = None

pytestmark = pytest.mark.slow

NOTEBOOK = Path(__file__).parent / "browser" / "inspector.ipynb"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
SERVER_START_S, KERNEL_START_S, DECODE_S = 90, 120, 180  # generous: the machine may be busy
RUN_TRIES, RUN_WAIT_S = 6, 10
TREE = ".lab-tree"
PHASE_ORDER = ("drafting", "mask", "verify", "commit")
# the smallest font of the inspector's tree, summary and text, and the lowest contrast of a node's
# label on its box (WCAG's ratio of relative luminances), computed from the page's own styles
SMALL_TEXT = """[...document.querySelectorAll('.lab-inspector :is(.lab-tree, .lab-text, .lab-summary, .lab-details) *')]
  .filter((e) => e.tagName !== 'title' && !e.closest('.lab-export'))
  .filter((e) => [...e.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim()))
  .map((e) => [e.tagName, parseFloat(getComputedStyle(e).fontSize), e.textContent.slice(0, 30)])
  .filter(([, size]) => size < 18)"""
SMALLEST_CONTRAST = """(() => {
  const lum = (c) => c.match(/[0-9.]+/g).slice(0, 3).map(Number).map((v) => v / 255)
    .map((v) => (v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4))
    .reduce((sum, v, i) => sum + v * [0.2126, 0.7152, 0.0722][i], 0);
  return Math.min(...[...document.querySelectorAll('.lab-inspector .lab-tree g.node')].map((node) => {
    const [a, b] = [lum(getComputedStyle(node.querySelector('text')).fill),
                    lum(getComputedStyle(node.querySelector('rect:not([fill=none])')).fill)];
    return (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
  }));
})()"""

# All that differs between the two UIs for this test. Notebook 7 is built from JupyterLab's own
# components, so the cells, the prompt, the toolbar's execution indicator, the key that runs a
# cell and the widget's output have the same DOM in both; only the page that opens a notebook
# differs. (One behaviour differs too, and the test avoids it rather than listing it: see
# _step_slider.) "package" is the UI's Python package (the test skips without it); "figures" says
# whether LAB_SCREENSHOTS=1 may replace the README's figures (only JupyterLab's pictures are shown).
UIS = {
    "jupyterlab": {"page": "lab/tree", "package": "jupyterlab", "figures": True},
    "notebook7": {"page": "notebooks", "package": "notebook", "figures": False},
}


def _chromium_or_skip(ui: str) -> str:
    """Debian's chromium, or a skip that prints its reason (also when the UI is not installed)."""
    reason = None
    package = UIS[ui]["package"]
    if sync_playwright is None:
        reason = "playwright is not installed: `pip install -e .` installs it (pyproject.toml)"
    elif importlib.util.find_spec(package) is None:
        reason = f"{package} is not installed: `pip install -e .` installs it (pyproject.toml)"
    elif shutil.which("chromium") is None:
        reason = "Debian's chromium is not installed: `make setup-browser` (apt-get install chromium)"
    if reason:
        print(f"[test_browser] skipped: {reason}", file=sys.stderr)
        pytest.skip(reason)
    return shutil.which("chromium")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def jupyter(tmp_path):
    """A Jupyter server (started as JupyterLab; Notebook 7's pages come with it once `notebook`
    is installed) serving a copy of the notebook from a temporary folder (so nothing it writes
    lands in tests/), with its own settings: no news pop-up, no update check. The settings and
    workspaces folders are given by environment, not by LabApp options, because Notebook 7's app
    reads the same variables and both UIs ask about news."""
    root = tmp_path / "notebooks"
    root.mkdir()
    shutil.copy(NOTEBOOK, root)
    settings = tmp_path / "settings"
    notifications = settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    notifications.parent.mkdir(parents=True)
    notifications.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    port, token = _free_port(), secrets.token_hex(16)
    log = (tmp_path / "jupyter.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", "--ip=127.0.0.1", f"--port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}"],
        stdout=log, stderr=subprocess.STDOUT,
        env={**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / "config"), "JUPYTERLAB_SETTINGS_DIR": str(settings),
             "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "workspaces")})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            try:
                urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=5)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"the Jupyter server did not start: see {log.name}") from None
                time.sleep(0.5)
        yield url, token, Path(log.name)
    finally:
        server.terminate()
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def _tree_markup(page) -> str:
    return page.inner_html(TREE)


def _wait_for_redraw(page, before: str) -> None:
    page.wait_for_function("([selector, before]) => document.querySelector(selector).innerHTML !== before",
                           arg=[TREE, before], timeout=DECODE_S * 1000)


def _step_slider(page, selector: str) -> None:
    """Drag the handle of the ipywidgets slider in `selector` one step to the right. By mouse,
    not by arrow key: Notebook 7 listens for keys in the capture phase, so in command mode its
    ArrowRight shortcut (notebook:move-cursor-heading-below-or-expand) takes the key before a
    focused slider handle sees it; JupyterLab listens in the bubbling phase and the slider moves."""
    handle = page.locator(f"{selector} .noUi-handle")
    low, high = (float(handle.get_attribute(f"aria-value{end}")) for end in ("min", "max"))
    assert high > low, f"the slider {selector} has one value only: nothing to step to"
    step = page.locator(f"{selector} .noUi-base").bounding_box()["width"] / (high - low)
    box = handle.bounding_box()
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.move(x, y)
    page.mouse.down()
    page.mouse.move(x + step, y, steps=5)
    page.mouse.up()


def _accept_dialog(page) -> str | None:
    """Accept the dialog that covers the page, if one does, and return its text."""
    dialog = page.locator(".jp-Dialog")
    if dialog.count() == 0:
        return None
    text = " | ".join(line for line in dialog.first.inner_text().splitlines() if line.strip())
    dialog.first.locator(".jp-Dialog-button.jp-mod-accept").first.click()
    print(f"[test_browser] accepted a dialog: {text}", file=sys.stderr)
    return text


def _run_the_code_cell(page, index: int = 0) -> None:
    """Run the notebook's code cell number `index`. A kernel that reports idle a moment before it is connected
    drops the request (the prompt stays `[ ]`), so ask again until the cell is queued or runs.
    Notebook 7 once put a dialog over the page during those tries, which blocks every click: it
    is accepted (its text printed), the way a user would go on, and the run is asked for again."""
    prompt = page.locator(".jp-CodeCell .jp-InputPrompt").nth(index)
    dialogs = []
    for _ in range(RUN_TRIES):
        dialogs.append(_accept_dialog(page))
        page.locator(".jp-CodeCell .cm-content").nth(index).click()
        page.keyboard.press("Control+Enter")  # run it and stay on it
        try:
            page.wait_for_function("(prompt) => !prompt.innerText.includes('[ ]')", arg=prompt.element_handle(),
                                   timeout=RUN_WAIT_S * 1000)
            return
        except PlaywrightTimeout:
            continue
    shown = [text for text in dialogs if text]
    raise AssertionError(f"the kernel never took the cell in {RUN_TRIES} tries; dialogs accepted: {shown}")


@pytest.mark.parametrize("ui", UIS)
def test_the_inspector_draws_and_redraws(ui, jupyter, tmp_path):
    chromium = _chromium_or_skip(ui)
    url, token, server_log = jupyter
    keep = os.environ.get("LAB_SCREENSHOTS") == "1" and UIS[ui]["figures"]
    shots = FIGURES_DIR if keep else tmp_path
    shots.mkdir(exist_ok=True)
    started, shots_taken = time.perf_counter(), []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1100})
            page.goto(f"{url}/{UIS[ui]['page']}/{NOTEBOOK.name}?token={token}")
            page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status=idle]", timeout=KERNEL_START_S * 1000)
            _run_the_code_cell(page)

            # the first cycle: nodes, the accepted path (root to the target's own token) and the text
            try:
                page.wait_for_selector(f"{TREE} svg g.node", timeout=DECODE_S * 1000)
            except PlaywrightTimeout:
                page.screenshot(path=server_log.parent / "no_tree.png")
                output = page.inner_text(".jp-CodeCell")
                raise AssertionError(f"no tree drawn in {ui}; the cell's output: {output!r}; "
                                     f"server log and screenshot in {server_log.parent}") from None
            assert page.locator(f"{TREE} svg g.node").count() >= 2
            assert page.locator(f"{TREE} svg path.edge.path").count() >= 1
            assert page.locator(f"{TREE} svg g.node.root").count() == 1
            assert ("eagle2 at temperature" in page.inner_text(".lab-inspector")
                    and "τ = " in page.inner_text(".lab-text"))
            inspector = page.locator(".lab-inspector")
            inspector.screenshot(path=shots / "inspector_eagle2.png")

            # the slider, dragged one step, shows the next cycle
            before = _tree_markup(page)
            _step_slider(page, ".lab-cycle")
            _wait_for_redraw(page, before)
            assert "cycle 2 of" in page.inner_text(".lab-inspector")
            assert page.locator(f"{TREE} svg path.edge.path").count() >= 1

            # a click on the root selects it: its details come back from the kernel
            before = _tree_markup(page)
            page.click(f"{TREE} g.node[data-node='0']")
            page.wait_for_function("() => document.querySelector('.lab-details').innerText.includes('root')",
                                   timeout=DECODE_S * 1000)
            _wait_for_redraw(page, before)  # the selected node gets a ring
            inspector.screenshot(path=shots / "inspector_cycle.png")

            # another method decodes again and redraws from cycle 1
            before = _tree_markup(page)
            page.select_option(".lab-method select", "sd")
            _wait_for_redraw(page, before)
            page.wait_for_function("() => document.querySelector('.lab-inspector')"
                                   ".innerText.includes('sd at temperature')",
                                   timeout=DECODE_S * 1000)
            assert "cycle 1 of" in page.inner_text(".lab-inspector")
            assert page.locator(f"{TREE} svg g.node").count() >= 2
            assert page.locator(f"{TREE} svg path.edge.path").count() >= 1
            inspector.screenshot(path=shots / "inspector_sd.png")

            # a typed prompt decodes, another method of the loop is chosen, and the four phases step by
            before = _tree_markup(page)
            page.fill(".lab-prompt textarea", "List three facts about the moon.")
            page.click("button.lab-decode")
            _wait_for_redraw(page, before)
            before = _tree_markup(page)
            page.select_option(".lab-method select", "pld")
            _wait_for_redraw(page, before)
            page.wait_for_function("() => document.querySelector('.lab-inspector').innerText.includes('pld at')",
                                   timeout=DECODE_S * 1000)
            for phase in PHASE_ORDER:
                for _ in range(10):  # the drafting levels first, one step each
                    if page.locator(f"{TREE} .lab-phase.{phase}").count():
                        break
                    before = _tree_markup(page)
                    page.click("button.lab-step")
                    _wait_for_redraw(page, before)
                assert page.locator(f"{TREE} .lab-phase.{phase}").count() == 1, phase
                inspector.screenshot(path=shots / f"inspector_{phase}.png")
                shots_taken.append(f"inspector_{phase}.png")
            assert page.locator(f"{TREE} .lab-kept").count() == 1  # the commit names the rows kept

            # the keyboard, while the view has focus: ArrowLeft steps back, ArrowRight on; Escape leaves
            page.focus(TREE)
            before = _tree_markup(page)
            page.keyboard.press("ArrowLeft")
            _wait_for_redraw(page, before)
            assert page.locator(f"{TREE} .lab-phase.verify").count() == 1
            before = _tree_markup(page)
            page.keyboard.press("ArrowRight")
            _wait_for_redraw(page, before)
            assert page.locator(f"{TREE} .lab-phase.commit").count() == 1
            page.keyboard.press("Escape")
            assert not page.evaluate(f"() => document.activeElement.closest('{TREE}') !== null")

            # projector mode: every label of the tree, the summary and the text at 18 px or more, black on tints
            page.click(".lab-view button:text-is('tree')")
            page.wait_for_selector(f"{TREE} svg g.node", timeout=DECODE_S * 1000)
            page.check(".lab-projector input")
            page.wait_for_selector(f"{TREE} svg text[font-size='22']", timeout=DECODE_S * 1000)
            small = page.evaluate(f"() => {SMALL_TEXT}")
            assert not small, f"text under 18 px in projector mode: {small[:5]}"
            assert page.evaluate(f"() => {SMALLEST_CONTRAST}") >= 4.5
            inspector.screenshot(path=shots / "inspector_projector.png")
            shots_taken.append("inspector_projector.png")
            # the view on show saved as SVG and as PNG, by the browser alone
            with page.expect_download() as saved:
                page.click(f"{TREE} button.lab-save-svg")
            svg = Path(saved.value.path()).read_text()
            assert svg.startswith('<svg class="draft-tree"') and 'font-size="22"' in svg
            with page.expect_download() as saved:
                page.click(f"{TREE} button.lab-save-png")
            assert Path(saved.value.path()).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

            # two methods side by side, aligned by output position, each with its target forwards
            _run_the_code_cell(page, 1)
            page.wait_for_selector(".lab-side-by-side .lab-forwards", timeout=DECODE_S * 1000)
            page.wait_for_function("() => document.querySelector('.lab-side-by-side .lab-forwards')"
                                   ".innerText.split('target forwards').length === 3", timeout=DECODE_S * 1000)
            assert page.locator(f".lab-side-by-side {TREE} svg").count() == 2
            forwards = page.inner_text(".lab-side-by-side .lab-forwards")
            _step_slider(page, ".lab-position")
            page.wait_for_function("(before) => document.querySelector('.lab-side-by-side .lab-forwards')"
                                   ".innerText !== before", arg=forwards, timeout=DECODE_S * 1000)
            page.locator(".lab-side-by-side").screenshot(path=shots / "inspector_side_by_side.png")
            shots_taken.append("inspector_side_by_side.png")
        finally:
            browser.close()
    if keep:  # the README shows them: record how they were made, like a notebook's figures
        record("screenshots", "test_browser", {"seconds": round(time.perf_counter() - started, 1),
                                               "figures": ["inspector_eagle2.png", "inspector_cycle.png",
                                                           "inspector_sd.png", *shots_taken]},
               command="LAB_SCREENSHOTS=1 python -m pytest tests/test_browser.py")


def test_an_exported_session_steps_with_the_keyboard_and_no_kernel(tiny, tokenizer, tmp_path):
    """A session saved to one HTML page opens from a file, with no Jupyter server: the arrow keys and
    the buttons step through each cycle's views, the whole tree first, then the four phases."""
    from lab.bench import Setup
    from lab.sampling import Sampling
    from lab.target.load import make_draft
    from lab.viz.inspector import DraftTreeInspector
    from lab.viz.session import export_html
    chromium = _chromium_or_skip("jupyterlab")
    setup = Setup(tiny, make_draft(tiny, 1), tokenizer, Sampling(), 0, 0, 0)
    view = DraftTreeInspector("Name three colours of the sea.", "sd-tree", 1.0, (3, 2, 6), 12, setup=setup)
    page_path = export_html(view, tmp_path / "session.html")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(page_path.as_uri())
            where = lambda: page.inner_text("#where")  # noqa: E731
            assert where().startswith("cycle 1 of") and where().endswith("· tree")
            assert page.locator("#view svg g.node").count() >= 2
            seen = []
            for _ in range(8):
                page.keyboard.press("ArrowRight")
                seen.append(where().rsplit("· ", 1)[1])
            assert seen[0] == "drafting" and seen.index("mask") < seen.index("verify") < seen.index("commit")
            assert where().startswith("cycle 2 of") or seen[-1] == "commit"
            page.click("#back")
            assert where().rsplit("· ", 1)[1] == seen[-2]
        finally:
            browser.close()


def test_a_student_chapter_opens_as_slides(jupyter, tmp_path):
    """jupyterlab-rise presents a chapter from its cells' slide types (set by `make exercises`):
    the slideshow page opens and has a slide per section."""
    chromium = _chromium_or_skip("jupyterlab")
    if importlib.util.find_spec("jupyterlab_rise") is None:
        pytest.skip("jupyterlab-rise is not installed: `pip install -e .` installs it (pyproject.toml)")
    url, token, server_log = jupyter
    chapter = NOTEBOOKS_DIR / "02_rejection_sampling.ipynb"
    shutil.copy(chapter, tmp_path / "notebooks")
    sections = sum(c.metadata.get("slideshow", {}).get("slide_type") == "slide"
                   for c in nbformat.read(chapter, as_version=4).cells)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.goto(f"{url}/rise/{chapter.name}?token={token}")
        try:
            page.wait_for_function(f"document.querySelectorAll('.reveal .slides > section').length >= {sections}",
                                   timeout=120_000)
        except PlaywrightTimeout:
            raise AssertionError(f"no slideshow of {sections} slides appeared; see {server_log}") from None
        finally:
            browser.close()
