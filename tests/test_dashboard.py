"""The dashboard (GET /dashboard) in a real browser: Debian's chromium,
headless, driven by Selenium with Debian's chromedriver (no browser
download). The page is given the admin token the way an operator gives it
(its form), then must show the pools, a spill after an overflow burst and a
drained worker after a drain, and no request of the page may leave the
gateway's origin. Screenshots go to tests/out/.
"""
import concurrent.futures as cf
import json
from pathlib import Path

import pytest

from conftest import TWO_POOLS, http_get, http_post, require_tool, wait_until

pytestmark = pytest.mark.plain_only

OUT = Path(__file__).resolve().parent / "out"
POLICY = TWO_POOLS + """\
routes:
  - model: "echo"
    target: gpu-pool
    max_concurrency: 2
    priority: primary
  - model: "echo"
    target: cpu-pool
    max_concurrency: 100
    priority: overflow
"""


@pytest.fixture
def browser():
    chromium = require_tool("chromium")
    driver_path = require_tool("chromedriver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--window-size=1280,1000", "--no-first-run", "--disable-extensions",
              "--disable-background-networking", "--disable-component-update"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    d = webdriver.Chrome(service=Service(executable_path=driver_path), options=opts)
    d.set_page_load_timeout(10)
    yield d
    d.quit()


def start(cluster):
    cluster.start_gateway(POLICY)
    cluster.start_echo("gpu-pool", 10, name="gpu-echo")     # 2 in flight stay ~1 s
    cluster.start_echo("cpu-pool", 2000, name="cpu-echo")
    wait_until(lambda: {w["pool"] for w in cluster.workers()} == {"gpu-pool", "cpu-pool"}, 15,
               what="both workers registered")


def open_dashboard(d, cluster, wrong_first=False):
    """Opens the page and types the admin token into its form (a wrong one
    first if asked: the page must ask again)."""
    from selenium.webdriver.common.by import By
    d.get(cluster.base + "/dashboard")
    wait_until(lambda: d.find_element(By.ID, "login").is_displayed(), 5, what="the token form")
    if wrong_first:
        d.find_element(By.ID, "token").send_keys("not-the-token")
        d.find_element(By.CSS_SELECTOR, "#login button").click()
        wait_until(lambda: "refused" in text(d, "login-msg"), 5, what="the wrong token refused")
        assert d.execute_script("return sessionStorage.length") == 0
    token = cluster.admin_headers["Authorization"].split(" ", 1)[1]
    d.find_element(By.ID, "token").send_keys(token)
    d.find_element(By.CSS_SELECTOR, "#login button").click()
    wait_until(lambda: "gpu-pool" in d.find_element(By.ID, "pools").text, 5, what="pools rendered")


def text(d, id_):
    from selenium.webdriver.common.by import By
    return d.find_element(By.ID, id_).text


def assert_same_origin(d, cluster):
    """Every URL the page asked for (resource timing and the DevTools
    network log) is on the gateway's origin."""
    urls = d.execute_script("return performance.getEntries().map(e => e.name)")
    for entry in d.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        if msg.get("method") == "Network.requestWillBeSent":
            urls.append(msg["params"]["request"]["url"])
    urls = [u for u in urls if u.startswith(("http:", "https:", "ws:", "wss:"))]
    assert urls, "no requests recorded"
    foreign = [u for u in urls if not u.startswith(cluster.base + "/")]
    assert not foreign, foreign


def screenshot(d, name):
    OUT.mkdir(exist_ok=True)
    p = OUT / name
    d.save_screenshot(str(p))
    print(f"dashboard screenshot: {p}")


def test_files_headers_and_404(cluster):
    cluster.start_gateway(POLICY)
    import urllib.request
    with urllib.request.urlopen(cluster.base + "/dashboard", timeout=5) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/html")
        assert "default-src 'self'" in r.headers["Content-Security-Policy"]
        assert b"/dashboard/app.js" in r.read()
    for f, ctype in (("app.js", "text/javascript"), ("style.css", "text/css"), ("index.html", "text/html")):
        with urllib.request.urlopen(f"{cluster.base}/dashboard/{f}", timeout=5) as r:
            assert r.headers["Content-Type"].startswith(ctype), f
    for bad in ("/dashboard/nope.js", "/dashboard/../metrics", "/dashboardx"):
        with pytest.raises(urllib.error.HTTPError) as e:
            http_get(cluster.base + bad)
        assert e.value.code == 404, bad
    st, _, _ = http_post(cluster.base + "/dashboard", b"{}")
    assert st == 405


def test_dashboard_pools_spill_and_origin(cluster, browser):
    start(cluster)
    d = browser
    open_dashboard(d, cluster, wrong_first=True)
    assert "Bearer" not in d.current_url and "token" not in d.current_url
    pools = text(d, "pools")
    assert "gpu-pool" in pools and "cpu-pool" in pools
    assert "policy version" in text(d, "policy")
    # An overflow burst: 8 at once on a route of max_concurrency 2.
    body = {"model": "echo", "prompt": "hi", "max_tokens": 10}
    with cf.ThreadPoolExecutor(8) as ex:
        res = list(ex.map(lambda _: http_post(cluster.base + "/v1/completions", body), range(8)))
    assert all(st == 200 for st, _, _ in res)
    spilled = sum(h["X-Spillway-Pool"] == "cpu-pool" for _, h, _ in res)
    assert spilled >= 1
    wait_until(lambda: f"saturated: {spilled} total" in text(d, "overflow-totals"), 5,
               what="the spill on the overflow chart's legend")
    status = json.loads(cluster.admin_get("/admin/status")[1])
    if "routes" in status:       # once /admin/status lists routes (issue 22)
        wait_until(lambda: "echo" in text(d, "routes"), 3, what="the route shown")
    # a policy that fails to load: the page shows the reload error
    cluster.config_path.write_text("pools: [\n")
    st, _, _ = cluster.admin_post("/admin/reload")
    assert st != 200
    if "last_reload_error" in json.loads(cluster.admin_get("/admin/status")[1]):   # ops adds it
        wait_until(lambda: "last reload failed" in text(d, "reload-error"), 5, what="the reload error shown")
    screenshot(d, "dashboard.png")
    d.set_window_size(390, 844)
    wait_until(lambda: d.execute_script("return document.documentElement.scrollWidth <= window.innerWidth + 1"),
               3, what="no page-wide horizontal scroll at phone width")
    screenshot(d, "dashboard-phone.png")
    assert_same_origin(d, cluster)
    # once connected, at most one status poll a second (the first two were
    # the token submissions, wrong then right)
    starts = d.execute_script("return performance.getEntriesByType('resource')"
                              ".filter(e => e.name.endsWith('/admin/status')).map(e => e.startTime)")
    gaps = [b - a for a, b in zip(starts[1:], starts[2:])]
    assert gaps and min(gaps) >= 950, starts


def test_dashboard_shows_drained_worker(cluster, request):
    start(cluster)
    wid = next(w["id"] for w in cluster.workers() if w["pool"] == "gpu-pool")
    st, _, b = cluster.admin_post(f"/admin/workers/{wid}/drain", {"reason": "maintenance"})
    assert st == 200, b
    st, _, b = cluster.admin_post("/admin/pools/cpu-pool/cordon", {"reason": "rack move"})
    assert st == 200, b
    d = request.getfixturevalue("browser")
    open_dashboard(d, cluster)
    from selenium.webdriver.common.by import By
    def drained_row():
        for tr in d.find_elements(By.CSS_SELECTOR, "#workers tr"):
            if wid in tr.text:
                return "drained" in tr.text
        return False
    wait_until(drained_row, 5, what="the drained worker shown")
    pool = d.find_element(By.CSS_SELECTOR, '#pools tr[data-pool="cpu-pool"]')
    assert "cordoned: rack move" in pool.text, pool.text
    actions = d.find_element(By.ID, "actions").text
    assert "maintenance" in actions and "rack move" in actions, actions
    screenshot(d, "dashboard-drained.png")
    assert_same_origin(d, cluster)
