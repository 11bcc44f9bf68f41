"""The cpu choice's timing on a loaded machine (targets/aoti/timing.py): stalled turns (an
OpenMP team waiting for a descheduled thread: every call 10-1,000x its usual time) are
left out and re-timed, so they cannot flip the choice; a machine that is slower for a
while, or a candidate that is slower throughout, is not a stall. The candidates here run
on a fake clock that each call advances: the rounds are the real function's."""

from __future__ import annotations

import pytest

from targets.aoti import timing


class _LoadedMachine:
    """A clock, and candidates whose calls advance it by their steady time, by
    ``stalled_s`` while the clock is inside one of their ``stalls`` spans, times ``slow``
    inside a ``slow_spans`` span (the whole machine busier)."""

    def __init__(self, steady: dict[str, float], stalls: dict | None = None,
                 stalled_s: float = 0.1, slow_spans=(), slow: float = 1.0) -> None:
        self.now = 0.0
        self.stalls, self.stalled_s = stalls or {}, stalled_s
        self.slow_spans, self.slow = slow_spans, slow
        self.runs = {name: self._run(name, s) for name, s in steady.items()}

    def clock(self) -> float:
        return self.now

    def _run(self, name: str, steady_s: float):
        def run(inputs):
            inside = lambda spans: any(a <= self.now < b for a, b in spans)  # noqa: E731
            if inside(self.stalls.get(name, ())):
                self.now += self.stalled_s
            else:
                self.now += steady_s * (self.slow if inside(self.slow_spans) else 1.0)
        return run

    def timed(self) -> dict[str, dict]:
        return timing.summarized(timing.interleaved(self.runs, [], clock=self.clock))


def _kept(figures: dict[str, dict]) -> str:
    return min(figures, key=lambda name: figures[name]["round_share"])


def test_stalled_rounds_are_left_out_of_the_shares():
    """aoti stalled in four of seven rounds (as albert did on a loaded 2-core box) loses by
    a median of rounds; left out, its three clean rounds say it is the faster."""
    aoti = [100.0, 104.0, 98.0, 101.0, 1.0, 1.0, 1.0]
    onnx = [1.2] * 7
    assert timing.stalled_rounds({"aoti": aoti, "onnx": onnx}) == {0, 1, 2, 3}
    shares = timing.round_shares({"aoti": aoti, "onnx": onnx})
    assert shares["aoti"] < 1.0 < shares["onnx"]


@pytest.mark.parametrize("stall_s", [0.0, 0.6, 1.5, 3.0, 4.5, 8.0])
def test_a_stall_does_not_flip_the_choice_however_many_rounds_it_spans(stall_s):
    """aoti at 1.0 ms against onnx's 1.2, stalled at 100 ms a call from the start for
    ``stall_s`` of the clock (from none to all of the first seven rounds and more, up
    to about half of ``MAX_ROUNDS``): aoti is kept, the stalled rounds re-timed and named."""
    machine = _LoadedMachine({"aoti": 1e-3, "onnx": 1.2e-3}, {"aoti": [(0.0, stall_s)]})
    figures = machine.timed()
    assert _kept(figures) == "aoti"
    stalled = figures["aoti"]["stalled_rounds"]
    rounds = len(figures["aoti"]["turn_ms"])
    assert rounds - len(stalled) >= min(timing.CLEAN_ROUNDS, timing.ROUNDS)
    if stall_s == 0.0:
        assert stalled == [] and rounds == timing.ROUNDS, "no stall, no extra round"
    else:
        assert stalled and stalled[0] == 0 and rounds <= timing.MAX_ROUNDS


def test_a_stalled_turn_ends_early_rather_than_running_its_calls_out():
    """A turn sized for 1 ms calls (250 of them) that stalls at 100 ms a call stops after
    about twice ``ROUND_S``, not after 25 s."""
    machine = _LoadedMachine({"aoti": 1e-3, "onnx": 1.2e-3}, {"aoti": [(1.0, 1.6)]})
    turns = timing.interleaved(machine.runs, [], clock=machine.clock)
    longest = max(sum(turn) for turn in turns["aoti"])
    assert longest < 2 * timing.ROUND_S + machine.stalled_s + 1e-9


def test_a_machine_slower_for_a_while_is_no_stall():
    """The whole machine 2x slower through part of the rounds (a neighbour's build):
    every round counts, no round is added, and the faster candidate is kept."""
    machine = _LoadedMachine({"aoti": 1e-3, "onnx": 1.2e-3}, slow_spans=[(0.5, 2.5)],
                             slow=2.0)
    figures = machine.timed()
    assert figures["aoti"]["stalled_rounds"] == []
    assert len(figures["onnx"]["turn_ms"]) == timing.ROUNDS
    assert _kept(figures) == "aoti"
    assert figures["aoti"]["round_share"] == pytest.approx((1 / 1.2) ** 0.5, rel=1e-3)


def test_a_candidate_slower_throughout_is_no_stall_and_loses():
    """5x slower in every round: it could be stalled throughout, so the rounds go on to
    ``MAX_ROUNDS``, and it loses. Within 3x, the usual seven rounds."""
    figures = _LoadedMachine({"aoti": 5e-3, "onnx": 1e-3}).timed()
    assert figures["aoti"]["stalled_rounds"] == [] and _kept(figures) == "onnx"
    assert len(figures["aoti"]["turn_ms"]) == timing.MAX_ROUNDS
    figures = _LoadedMachine({"aoti": 2.5e-3, "onnx": 1e-3}).timed()
    assert _kept(figures) == "onnx" and len(figures["aoti"]["turn_ms"]) == timing.ROUNDS


def test_rounds_stop_at_the_most_allowed_and_the_fastest_turns_decide_when_all_stalled():
    """onnx stalls from its second round on, for good: the rounds stop at ``MAX_ROUNDS``;
    with every round but the first stalled, the first one's turns decide."""
    machine = _LoadedMachine({"aoti": 1e-3, "onnx": 1.2e-3}, {"onnx": [(0.3, 1e9)]})
    figures = machine.timed()
    assert len(figures["aoti"]["turn_ms"]) == timing.MAX_ROUNDS
    assert _kept(figures) == "aoti"
    everywhere = timing.round_shares({"aoti": [50.0, 1.0, 50.0], "onnx": [1.2, 60.0, 60.0]})
    assert everywhere["aoti"] == pytest.approx((1 / 1.2) ** 0.5), "each one's fastest turn"


def test_one_candidate_alone_is_timed_for_the_usual_rounds_however_it_stalls():
    machine = _LoadedMachine({"onnx": 1e-3}, {"onnx": [(0.0, 2.0)]})
    figures = machine.timed()
    assert len(figures["onnx"]["turn_ms"]) == timing.ROUNDS
    assert "round_share" not in figures["onnx"]


def test_when_every_candidate_runs_wrong_each_is_dropped_with_why(tmp_path, monkeypatch):
    """The timing process checks each candidate against the partition's outputs first;
    with none left it times nothing and says why each went, instead of failing."""
    import json

    import torch

    import runtime.executors
    from runtime.host.tensorio import save_tensors
    save_tensors(tmp_path / "inputs.safetensors", {"0": torch.ones(3)})
    save_tensors(tmp_path / "reference.safetensors", {"0": torch.ones(3)})
    (tmp_path / "job.json").write_text(json.dumps(
        {"onnx": {"backend": "onnxruntime", "meta": {}, "files": [], "dir": str(tmp_path)}}))
    monkeypatch.setattr(runtime.executors, "create_executor",
                        lambda *a, **k: lambda inputs: [torch.zeros(3)])
    timing.main(tmp_path)
    figures = json.loads((tmp_path / "figures.json").read_text())
    onnx = figures["candidates"]["onnx"]
    assert set(onnx) == {"dropped"} and onnx["dropped"].startswith("failed validation")
