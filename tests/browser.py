"""Headless Chromium for the playground's tests: Debian's `chromium` and `chromium-driver` (make test apt-installs them
where it runs as root) driven by selenium; skipped with the reason where any of them is missing."""

from __future__ import annotations

import json
import os
import shutil
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

SCREENSHOTS_ENV = "HF2TRITON_SCREENSHOTS"  # a directory to keep the screenshots in (docs/playground when refreshed)


# Chromium's fake microphone (a beep) granted without asking: the playground's recording path, headless
FAKE_MICROPHONE = ("--use-fake-device-for-media-stream", "--use-fake-ui-for-media-stream")


def start_chromium(*arguments: str) -> Any:
    """Headless Chromium with `arguments` added to its command line."""
    missing = [name for name in ("chromium", "chromedriver") if shutil.which(name) is None]
    try:
        from selenium import webdriver
    except ImportError:
        missing.append("selenium (envs/test.txt)")
    if missing:
        pytest.skip(f"the browser tests need {', '.join(missing)}: `make test` apt-installs chromium and chromium-driver as root")
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1280,860",
                     "--no-first-run", "--disable-extensions", "--disable-background-networking", "--lang=en-US", *arguments):  # fmt: skip
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    return webdriver.Chrome(options=options, service=webdriver.ChromeService(shutil.which("chromedriver")))


def console_errors(driver: Any) -> list[str]:
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def requested_urls(driver: Any) -> list[str]:
    """Every URL the page asked for since the last call (Chromium's performance log)."""
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def foreign(urls: list[str], port: int) -> list[str]:
    return [url for url in urls if urllib.parse.urlsplit(url).netloc != f"127.0.0.1:{port}"]


def screenshot(driver: Any, name: str, fallback: Path) -> Path:
    directory = Path(os.environ.get(SCREENSHOTS_ENV) or fallback)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.png"
    driver.save_screenshot(str(path))
    return path


def wait_for(browser: Any, condition: Any, timeout: float = 60) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(browser, timeout, poll_frequency=0.05).until(lambda _: condition())


def text_of(browser: Any, selector: str) -> str | None:
    return browser.execute_script("const n = document.querySelector(arguments[0]); return n ? n.textContent : null;", selector)


def fill(browser: Any, element_id: str, value: str) -> None:
    browser.execute_script("const n = document.getElementById(arguments[0]); n.value = arguments[1];", element_id, value)
