"""The decode graph's greedy tail: the next token and position it leaves in the graph's
inputs are what the step's logits say (the first of equal maxima, as torch.argmax)."""

import warnings

import pytest
import torch

from runtime.generation.decode_graph import greedy_tail


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_the_last_rows_first_maximum_becomes_the_token_and_the_position_advances(dtype):
    logits = torch.randn(3, 1000, generator=torch.Generator().manual_seed(0)).to(dtype)
    logits[-1, 17] = logits[-1, 500] = 50.0  # of equal maxima, the first wins
    logits[0, 900] = 100.0  # an earlier row's larger value is not the last row's
    tokens = torch.tensor([5], dtype=torch.long)
    position = torch.tensor([41], dtype=torch.long)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no resize of the graph's input buffer
        greedy_tail(logits, tokens, position)
    assert tokens.tolist() == [17] and position.tolist() == [42]
    assert tokens.shape == (1,) and tokens.dtype == torch.long


def test_a_token_the_step_returned_is_copied_in_and_no_argmax_is_taken():
    """A step that returns its greedy token (its head's kernel took the argmax): that
    token becomes the next input as it is, whatever the logits hold."""
    logits = torch.zeros(1, 1000)
    logits[0, 3] = 1.0
    tokens = torch.tensor([5], dtype=torch.long)
    position = torch.tensor([41], dtype=torch.long)
    greedy_tail(logits, tokens, position, torch.tensor([812]))
    assert tokens.tolist() == [812] and position.tolist() == [42]
