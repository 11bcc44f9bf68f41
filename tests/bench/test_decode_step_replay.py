"""bench/decode_step_cuda.replay_back_to_back_ms: the decode graph's captured step is
replayed back to back between two events, each window from the same position, and a
replay's share is reported (the GPU's events stood in for by fakes)."""

from bench import decode_step_cuda


class _Captured:
    def __init__(self):
        self.replays = 0

    def replay(self):
        self.replays += 1


class _DecodeGraph:  # runtime.generation.decode_graph.DecodeGraph's calls the tool makes
    def __init__(self):
        self._graph = _Captured()
        self.calls = []

    def __call__(self, token, position):
        self.calls.append((token, position))
        self._graph.replay()


class _Event:
    def __init__(self, enable_timing=False):
        assert enable_timing

    def record(self):
        pass

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return 14.4  # ms for a window


def test_a_window_of_back_to_back_replays_gives_a_replays_share(monkeypatch):
    monkeypatch.setattr(decode_step_cuda.torch.cuda, "Event", _Event)
    graph = _DecodeGraph()
    ms = decode_step_cuda.replay_back_to_back_ms(graph, steps=20, windows=3)
    assert ms == 14.4 / 20
    assert graph.calls == [(5, 140)] * 4  # a warm call, then one before each window
    assert graph._graph.replays == 4 + 3 * 20
