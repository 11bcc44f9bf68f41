"""What torch.export captures for each entry point of a generating build: the module,
example inputs (an empty cache: its contents do not change the graph) and the dynamic
lengths (exporter/lm/build.py captures them)."""

from __future__ import annotations

import dataclasses

import torch
from torch.export import Dim

from exporter.lm.seq2seq import ExportableEncoder, ExportableSeq2SeqStep, Source, example_source
from exporter.lm.source import LanguageModel
from exporter.lm.wrapper import ExportableCausalLM
from exporter.model.spec import ModelSpec
from runtime.generation.layout import CacheLayout

EXAMPLE_TOKENS = 8  # the prefill example's length (any in 2..chunk: the dim is dynamic)


def entry_specs(lm: LanguageModel, wrapper: ExportableCausalLM, layout: CacheLayout,
                chunk: int, decode_on_prefill: bool = False,
                next_token: bool = False) -> dict[str, ModelSpec]:
    """What torch.export captures for each entry point: the wrapper, example inputs (an
    empty cache: its contents do not change the graph), and prefill's dynamic length
    (from 1 and no decode entry with ``decode_on_prefill``).
    ``Dim.DYNAMIC`` rather than a named ``Dim``: SDPA's stride arithmetic adds guards a
    named dim refuses as unprovable (min(1024+16T, 2048+32T) == 1024+16T), true for all T;
    and it lets the capture raise a lower bound of 1 to 2 (takes_one_token sees it).
    ``next_token``: the decode step returns its greedy next token too (the target's
    ``Generation.next_token``)."""
    device_dtype = getattr(torch, layout.dtype)
    past = {new_name: torch.zeros(shape, dtype=device_dtype)  # forward's keys: k_0, v_0, ...
            for (_, new_name), shape in zip(layout.names(), layout.shapes())}
    vocab = wrapper.model.get_output_embeddings().weight.shape[0]
    ids = torch.randint(0, vocab, (1, min(EXAMPLE_TOKENS, chunk)),
                        generator=torch.Generator().manual_seed(0))
    tokens = Dim.DYNAMIC(min=1 if decode_on_prefill else 2, max=chunk)
    prefill = ModelSpec(lm.source, wrapper, (ids, torch.arange(ids.shape[1]), past), {},
                        ({1: tokens}, {0: tokens}, {name: None for name in past}),
                        lm.origin_file, lm.notes)
    if decode_on_prefill:
        return {"prefill": prefill}
    decode = one_token(prefill)
    if next_token:
        decode = dataclasses.replace(decode, module=wrapper.with_next_token())
    return {"prefill": prefill, "decode": decode}


def one_token(prefill: ModelSpec) -> ModelSpec:
    """The decode entry: prefill's capture at exactly one token (fixed shapes)."""
    ids, _, *rest = prefill.args
    return dataclasses.replace(prefill, args=(ids[:, :1], torch.arange(1), *rest),
                               dynamic_shapes=None)


def seq2seq_entry_specs(lm: LanguageModel, model: torch.nn.Module, layout: CacheLayout,
                        source: Source, chunk: int, attention: str,
                        decode_on_prefill: bool = False) -> dict[str, ModelSpec]:
    """An encoder-decoder's three entry points (exporter/lm/seq2seq.py): the steps as a
    causal LM's, reading the cross cache (and the source mask of a text encoder) too, and
    ``encode`` over a source of dynamic length (text) or the model's fixed one (speech)."""
    step = ExportableSeq2SeqStep(model, layout, source, attention).eval()
    steps = entry_specs(lm, step, layout, chunk, decode_on_prefill)
    dtype = getattr(torch, layout.dtype)
    example = example_source(model, source, min(EXAMPLE_TOKENS, source.bound))
    if example.is_floating_point():  # speech features, in the build's dtype
        example = example.to(dtype)
    encoder = ExportableEncoder(model, layout, source).eval()
    cross = _encoded_cross_cache(encoder, example, layout)
    mask = torch.ones(1, source.bound, dtype=torch.long) if source.masked else None
    for name, entry in steps.items():
        shapes = entry.dynamic_shapes and (*entry.dynamic_shapes, {k: None for k in cross},
                                           None)
        steps[name] = dataclasses.replace(entry, args=(*entry.args, cross, mask),
                                          dynamic_shapes=shapes)
    length = {1: Dim.DYNAMIC(min=1, max=source.bound)} if source.masked else None
    steps["encode"] = ModelSpec(lm.source, encoder, (example,), {}, (length,),
                                lm.origin_file, lm.notes)
    return steps


def _encoded_cross_cache(encoder: ExportableEncoder, example: torch.Tensor,
                         layout: CacheLayout) -> dict[str, torch.Tensor]:
    """The steps' example cross cache: the example source encoded, in slots of the
    source's bound. Not zeros: the steps' example inputs are what quantization measures
    each layer's error on, and over an all-zero cross cache every cross-attention's
    output projection read zeros and came out exact."""
    dtype = getattr(torch, layout.dtype)
    cross = {new: torch.zeros(shape, dtype=dtype)
             for (_, new), shape in zip(layout.cross_names(), layout.cross_shapes())}
    # where its weights are: a capture before this one (a decode step that failed and
    # fell back to prefill) may have moved the model to the build's device
    device = next(encoder.parameters(), example).device
    with torch.no_grad():
        encoded = encoder(example.to(device))
    for new, value in encoded.items():  # k_0, v_0, ...: the cross inputs' own names
        cross[new][:, :, :value.shape[2]] = value.to(device="cpu", dtype=dtype)
    return cross
