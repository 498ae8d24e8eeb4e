"""A real Prometheus for the tests: Debian's `prometheus`, started on a free
loopback port with its own TSDB and a generated config, scraping the given
targets' /metrics.

    with Prometheus(tmp_path, targets=["127.0.0.1:8080"], rules=[path],
                    scrape_interval="1s") as prom:
        prom.wait_scraped(15)
        rows = prom.query('sum(spillway_requests_total)')

The gateway's /metrics needs no token (gateway/http.c: only /admin/ does);
`bearer_token_file` is there for a gateway that one day guards it.
The process is stopped (and its files live under tmp_path, which pytest
removes) whatever happens inside the block.
"""

import json
import shutil
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from conftest import Proc, free_port, require_tool


class PrometheusError(RuntimeError):
    """Prometheus answered a query with status "error" (or not at all)."""


class Prometheus:
    def __init__(self, tmp_path, targets, rules=(), scrape_interval="1s",
                 bearer_token_file=None, job="spillway-gateway"):
        self.dir = Path(tmp_path) / "prometheus"
        self.targets = list(targets)
        self.rules = [str(Path(r).resolve()) for r in rules]
        self.scrape_interval = scrape_interval
        self.bearer_token_file = bearer_token_file
        self.job = job
        self.proc = None
        self.port = None
        self.base = None

    # ---- config --------------------------------------------------------
    def config_text(self):
        """The generated prometheus.yml (JSON is YAML, so no YAML writer needed)."""
        scrape = {"job_name": self.job, "metrics_path": "/metrics",
                  "scrape_interval": self.scrape_interval,
                  "scrape_timeout": self.scrape_interval,
                  "static_configs": [{"targets": self.targets}]}
        if self.bearer_token_file:
            scrape["authorization"] = {"type": "Bearer",
                                       "credentials_file": str(self.bearer_token_file)}
        cfg = {"global": {"scrape_interval": self.scrape_interval,
                          "evaluation_interval": self.scrape_interval},
               "rule_files": self.rules,
               "scrape_configs": [scrape]}
        return json.dumps(cfg, indent=2)

    # ---- process -------------------------------------------------------
    def __enter__(self):
        exe = require_tool("prometheus")
        self.dir.mkdir(parents=True, exist_ok=True)
        cfg = self.dir / "prometheus.yml"
        cfg.write_text(self.config_text())
        try:
            for _ in range(3):   # the free port may be taken before the bind
                self._start(exe, cfg)
                if self._wait_ready(30):
                    return self
                self._kill()
            raise PrometheusError("prometheus did not become ready:\n" + self.log()[-3000:])
        except BaseException:
            self.stop()
            raise

    def _start(self, exe, cfg):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        tsdb = self.dir / f"tsdb-{self.port}"
        self.proc = Proc([exe, f"--config.file={cfg}", f"--storage.tsdb.path={tsdb}",
                          f"--web.listen-address=127.0.0.1:{self.port}",
                          "--storage.tsdb.retention.time=1h", "--log.level=warn"],
                         self.dir / f"prometheus-{self.port}.log")

    def _wait_ready(self, timeout):
        """True once /-/ready answers 200; False if the process exited."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.proc.alive():
                return False
            try:
                with urllib.request.urlopen(self.base + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return True
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.1)
        return False

    def _kill(self):
        if self.proc:
            self.proc.stop()

    def stop(self):
        """Stops it and removes its TSDBs; the logs stay (conftest reads every
        child's log for sanitizer reports at teardown), under tmp_path."""
        self._kill()
        for tsdb in self.dir.glob("tsdb-*"):
            shutil.rmtree(tsdb, ignore_errors=True)

    def __exit__(self, *exc):
        if exc[0] is not None and self.proc is not None:
            print("prometheus log:\n" + self.log()[-3000:])
        self.stop()
        return False

    def log(self):
        return self.proc.output() if self.proc else ""

    def api(self, path, **params):
        """GET /api/v1/<path>: its "data", or PrometheusError on an error status."""
        url = f"{self.base}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                body = json.loads(r.read())
        except urllib.error.HTTPError as e:   # 400/422 carry the error JSON
            try:
                body = json.loads(e.read())
            except ValueError:
                raise PrometheusError(f"{path}: HTTP {e.code}") from None
        if body.get("status") != "success":
            raise PrometheusError(f"{params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr):
        """Instant query: the list of results (a scalar or string result comes
        back as a one-element list holding its [time, value])."""
        data = self.api("query", query=expr)
        if data["resultType"] in ("scalar", "string"):
            return [data["result"]]
        return data["result"]

    def wait_scraped(self, timeout=15):
        """Until every target has been scraped successfully (up == 1)."""
        deadline = time.monotonic() + timeout
        ups = []
        while time.monotonic() < deadline:
            ups = self.query(f'up{{job="{self.job}"}}')
            good = {r["metric"].get("instance") for r in ups if r["value"][1] == "1"}
            if all(t in good for t in self.targets):
                return ups
            time.sleep(0.2)
        raise PrometheusError(f"targets not scraped within {timeout}s: {ups}\n" + self.log()[-2000:])
