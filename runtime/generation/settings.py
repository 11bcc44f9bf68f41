"""A generating artifact's ``manifest.generation`` checked against its programs before any
cache is allocated (its fields were typed and bounded when the manifest was read:
runtime/generation/section.py).

The section is data from the artifact, so a hostile or broken one must fail here, as an
ArtifactError that names the field, and not later as a ``range()`` step of 0, an embedding
read past its table (an eos or forced id outside the vocabulary is fed back as the next
token), or a 128 GB ``torch.zeros``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from runtime.errors import ArtifactError
from runtime.generation.layout import INPUT_IDS, LOGITS
from runtime.generation.section import GenerationSection

_HINT = "rebuild the artifact with `exporter build`"


@dataclass(frozen=True)
class GenerationSettings:
    """The manifest's generation section, checked against the programs, with what the
    programs and this machine add to it."""

    section: GenerationSection
    vocab: int  # the steps' logits' last dim
    device: torch.device  # where the cache lives

    layout = property(lambda self: self.section.cache)
    max_context = property(lambda self: self.section.max_context)
    prefill_chunk = property(lambda self: self.section.prefill_chunk)
    eos = property(lambda self: self.section.eos)
    source = property(lambda self: self.section.source)  # an encoder-decoder's encoder input
    decoder_start = property(lambda self: self.section.decoder_start)
    config = property(lambda self: self.section.generation_config)  # the checkpoint's

    @classmethod
    def read(cls, program) -> "GenerationSettings":
        """The settings of ``program`` (the prefill program of a generating artifact),
        each checked against what its entry points take."""
        where = program.source
        section = program.manifest.generation
        try:
            vocab = _vocabulary(program.manifest.signature)
        except ValueError as exc:
            raise ArtifactError(f"the generation section does not fit the prefill program "
                                f"({exc})", where=where, hint=_HINT) from exc
        settings = cls(section=section, vocab=vocab, device=step_device(program))
        settings._check(program, where)
        return settings

    def _check(self, program, where: str) -> None:
        problems = _context_problems(self) + _id_problems(self)
        steps = [program, *(p for name, p in program.entry_points.items() if name != "encode")]
        problems += _chunk_problems(self, program)
        problems += [p for step in steps for p in _cache_input_problems(self, step)]
        if problems:
            raise ArtifactError("the generation section contradicts the artifact's programs",
                                where=where, details=problems[:10], hint=_HINT)
        _check_cache_fits(self, where)

    def dtype(self) -> torch.dtype:
        return getattr(torch, self.layout.dtype)

    def cache_bytes(self) -> int:
        return self.layout.nbytes(torch.empty((), dtype=self.dtype()).element_size())


def _config_ids(config: dict) -> list[tuple[str, list]]:
    """The ids the config makes the generator feed to the model."""
    named = []
    for key in ("forced_bos_token_id", "forced_eos_token_id", "no_timestamps_token_id"):
        value = config.get(key)
        value = value[0] if isinstance(value, (list, tuple)) and value else value
        if isinstance(value, int):
            named.append((f"generation_config.{key}", [value]))
    for key in ("lang_to_id", "task_to_id"):
        named.append((f"generation_config.{key}", list((config.get(key) or {}).values())))
    named.append(("generation_config.forced_decoder_ids",
                  [t for _, t in config.get("forced_decoder_ids") or [] if t is not None]))
    return named


def _vocabulary(signature) -> int:
    logits = next((t for t in signature.outputs if t.name == LOGITS), None)
    if logits is None or not logits.shape or logits.shape[-1].size is None:
        raise ValueError("the prefill program has no logits output of a fixed vocabulary")
    return logits.shape[-1].size


def _context_problems(s: GenerationSettings) -> list[str]:
    """Every position up to max_context must keep its slot: a full layer needs a slot per
    position, a sliding one its window's (a smaller ring overwrites keys still seen)."""
    problems = []
    for index, layer in enumerate(s.layout.layers):
        needed = s.max_context if layer.window is None else min(layer.window, s.max_context)
        if layer.slots < needed:
            problems.append(f"max_context is {s.max_context}, and cache layer {index} holds "
                            f"{layer.slots} slots (it needs {needed})")
    if s.layout.batch != 1:
        problems.append(f"cache.batch is {s.layout.batch}; generation runs a batch of 1")
    if not isinstance(getattr(torch, s.layout.dtype, None), torch.dtype):
        problems.append(f"cache.dtype {s.layout.dtype!r:.40} is not a torch dtype")
    return problems


def _id_problems(s: GenerationSettings) -> list[str]:
    """Ids the generator feeds to the model or compares with its tokens."""
    named = [("eos_token_ids", sorted(s.eos)), ("decoder_start_token_ids", s.decoder_start),
             *_config_ids(s.config)]
    problems = []
    for what, ids in named:
        bad = [t for t in ids if not isinstance(t, int) or not 0 <= t < s.vocab]
        if bad:
            problems.append(f"{what} holds {bad[:5]!r:.80}, outside the vocabulary of "
                            f"{s.vocab}")
    return problems


def _chunk_problems(s: GenerationSettings, program) -> list[str]:
    """A full chunk must be a length the prefill program takes."""
    if s.prefill_chunk < 2:
        return [f"prefill_chunk is {s.prefill_chunk}; a prefill chunk holds 2 tokens or more"]
    ids = next((t for t in program.manifest.signature.inputs if t.name == INPUT_IDS), None)
    if ids is None or len(ids.shape) != 2:
        return ["the prefill program takes no input_ids of shape [1, T]"]
    length = ids.shape[1]
    low, high = (length.size, length.size) if not length.is_dynamic else (length.min or 1,
                                                                          length.max)
    if high is not None and s.prefill_chunk > high or s.prefill_chunk < low:
        return [f"prefill_chunk is {s.prefill_chunk}, and the prefill program takes "
                f"{low} to {high} tokens"]
    return []


def _cache_input_problems(s: GenerationSettings, step) -> list[str]:
    """Each cache buffer as the runtime allocates it must be what the step takes."""
    names = s.layout.names() + s.layout.cross_names()
    shapes = dict(zip((past for past, _ in names), s.layout.shapes() + s.layout.cross_shapes()))
    problems = []
    for spec in step.manifest.signature.inputs:
        shape = shapes.get(spec.name)
        if shape is None:
            continue
        given = [d.size for d in spec.shape]
        if given != list(shape) or spec.dtype != s.layout.dtype:
            problems.append(f"cache buffer {spec.name} would be {s.layout.dtype}{list(shape)}, "
                            f"and the program takes {spec.dtype}{given}")
    return problems


def _check_cache_fits(s: GenerationSettings, where: str) -> None:
    """The cache is allocated whole: refused when it is larger than the memory it would
    live in, before ``torch.zeros`` tries."""
    total = memory_of(s.device)
    nbytes = s.cache_bytes()
    if total is not None and nbytes > total:
        place = "GPU memory" if s.device.type == "cuda" else "memory"
        raise ArtifactError(f"the generation section's cache takes {nbytes / 2**30:.1f} GiB "
                            f"({len(s.layout.layers)} layers, max_context {s.max_context}), "
                            f"more than this machine's {total / 2**30:.1f} GiB of {place}",
                            where=where, hint="rebuild with a smaller --max-context, or run "
                                              "it on a larger machine")


def memory_of(device: torch.device) -> int | None:
    """The bytes of the memory ``device`` has (physical memory for the CPU)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device.index or 0).total_memory
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def step_device(program) -> torch.device:
    """Where the cache lives: with the partitions that read it (cuda if any does)."""
    step = program.entry_points.get("decode") or program
    devices = {p.device for p in step.manifest.partitions}
    return torch.device("cuda" if "cuda" in devices else "cpu")
