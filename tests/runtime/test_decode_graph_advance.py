"""A decode step that feeds its greedy token and next position back into its own inputs
(the cuda target's ``Generation.advance_inputs``): the decode graph sees it in its
warm-up and then neither copies nor adds, and greedy decoding gives the tokens a step
that leaves its inputs alone gives (runtime/generation/decode_graph.py)."""

import pytest
import torch

from runtime.generation.decode_graph import DecodeGraph, _advances

VOCAB = 97


class _Step:
    """A stand-in generator: the logits depend on the token and the position, as a
    decode step's do; ``advances``: the step writes its token and position + 1 back."""

    max_context = 64

    def __init__(self, advances: bool) -> None:
        self.advances = advances
        generator = torch.Generator().manual_seed(0)
        self.table = torch.randn(VOCAB, VOCAB, generator=generator).cuda()
        self.turn = torch.randn(self.max_context + 1, VOCAB, generator=generator).cuda()

    def run_step(self, tokens, position):
        return self.run_step_token(tokens, position)[0]

    def run_step_token(self, tokens, position):
        logits = (self.table[tokens.reshape(-1)] + self.turn[position]).reshape(1, VOCAB)
        token = torch.argmax(logits, -1)
        if self.advances:
            tokens.copy_(token.reshape(tokens.shape))
            position.add_(1)
        return logits, token

    def chain(self, token: int, position: int, count: int) -> list[int]:
        out = []
        for p in range(position, position + count):
            logits = self.table[token] + self.turn[p]
            token = int(logits.argmax())
            out.append(token)
        return out


def test_the_warm_up_tells_a_step_that_feeds_its_inputs_back():
    token = torch.tensor([42])
    assert not _advances(torch.tensor([0]), torch.tensor([0]), token)
    assert not _advances(torch.tensor([0]), torch.tensor([0]), None)
    assert _advances(torch.tensor([[42]]), torch.tensor([1]), token)


@pytest.mark.parametrize("tokens,position,token", [
    ([0], [1], [42]),  # the position advanced, the token not written
    ([42], [2], [42]),  # advanced twice
    ([42], [1], None),  # no token returned
])
def test_a_step_that_changes_its_inputs_otherwise_is_refused(tokens, position, token):
    with pytest.raises(RuntimeError, match="changed its own inputs"):
        _advances(torch.tensor(tokens), torch.tensor(position),
                  None if token is None else torch.tensor(token))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("advances", [False, True])
def test_greedy_tokens_are_the_same_whoever_advances_the_inputs(advances):
    step = _Step(advances)
    graph = DecodeGraph(step, torch.device("cuda"))
    assert graph._advances is advances
    want = step.chain(5, 3, 20)
    assert list(graph.greedy(5, 3, 20)) == want
    assert list(graph.greedy(want[-1], 23, 10)) == step.chain(want[-1], 23, 10)
    logits = graph(7, 11)  # one step from the host's token and position
    torch.testing.assert_close(logits, (step.table[7] + step.turn[11]).reshape(1, VOCAB))
