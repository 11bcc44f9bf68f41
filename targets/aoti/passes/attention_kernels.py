"""Each attention call's kernel chosen by timing it on this GPU, not by torch's rule.

torch picks one SDPA kernel per call by a fixed order (on Hopper, cuDNN's first). That
suits long rows: at 128-197 tokens cuDNN's kernel, memset included, beat flash and
efficient attention inside whole builds. It does not suit many short ones: Swin's
49-token windows with an additive mask ran 1.6-2.6x faster on efficient attention
(bench/RESULTS.md, session 63). So each distinct call (shapes, strides, dtype, mask,
causal, scale) is timed with each enabled fused kernel and with torch's own choice, as a
CUDA graph of back-to-back calls on random inputs. Where a kernel takes under MARGIN of
torch's choice's time, the program's attention calls are decomposed here, each under its
kernel, so Inductor lowers what was timed. A mask computed from weights alone is timed
with aligned rows: its padding (the kernels want 8-element rows) folds at freezing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch.export import ExportedProgram

from passes.base import PassResult
from targets.aoti.passes.call_timing import faster, graph_replay_ms

aten = torch.ops.aten
_SDPA = aten.scaled_dot_product_attention.default
_FUSED = {"CUDNN_ATTENTION": torch.backends.cuda.cudnn_sdp_enabled,
          "FLASH_ATTENTION": torch.backends.cuda.flash_sdp_enabled,
          "EFFICIENT_ATTENTION": torch.backends.cuda.mem_efficient_sdp_enabled}
_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal")


class AttentionKernelsByTiming:
    name = "attention_kernels_by_timing"
    required = False

    def __init__(self, timer: Callable[[Callable], float] | None = None) -> None:
        self.timer = timer or graph_replay_ms

    def __call__(self, program: ExportedProgram) -> PassResult:
        weights_only = _from_weights_only(program)
        picks, info = {}, {"attention_calls": 0, "kernels": {}}
        for node in program.graph.nodes:
            if node.op != "call_function" or node.target is not _SDPA:
                continue
            info["attention_calls"] += 1
            call = _bound(node.args, node.kwargs)
            key = _key(call)
            if key is None or key in picks or not _timeable(call):
                continue
            picks[key] = self._pick(call, call["attn_mask"] in weights_only)
            info["kernels"][_label(key)] = picks[key] or "torch's own choice"
        chosen = {key: kernel for key, kernel in picks.items() if kernel}
        if not chosen:
            return PassResult(program, modified=False, info=info)
        return PassResult(decomposed(program, chosen), modified=True, info=info)

    def _pick(self, call: dict, aligned_mask: bool) -> str | None:
        """The fused kernel that beats torch's own choice by MARGIN on this call, or None."""
        inputs = _random_inputs(call, aligned_mask)
        with torch.no_grad():
            own = self.timer(lambda: _attention(inputs))
            times = {}
            for kernel in (k for k, enabled in _FUSED.items() if enabled()):
                with _only(kernel):
                    try:
                        _attention(inputs)  # a kernel that cannot take this call raises
                    except RuntimeError:
                        continue
                    times[kernel] = self.timer(lambda: _attention(inputs))
        return faster(own, times)


def decomposed(program: ExportedProgram, chosen: dict) -> ExportedProgram:
    """``program`` with each attention call decomposed as torch decomposes it, under the
    kernel ``chosen`` gives its key (torch's own choice where none)."""
    def decompose(*args, **kwargs):
        kernel = chosen.get(_key(_bound(args, kwargs)))
        with _only(kernel) if kernel else contextlib.nullcontext():
            # torch's own decomposition: the kernel choice, mask padding, the call
            return _SDPA._op_dk(torch._C.DispatchKey.CompositeImplicitAutograd,
                                *args, **kwargs)
    return program.run_decompositions({_SDPA: decompose})


def _bound(args, kwargs) -> dict:
    call = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None,
            "enable_gqa": False}
    call.update(zip(_ARGS, args))
    call.update(kwargs)
    return call


def _val(value):
    """A node's tensor (its meta value) or, in a decomposition, the tensor itself."""
    return value.meta.get("val") if isinstance(value, torch.fx.Node) else value


def _key(call: dict):
    """What the kernel's time depends on and a decomposition can see: shapes, dtypes,
    device, causal, scale; None where a shape is symbolic."""
    tensors = [_val(call[name]) for name in ("query", "key", "value", "attn_mask")]
    if not all(isinstance(t, torch.Tensor) for t in tensors[:3]):
        return None
    shapes = [tuple(t.shape) if isinstance(t, torch.Tensor) else None for t in tensors]
    if not all(isinstance(d, int) for s in shapes if s for d in s):
        return None
    return (*shapes, tensors[0].dtype, tensors[0].device.type, call["is_causal"],
            call["scale"], call["enable_gqa"], call["dropout_p"])


def _timeable(call: dict) -> bool:
    query = _val(call["query"])
    return query.device.type == "cuda" and call["dropout_p"] == 0 and torch.cuda.is_available()


def _label(key) -> str:
    query, keys = key[0], key[1]
    return f"{'x'.join(map(str, query))} keys {keys[-2]}" + (" masked" if key[3] else "")


def _random_inputs(call: dict, aligned_mask: bool) -> dict:
    """Random tensors laid out as the call's (a mask of weights alone with aligned rows)."""
    made = dict(call)
    for name in ("query", "key", "value", "attn_mask"):
        meta = _val(call[name])
        if meta is None:
            continue
        if name == "attn_mask" and aligned_mask:
            row = -meta.shape[-1] % 8 + meta.shape[-1]
            padded = torch.empty(*meta.shape[:-1], row, dtype=meta.dtype, device="cuda")
            made[name] = padded[..., :meta.shape[-1]]
        else:
            made[name] = torch.empty_strided(meta.shape, meta.stride(), dtype=meta.dtype,
                                             device="cuda")
        if made[name].dtype == torch.bool:
            made[name].copy_(torch.rand(meta.shape, device="cuda") > 0.1)
        else:
            made[name].normal_()
    return made


def _attention(call: dict):
    return torch.nn.functional.scaled_dot_product_attention(
        call["query"], call["key"], call["value"], attn_mask=call["attn_mask"],
        dropout_p=call["dropout_p"], is_causal=call["is_causal"], scale=call["scale"],
        enable_gqa=call["enable_gqa"])


def _only(kernel: str):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel([getattr(SDPBackend, kernel)])


def _from_weights_only(program: ExportedProgram) -> set:
    """Nodes no user input reaches: constants once the weights are frozen."""
    inputs = set(program.graph_signature.user_inputs)
    reached = set()
    for node in program.graph.nodes:
        if (node.op == "placeholder" and node.name in inputs) or any(
                n in reached for n in node.all_input_nodes):
            reached.add(node)
    return {n for n in program.graph.nodes if n not in reached}
