"""The cuda target's settings for decode steps, read without a GPU: its pass list and
the Inductor configs lower() passes."""

from __future__ import annotations

import torch

from targets import get_target


def test_cuda_settings_for_decode_steps_need_no_gpu_to_read(tmp_path):
    """The cuda target's recipe for batch-1 decode steps:
    single-row linears become reductions last, after --quantize (--no-fuse keeps them);
    Inductor tunes reductions unless --deterministic; combo kernels only in generating
    builds (shared weights), where they were measured, not with --deterministic, and not in
    programs of dynamic shapes (Inductor's combo kernels refuse a dynamic reduction dim);
    a generating build's sizes read from data hinted as 0 (MVP's positions)."""
    from targets.aoti.passes.row_linears import SingleRowLinearsAsReductions
    from targets.base import LowerOptions
    cuda = get_target("cuda")
    passes = [type(p).__name__ for p in cuda.default_passes(LowerOptions(tmp_path))]
    unfused = cuda.default_passes(LowerOptions(tmp_path, fuse=False))
    assert passes[-1] == SingleRowLinearsAsReductions.__name__
    assert not any(isinstance(p, SingleRowLinearsAsReductions) for p in unfused)
    flags = [(shared, deterministic, dynamic, data) for shared in (False, True)
             for deterministic in (False, True) for dynamic in (False, True)
             for data in (False, True)]
    for shared, deterministic, dynamic, data in flags:
        configs = cuda.inductor_configs(
            LowerOptions(tmp_path, shared_weights=shared, deterministic=deterministic),
            dynamic, data)
        assert configs.get("coordinate_descent_tuning", False) is (not deterministic)
        assert configs.get("combo_kernels", False) is (shared and not deterministic
                                                       and not dynamic)
        # a generating build's values read from tensors are positions: hinted as 0 when
        # Inductor runs kernels at compile time, not 8192 (outside a position table)
        assert configs.get("unbacked_symint_fallback") == (0 if shared and data else None)
    # what lower() passes: a symbolic input dim (a prefill's length); a size read from data
    from runtime.executors.torch_fallback import has_dynamic_inputs
    from targets.aoti.base import has_data_dependent_sizes
    rows = torch.nn.Linear(4, 4)
    x = torch.randn(3, 4)
    fixed = torch.export.export(rows, (x,))
    sized = torch.export.export(rows, (x,), dynamic_shapes=({0: torch.export.Dim.DYNAMIC},))
    assert not has_dynamic_inputs(fixed) and has_dynamic_inputs(sized)

    class FromCacheLength(torch.nn.Module):
        def forward(self, x, start):
            return x[start.item():] * 2
    read = torch.export.export(FromCacheLength(), (x, torch.tensor(1)))
    assert has_data_dependent_sizes(read) and not has_data_dependent_sizes(sized)


def test_plain_builds_fold_written_attention_and_time_attention_kernels(tmp_path):
    """Written-out attention becomes SDPA and each attention call's kernel is timed in
    plain builds; neither with --deterministic (the fold paid only with the timed kernel)
    nor in generating builds (their decode attention is our own kernel)."""
    from targets.base import LowerOptions
    cuda = get_target("cuda")

    def names(**options):
        return [p.name for p in cuda.default_passes(LowerOptions(tmp_path, **options))]
    plain = names()
    assert plain.index("written_attention_as_sdpa") < plain.index("attention_inputs_as_views")
    assert plain.index("attention_inputs_as_views") < plain.index("attention_kernels_by_timing")
    attention = {"written_attention_as_sdpa", "attention_kernels_by_timing"}
    assert not attention & set(names(deterministic=True))
    assert not attention & set(names(shared_weights=True))
    assert "--deterministic" in " ".join(cuda.packaging.nondeterminism(LowerOptions(tmp_path)))
