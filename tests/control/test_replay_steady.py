"""``bench/replay.py --steady-state``'s bin: settling, measured seconds and an unmeasured tail.

The tail keeps the next bin's re-plan, which starts ahead of the daemon bin's end, off the measured
requests: its arrivals must not count as measured, and jigsawd's bin must cover all three parts.
"""

from __future__ import annotations

import asyncio
import random
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import replay  # noqa: E402

NODE = ROOT / "examples" / "h100x4.toml"


def _args(*extra: str, app: str = "ar_assistant") -> list[str]:
    return ["--node", str(NODE), "--app", app, "--bin-seconds", "5", "--time-scale", "20", *extra]


def _split(*extra: str, app: str = "ar_assistant") -> replay.BinSplit:
    args = replay.parse_args(_args(*extra, app=app))
    return replay.bin_split(args, replay.app_slo_ms(args))


def test_the_default_tail_is_half_the_slo_at_the_time_scale_plus_the_lead_allowance() -> None:
    split = _split("--steady-state", "--settle-seconds", "15")
    # ar_assistant's SLO 1550 ms x 20 = 31 s wall; half of it, and 2 s for the controller's lead
    assert split == replay.BinSplit(15.0, 5.0, 17.5)
    assert split.period_s == 37.5
    assert _split("--steady-state", "--settle-seconds", "15", "--tail-seconds", "3").tail_s == 3.0
    assert _split("--steady-state", "--settle-seconds", "15", "--tail-seconds", "0").period_s == 20.0
    assert _split() == replay.BinSplit(0.0, 5.0, 0.0)  # no steady state: every arrival measured


def test_jigsawd_is_started_with_bins_as_long_as_settle_measured_and_tail() -> None:
    args = replay.parse_args(_args("--steady-state", "--settle-seconds", "15", "--tail-seconds", "7.5"))
    cmd = replay.daemon_args(NODE, "ast", replay.bin_split(args, 1550.0), args, 400.0)
    assert cmd[cmd.index("--bin-seconds") + 1] == "27.5"
    plain = replay.parse_args(_args())
    cmd = replay.daemon_args(NODE, "ast", replay.bin_split(plain, 1550.0), plain, 400.0)
    assert cmd[cmd.index("--bin-seconds") + 1] == "5.0"


@pytest.mark.parametrize("extra, message", [
    (("--steady-state", "--tail-seconds", "-1"), "--tail-seconds must be a finite number >= 0, not -1"),
    (("--steady-state", "--tail-seconds", "nan"), "--tail-seconds must be a finite number >= 0, not nan"),
    (("--steady-state", "--settle-seconds", "-2"), "--settle-seconds must be a finite number >= 0, not -2"),
    (("--tail-seconds", "5"), "--tail-seconds needs --steady-state"),
    (("--settle-seconds", "5"), "--settle-seconds needs --steady-state"),
])
def test_a_bad_tail_or_settling_is_refused_before_anything_runs(
        extra: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert replay.main(_args(*extra)) == 2
    assert message in capsys.readouterr().err


def test_only_the_arrivals_between_settling_and_tail_are_measured() -> None:
    split = replay.BinSplit(settle_s=2.0, measured_s=1.0, tail_s=1.5)
    assert not split.measured(1.999) and split.measured(2.0) and split.measured(2.999)
    assert not split.measured(3.0) and not split.measured(4.4)
    assert replay.BinSplit(2.0, 1.0).measured(3.5) is False  # no tail: the period ends at 3 s anyway
    assert split.to_json() == {"settle_s": 2.0, "measured_s": 1.0, "tail_s": 1.5, "daemon_bin_s": 4.5}


class _Server:
    """A model endpoint answering every request 200 at once, on its own loop and thread (the client's
    ``http_json`` blocks its own loop)."""

    def __init__(self) -> None:
        from aiohttp import web
        self.requests = 0
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        app = web.Application()
        app.router.add_get("/v2/models/m", self._model)
        app.router.add_post("/v2/models/m/infer", self._infer)
        self.runner = web.AppRunner(app)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()
        assert self.ready.wait(10)

    async def _model(self, request: object) -> object:
        from aiohttp import web
        return web.json_response({"name": "m", "inputs": [{"name": "x", "datatype": "FP32", "shape": [1]}]})

    async def _infer(self, request: object) -> object:
        from aiohttp import web
        self.requests += 1
        return web.json_response({"outputs": []})

    def _serve(self) -> None:
        from aiohttp import web
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
        self.ready.set()
        self.loop.run_forever()

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def server() -> Iterator[_Server]:
    s = _Server()
    yield s
    s.close()


def test_play_counts_the_tails_arrivals_with_the_settling_not_the_bin(server: _Server) -> None:
    pytest.importorskip("aiohttp")
    split = replay.BinSplit(settle_s=0.1, measured_s=0.15, tail_s=0.2)
    window = [400.0, 200.0]
    results, unmeasured = asyncio.run(replay.play(server.url, "m", window, split, 1.0, 7, lambda k, r: None))
    # the same seed draws the same arrivals: split them by hand
    rng = random.Random(7)
    expected = [replay.poisson_times(rate, split.period_s, rng) for rate in window]
    for r, offs in zip(results, expected):
        assert r.sent == r.answered == sum(1 for t in offs if 0.1 <= t < 0.25) > 0
        assert r.violations == 0
    tail = sum(1 for offs in expected for t in offs if t >= 0.25)
    settle = sum(1 for offs in expected for t in offs if t < 0.1)
    assert tail > 0 and unmeasured.sent == unmeasured.answered == tail + settle
    assert server.requests == sum(len(offs) for offs in expected)
