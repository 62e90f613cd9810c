"""The README's screenshots of the playground with the shipped models (SmolLM2, MiniLM): after `make serve`,
    .venv/bin/python docs/playground/screenshots.py [http://127.0.0.1:9000]
opens the page in headless Chromium (tests/browser.py), asks SmolLM2 one question greedily, compares three texts with
MiniLM and shows the status, saving docs/playground/real-{chat,embeddings,status}.png. With an API key set, export it
as HF2TRITON_API_KEY first."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.browser import console_errors, start_chromium  # noqa: E402 - the repository root first


def until(driver, script: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not driver.execute_script(script):
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for: {script}")
        time.sleep(0.1)


def main() -> int:
    base = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:9000"
    out = Path(__file__).parent
    driver = start_chromium()
    try:
        driver.get(f"{base}/playground/")
        key = os.environ.get("HF2TRITON_API_KEY")
        if key:
            until(driver, "return !document.getElementById('login').hidden")
            driver.execute_script("document.getElementById('key').value = arguments[0];", key)
            driver.find_element("css selector", "#login-form button").click()
        until(driver, "return !document.getElementById('tabs').hidden")
        driver.execute_script(
            "document.getElementById('chat-max-tokens').value = '48';"
            "document.getElementById('chat-system').value = 'You are a concise assistant.';"
            "document.getElementById('chat-input').value = 'What is the capital of France? Answer in one sentence.';"
        )
        driver.find_element("id", "chat-send").click()
        until(driver, "const n = document.querySelector('.message.assistant .stats'); return n && n.textContent.includes('finish:');")
        driver.save_screenshot(str(out / "real-chat.png"))
        driver.find_element("css selector", "#tabs button[data-view=embeddings]").click()
        driver.find_element("id", "embeddings-send").click()
        until(driver, "return document.querySelectorAll('#similarity tbody tr').length > 0")
        driver.save_screenshot(str(out / "real-embeddings.png"))
        driver.find_element("css selector", "#tabs button[data-view=status]").click()
        until(driver, "return document.querySelectorAll('#status-models tbody tr').length > 0")
        driver.save_screenshot(str(out / "real-status.png"))
        errors = console_errors(driver)
    finally:
        driver.quit()
    print(f"saved {out}/real-{{chat,embeddings,status}}.png; console errors: {errors or 'none'}")
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
