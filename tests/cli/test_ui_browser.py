"""The web page in a real browser: headless Chromium (Debian's `chromium` and `chromium-driver`)
driven by Selenium with the system chromedriver (no browser download).

Skipped when Chromium, its driver or selenium is missing, unless `CMDC_REQUIRE_BROWSER=1`
(`.ci/run` sets it): then they fail. Screenshots go to the test's temporary directory (and to
`$CMDC_UI_SCREENSHOTS`, when set, to refresh docs/ui.png).
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

import cmdc
from cmdc.providers import ExtractiveSummarizer, ScriptedProvider

pytestmark = pytest.mark.browser

CHROMIUM = os.environ.get("CMDC_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("CMDC_CHROMEDRIVER", "/usr/bin/chromedriver")
REQUIRED = os.environ.get("CMDC_REQUIRE_BROWSER", "") not in ("", "0")
HOW = "install them: apt-get install -y chromium chromium-driver; pip install selenium"
HOSTILE = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2"> done'


def _missing() -> str | None:
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        return f"no Chromium at {CHROMIUM} or chromedriver at {CHROMEDRIVER}"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed"
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    why = _missing()
    if why is not None:
        if REQUIRED:
            pytest.fail(f"CMDC_REQUIRE_BROWSER is set but {why}; {HOW}")
        pytest.skip(f"{why}; {HOW}")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager never downloads a browser
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1360,1000"):
        options.add_argument(arg)  # --no-sandbox: CI runs as root
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(what: str, check: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = check()
        except Exception as exc:  # a page swapped under us: look again
            last = exc
            value = None
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what} (last error: {last!r})")


def shoot(driver: Any, tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    driver.save_screenshot(str(path))
    assert path.stat().st_size > 10_000
    extra = os.environ.get("CMDC_UI_SCREENSHOTS")
    if extra:
        Path(extra).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(extra) / name)
    return path


@contextlib.contextmanager
def demo(tmp_path: Path) -> Iterator[str]:
    """`cmdc demo --ui` in a subprocess; yields its page's URL; Ctrl-C ends it. Its agents have
    more turns than a test lasts: the page must see turns start after it is opened (a turn's span
    tree), which a demo whose turns ended first (40 of them, on a loaded machine) never shows."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cmdc",
            "demo",
            "--ui",
            "--plain",
            "--agents",
            "3",
            "--turns",
            "1000",
            "--latency",
            "0.15",
            "--offload-dir",
            str(tmp_path / "journals"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    try:
        url = None
        deadline = time.monotonic() + 60
        while url is None and time.monotonic() < deadline:
            line = lines.get(timeout=60)
            if line.startswith("web page: "):
                url = line.split(": ", 1)[1].strip()
        assert url is not None and re.match(r"http://127\.0\.0\.1:\d+/\?token=", url)
        yield url
    finally:
        proc.send_signal(signal.SIGINT)  # the page may still be open: the demo ends all the same
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError("cmdc demo --ui did not end at Ctrl-C") from None
    rest = []
    while not lines.empty():
        rest.append(lines.get())
    assert code in (0, 1, 130), "".join(rest)  # 130: interrupted before its turns were done
    assert "Traceback" not in "".join(rest)


def test_live_demo_page(browser: Any, tmp_path: Path) -> None:
    """The page loads, the demo's agents update live, a summary opens its journal range,
    search finds a record; screenshots of the agents page and of one agent's timeline."""
    from selenium.webdriver.common.by import By

    with demo(tmp_path) as url:
        browser.get(url)
        assert "token=" not in browser.current_url  # the token moved to a cookie
        wait_for("the demo's 3 agents", lambda: len(browser.find_elements(By.CSS_SELECTOR, "#agents tbody tr")) == 3)
        first = browser.find_element(By.CSS_SELECTOR, "#a-agent-1 td.tokens").text
        wait_for(
            "live updates changing a row",
            lambda: (
                int(browser.execute_script("return Number(document.body.dataset.updates || 0)")) >= 3
                and browser.find_element(By.CSS_SELECTOR, "#a-agent-1 td.tokens").text != first
            ),
        )
        wait_for("the live badge", lambda: browser.find_element(By.ID, "live").text == "live")
        wait_for(
            "two compactions of agent-1",
            lambda: int(browser.find_element(By.CSS_SELECTOR, "#a-agent-1 td.comp").text.replace(",", "")) >= 2,
            timeout=120,
        )
        shoot(browser, tmp_path, "agents.png")

        browser.find_element(By.CSS_SELECTOR, "#a-agent-1 td.name a").click()
        wait_for("the timeline", lambda: browser.find_elements(By.CSS_SELECTOR, "svg#timeline g.compaction"))
        assert browser.find_elements(By.CSS_SELECTOR, "svg#timeline circle.turn")
        # its page open, the agent's next turns are recorded as span trees; the page shows them live
        wait_for("a turn's span tree", lambda: browser.find_elements(By.CSS_SELECTOR, "#turns ul.tree li.span"))
        shoot(browser, tmp_path, "timeline.png")
        browser.execute_script("document.getElementById('context').scrollIntoView()")
        shoot(browser, tmp_path, "context.png")

        def open_range() -> str:
            link = browser.find_element(By.CSS_SELECTOR, "#context a.replaced")
            href = link.get_attribute("href")
            link.click()
            return str(href)

        href = wait_for("a summary's link", open_range)
        wait_for("its journal range", lambda: "/journal?first=" in browser.current_url)
        m = re.search(r"first=(\d+)&last=(\d+)", href)
        assert m is not None
        lo, hi = int(m.group(1)), int(m.group(2))
        head = browser.find_element(By.ID, "journal-head").text
        assert head.startswith(f"records {lo}-{hi}")
        seqs = [el.text for el in browser.find_elements(By.CSS_SELECTOR, "#records .msg .idx")]
        assert seqs == [f"#{n}" for n in range(lo, hi + 1)]

        text = browser.find_element(By.CSS_SELECTOR, "#records .msg pre.text").text
        word = max(re.findall(r"[A-Za-z]{6,}", text), key=len)
        box = browser.find_element(By.CSS_SELECTOR, "#search input[name=q]")
        box.send_keys(word)
        box.submit()
        wait_for("search results", lambda: "match" in browser.find_element(By.ID, "journal-head").text)
        hits = browser.find_elements(By.CSS_SELECTOR, "#records .msg pre.text")
        assert hits and word.lower() in hits[0].text.lower()


class Hostile:
    """A runtime in a thread whose model replies (and tool results) hold markup."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.url: queue.Queue[str] = queue.Queue()
        self.token: trio.lowlevel.TrioToken | None = None
        self.stop = threading.Event()

    async def main(self) -> None:
        @cmdc.tool
        async def fetch(url: str) -> str:
            """Fetch a page."""
            return HOSTILE

        replies = [ScriptedProvider.tool_call("fetch", {"url": HOSTILE}, text=HOSTILE), HOSTILE]
        config = {"compact_trigger": ("tokens", 500), "compact_keep": ("messages", 2)}
        async with cmdc.open_runtime(ui=True, log_events=False, store=str(self.tmp_path / "store")) as rt:
            agent = await rt.spawn(
                "victim",
                ScriptedProvider(replies, cycle=True),
                tools=[fetch],
                config=config,
                summarizer=ExtractiveSummarizer(),
            )
            for i in range(4):
                await agent.prompt(f"{HOSTILE} turn {i} " + "words " * 80)
            self.url.put(rt.ui.url)
            await trio.to_thread.run_sync(self.stop.wait, abandon_on_cancel=True)


def test_hostile_reply_runs_no_script(browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    hostile = Hostile(tmp_path)
    thread = threading.Thread(target=trio.run, args=(hostile.main,), daemon=True)
    thread.start()
    try:
        url = hostile.url.get(timeout=60)
        base = url.split("/?")[0]
        browser.get(url)
        for path in ("/agent/victim", "/agent/victim/journal", "/agent/victim/journal?q=window"):
            browser.get(base + path)
            body = browser.find_element(By.TAG_NAME, "main").text
            assert "<script>window.__pwned=1</script>" in body  # shown as text
            assert 'onerror="window.__pwned=2"' in body
            assert browser.execute_script("return window.__pwned === undefined")
            assert not browser.find_elements(By.CSS_SELECTOR, "main img")
            assert len(browser.find_elements(By.TAG_NAME, "script")) == 1  # the page's own
    finally:
        hostile.stop.set()
        thread.join(timeout=30)
