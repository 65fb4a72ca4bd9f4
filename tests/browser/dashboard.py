"""Drives steward's dashboard in headless Chromium through Selenium (WebDriver).

Usage: python dashboard.py URL_WITH_TOKEN < commands.jsonl

Opens the URL (the token is exchanged for the session cookie, as a person's browser
does), then reads one JSON command per line and prints one JSON line per command:

  {"visit": "/runs", "width": 360}        -> the page as the browser shows it
  {"visit": "/live", "wait_for": "tidy"}  -> once that text shows (streamed pages)
  {"click": "#review-X button[name=approve]", "on": "/review"}
                                           -> visits "on", clicks, waits for the next page
  {"screenshot": "/", "file": "x.png", "width": 1200, "height": 900}

A page is reported as its path, title, visible text, and whether it fits its width
(no horizontal scrolling).
"""

import json
import os
import sys

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait


def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--disable-gpu", "--window-size=1200,900"):
        options.add_argument(arg)
    service = Service(executable_path=os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver"))
    return webdriver.Chrome(options=options, service=service)


def page(driver):
    body = driver.find_element(By.TAG_NAME, "body")
    fits = driver.execute_script(
        "return document.documentElement.scrollWidth <= document.documentElement.clientWidth")
    return {
        "url": driver.current_url,
        "title": driver.title,
        "text": body.text,
        "html": driver.page_source,
        "fits": fits,
    }


def resize(driver, width, height=900):
    driver.set_window_size(width, height)


def main():
    base = sys.argv[1]
    origin = base.split("/?")[0]
    driver = browser()
    try:
        driver.get(base)
        for line in sys.stdin:
            if not line.strip():
                continue
            cmd = json.loads(line)
            try:
                out = run(driver, origin, cmd)
            except WebDriverException as e:
                # Reported, not fatal: the test prints what the browser said.
                out = {"error": type(e).__name__, "message": e.msg or str(e)}
            out["command"] = cmd
            print(json.dumps(out), flush=True)
    finally:
        driver.quit()


def run(driver, origin, cmd):
    resize(driver, cmd.get("width", 1200), cmd.get("height", 900))
    if "visit" in cmd:
        driver.get(origin + cmd["visit"])
        if "wait_for" in cmd:
            WebDriverWait(driver, 30).until(
                lambda d: cmd["wait_for"] in d.find_element(By.TAG_NAME, "body").text)
        return page(driver)
    if "click" in cmd:
        driver.get(origin + cmd["on"])
        # Clickable, not merely present: on a loaded machine the page may still be
        # laying out when the element first exists.
        button = WebDriverWait(driver, 30).until(
            expected_conditions.element_to_be_clickable((By.CSS_SELECTOR, cmd["click"])))
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", button)
        button.click()
        WebDriverWait(driver, 30).until(expected_conditions.staleness_of(button))
        WebDriverWait(driver, 30).until(
            lambda d: d.execute_script("return document.readyState") == "complete")
        return page(driver)
    if "screenshot" in cmd:
        driver.get(origin + cmd["screenshot"])
        driver.save_screenshot(cmd["file"])
        return page(driver)
    return {"error": "unknown command"}


if __name__ == "__main__":
    main()
