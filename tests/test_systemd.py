"""The daemon under systemd's notify protocol: the real `decider serve`, started with
NOTIFY_SOCKET on a datagram socket this test owns, and the shipped unit file."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from decider import YesNo
from decider.client import AsyncDeciderClient, DeciderClient, RemoteError
from helpers.daemon import DECIDER, health_status, spawn

ROOT = Path(__file__).parents[1]
WATCHDOG_USEC = 1_000_000  # pings every 0.5 s
TEXT = "I was charged twice, please refund me."


class NotifySocket:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.seen: list[tuple[float, str]] = []

    def receive(self, timeout: float) -> list[str]:
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(4096).decode()
        except TimeoutError:
            return []
        lines = data.split("\n")
        self.seen.extend((time.monotonic(), line) for line in lines)
        return lines

    def wait_for(self, line: str, timeout: float) -> list[str]:
        """Every line received until `line` arrives (inclusive)."""
        got, end = [], time.monotonic() + timeout
        while time.monotonic() < end:
            lines = self.receive(end - time.monotonic())
            got.extend(lines)
            if line in lines:
                return got
        raise AssertionError(f"{line} not received in {timeout}s; got {got}")

    def drain(self, seconds: float) -> list[tuple[float, str]]:
        start, end = len(self.seen), time.monotonic() + seconds
        while time.monotonic() < end:
            self.receive(max(0.01, end - time.monotonic()))
        return self.seen[start:]


def write_config(path: Path, n_ctx: int, extra: str = "") -> Path:
    path.write_text(f"""
[server]
max_queue = 64
max_batch = 4
grace_seconds = 20
engine_call_limit_seconds = 1.5
{extra}
[model]
name = "gemma-3-270m"
n_ctx = {n_ctx}
""")
    return path


@pytest.fixture
def notified(tmp_path, model_path):
    notify = NotifySocket(tmp_path / "notify")
    config = write_config(tmp_path / "decider.toml", 512)
    env = {"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": str(WATCHDOG_USEC)}
    daemon = spawn(tmp_path, "--config", str(config), wait=False, env=env)
    yield daemon, notify, config
    if daemon.proc.poll() is None:
        daemon.proc.kill()
        daemon.proc.wait()


def test_ready_only_once_a_decide_call_can_succeed(notified):
    daemon, notify, _ = notified
    before = notify.wait_for("READY=1", timeout=120)
    assert any(x.startswith("STATUS=loading") for x in before)
    with DeciderClient(daemon.address) as c:  # the very moment READY=1 arrived
        assert 0 <= c.decide(TEXT, [YesNo("Refund?")]).answers[0].p_yes <= 1


def test_a_hung_engine_is_replaced_and_the_watchdog_waits_for_its_replacement(notified):
    """An engine call silent past engine_call_limit_seconds (1.5 s) is a hung engine: its
    request is refused ENGINE_HUNG and the daemon replaces it, pinging on. The pings stop
    only while no engine has served for longer than the limit (here the replacement's
    warm-up hangs 5 s), and resume once it serves."""
    daemon, notify, _ = notified
    notify.wait_for("READY=1", timeout=120)
    pings = [t for t, line in notify.drain(2.0) if line == "WATCHDOG=1"]
    assert len(pings) >= 3
    assert max(b - a for a, b in zip(pings, pings[1:])) < 0.8  # every 0.5 s

    daemon.fault_file.write_text("hang:30")  # the next engine call stalls 30 s
    with ThreadPoolExecutor(1) as pool, DeciderClient(daemon.address, timeout=60) as c:
        t0 = time.monotonic()
        held = pool.submit(c.decide, TEXT, [YesNo("Refund?")])
        while daemon.fault_file.exists():  # until the engine pass takes the fault
            time.sleep(0.01)
        daemon.fault_file.write_text("hang:5")  # for the replacement's warm-up pass
        with pytest.raises(RemoteError) as info:
            held.result()
        killed = time.monotonic()
    assert info.value.reason == "ENGINE_HUNG"
    assert 1.5 < killed - t0 < 4.0
    notify.drain(5.5)
    during = [t for t, line in notify.seen if line == "WATCHDOG=1"
              and killed + 2.0 < t < killed + 5.5]
    assert during == []  # withheld while no engine served past the limit
    while health_status(daemon.address) != "SERVING":
        notify.drain(0.1)
    after = [t for t, line in notify.drain(1.5) if line == "WATCHDOG=1"]
    assert len(after) >= 2  # serving again
    assert "withholding the watchdog" in daemon.log()


def served_n_ctx(address: str) -> int:
    with DeciderClient(address) as c:
        return next(m.n_ctx for m in c.list_models().models if m.loaded)


def test_sighup_reloads_what_changed_and_refuses_a_bad_config(notified):
    daemon, notify, config = notified
    notify.wait_for("READY=1", timeout=120)
    assert served_n_ctx(daemon.address) == 512

    write_config(config, 1024)  # a changed model section: loaded before the old is dropped
    daemon.proc.send_signal(signal.SIGHUP)
    lines = notify.wait_for("READY=1", timeout=120)
    assert "RELOADING=1" in lines and any(x.startswith("MONOTONIC_USEC=") for x in lines)
    assert served_n_ctx(daemon.address) == 1024

    config.write_text("[server]\nmax_batch = 'lots'\n")  # bad: the running config stays
    daemon.proc.send_signal(signal.SIGHUP)
    lines = notify.wait_for("READY=1", timeout=60)
    assert "RELOADING=1" in lines
    assert served_n_ctx(daemon.address) == 1024
    assert "reload refused; the running configuration stays" in daemon.log()
    assert "server.max_batch: must be int" in daemon.log()


def test_sigterm_during_a_burst_answers_every_accepted_request(notified):
    daemon, notify, _ = notified
    notify.wait_for("READY=1", timeout=120)
    daemon.fault_file.write_text("hang:1.5")  # requests pile up behind the first call

    async def burst():
        async with AsyncDeciderClient(daemon.address, timeout=120) as c:
            tasks = [asyncio.create_task(c.decide(TEXT, [YesNo(f"Question {i}?")]))
                     for i in range(12)]
            await asyncio.sleep(0.5)
            daemon.proc.send_signal(signal.SIGTERM)  # while most of them wait
            return await asyncio.gather(*tasks, return_exceptions=True)

    results = asyncio.run(burst())
    assert all(not isinstance(r, Exception) for r in results), results
    assert [r.answers[0].question for r in results] == [f"Question {i}?" for i in range(12)]
    assert daemon.proc.wait(60) == 0
    notify.drain(0.2)
    assert "STOPPING=1" in [line for _, line in notify.seen]


@pytest.mark.parametrize(
    "config, words",
    [
        ("[server]\nmax_queue = 0\n", "server.max_queue: must be positive"),
        ("[sever]\nmax_queue = 1\n", "unknown section [sever]"),
        ("[model]\nn_ctx = 40000\n", "n_ctx must be in [32, 32768]"),
        ("[model]\nname = 'no-such-model'\n", "unknown model 'no-such-model'"),
        ("[server]\nlisten = ['0.0.0.0:50999']\n", "is not loopback"),
    ],
)
def test_a_bad_config_exits_non_zero_before_ready(tmp_path, model_path, config, words):
    notify = NotifySocket(tmp_path / "notify")
    (tmp_path / "bad.toml").write_text(config)
    proc = subprocess.run(
        [*DECIDER, "serve", "--config", str(tmp_path / "bad.toml")],
        capture_output=True, timeout=120,
        env={**os.environ, "NOTIFY_SOCKET": str(notify.path)})
    assert proc.returncode == 2
    assert words in proc.stderr.decode()
    assert "READY=1" not in [line for _, line in notify.drain(0.2)]


@pytest.mark.parametrize(("file", "unit"), [("decider.service", "decider.service"),
                                           ("decider@.service", "decider@gpu1.service")])
def test_the_unit_file_verifies_clean(tmp_path, file, unit):
    """The unit, and the template as the instance gpu1 (a link named for it, as
    `systemctl enable decider@gpu1` makes)."""
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze is not installed (Debian package systemd)")
    text = (ROOT / "deploy" / file).read_text()
    assert "ExecStart=/opt/decider/.venv/bin/decider serve" in text
    # verify checks that ExecStart exists: point it at this checkout's decider
    here = Path(sys.executable).parent / "decider"
    (tmp_path / file).write_text(text.replace("/opt/decider/.venv/bin/decider", str(here)))
    if unit != file:
        (tmp_path / unit).symlink_to(file)
    out = subprocess.run(["systemd-analyze", "verify", str(tmp_path / unit)],
                         capture_output=True, text=True)
    assert (out.returncode, out.stdout, out.stderr) == (0, "", "")
    sec = subprocess.run(["systemd-analyze", "security", "--offline=yes",
                          str(tmp_path / unit)], capture_output=True, text=True)
    score = float(re.search(r"Overall exposure level for \S+: ([\d.]+)", sec.stdout)[1])
    assert score <= 2.0  # docs/deploy.md states the measured 1.9


def test_a_failed_reload_after_an_engine_failure_exits_1(tmp_path, model_path):
    """Untouched logits, then the model cannot be loaded again: exit 1, so that
    Restart=on-failure brings the service back."""
    copy = tmp_path / "model.gguf"
    shutil.copyfile(model_path, copy)
    daemon = spawn(tmp_path, "--model", str(copy), "--n-ctx", "512")
    copy.unlink()  # the reload will find no model file
    daemon.fault_file.write_text("zero-logits")
    with DeciderClient(daemon.address) as c, pytest.raises(RemoteError) as info:
        c.decide(TEXT, [YesNo("Refund?")])
    assert info.value.reason == "ENGINE_RETURNED_NO_LOGITS"
    assert daemon.proc.wait(60) == 1
    assert ("the replacement engine could not load; exiting for the service manager to "
            "restart") in daemon.log()
