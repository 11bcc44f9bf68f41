"""A decoder-only generating artifact on a real GPU: the decode step's CUDA graph, and
greedy decoding that enqueues step k + 1 before the host reads token k
(runtime/generation/decode_graph.py). Skipped where no GPU exists (CI); `make test-gpu`."""

from __future__ import annotations

import pytest
import torch

import exporter
import runtime
from runtime.generation.sampling import Sampling
from tests.models import tiny_lm

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

PROMPTS = [[5, 17, 9, 30], list(range(3, 40))]


@pytest.fixture(scope="module")
def gemma_cuda(tmp_path_factory):
    """The tiny Gemma-3-style decoder (sliding-window ring and full layers), cuda fp32:
    (graphs, plain launches)."""
    folder = tmp_path_factory.mktemp("generation-cuda")
    out = folder / "gemma3-cuda.artifact"
    built = exporter.build(f"hf:{tiny_lm.checkpoint(folder / 'tiny-gemma3')}",
                           task="text-generation", target="cuda", max_context=64,
                           prefill_chunk=16, out=out)
    record = built.manifest.validation
    assert record["passed"] and record["tokens_identical"]
    graphs, plain = runtime.load(out), runtime.load(out, cuda_graphs=False)
    assert graphs.generator._graph is not None and plain.generator._graph is None
    return graphs, plain


def test_greedy_ahead_of_the_host_gives_plain_launches_tokens(gemma_cuda):
    graphs, plain = gemma_cuda
    for prompt in PROMPTS:
        want = plain.generate(prompt, 24, stop_at_eos=False).tokens
        streamed = []
        got = graphs.generate(prompt, 24, stop_at_eos=False,
                              stream=lambda token, text: streamed.append(token))
        assert got.tokens == want
        assert [t for t in streamed if t is not None] == want
    # up to the context's end: the budget, not a step past the cache
    long = list(range(3, 62))
    assert graphs.generate(long, 24, stop_at_eos=False).tokens == \
        plain.generate(long, 24, stop_at_eos=False).tokens


def test_a_stop_leaves_the_next_generation_as_it_would_be(gemma_cuda):
    """Stopping at token k leaves step k + 1 enqueued; it writes only a slot that the
    next prompt's prefill writes again."""
    graphs, plain = gemma_cuda
    want = plain.generate(PROMPTS[0], 24, stop_at_eos=False).tokens
    stop = want[5]
    eos = graphs.generator.eos
    graphs.generator.eos = frozenset({stop})
    try:
        result = graphs.generate(PROMPTS[0], 24)
    finally:
        graphs.generator.eos = eos
    assert result.stop_reason == "eos" and result.tokens == want[:want.index(stop)]
    for prompt in reversed(PROMPTS):
        assert graphs.generate(prompt, 24, stop_at_eos=False).tokens == \
            plain.generate(prompt, 24, stop_at_eos=False).tokens


def test_sampling_and_the_stream_take_the_step_by_step_path(gemma_cuda):
    graphs, plain = gemma_cuda
    sampling = Sampling(temperature=0.8, top_k=20, seed=3)
    streamed = []
    got = graphs.generate(PROMPTS[1], 16, sampling=sampling, stop_at_eos=False,
                          stream=lambda token, text: streamed.append(token))
    assert got.tokens == plain.generate(PROMPTS[1], 16, sampling=sampling,
                                        stop_at_eos=False).tokens
    assert [t for t in streamed if t is not None] == got.tokens


def test_an_int8_weight_step_reads_x_codes_and_validates(tmp_path):
    """``Generation.int8_x_codes`` (on for cuda): a tiny llama at int8-weight, its decode
    step's q/k/v, gate/up and head over x's int8 codes (the pass's count in the manifest); the
    build's validation passes and the graph decodes as plain launches do."""
    pytest.importorskip("torchao")
    out = tmp_path / "llama-int8.artifact"
    built = exporter.build(f"hf:{tiny_lm.checkpoint(tmp_path / 'tiny-llama', 'llama')}",
                           task="text-generation", target="cuda", quantize="int8-weight",
                           max_context=64, prefill_chunk=16, out=out)
    assert built.manifest.validation["passed"]
    (rows,) = [p["info"] for p in built.manifest.entry_points["decode"].passes
               if p.get("name") == "row_linears_as_kernels"]
    # q/k/v and gate/up a layer at least (the head too where it is an int8 linear)
    assert rows["int8_x_codes"] >= 2 * tiny_lm.config("llama").num_hidden_layers
    graphs, plain = runtime.load(out), runtime.load(out, cuda_graphs=False)
    for prompt in PROMPTS:
        assert graphs.generate(prompt, 16, stop_at_eos=False).tokens == \
            plain.generate(prompt, 16, stop_at_eos=False).tokens
