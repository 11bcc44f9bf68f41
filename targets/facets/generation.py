"""How a ``--task text-generation`` build reaches a target (exporter/lm/)."""

from __future__ import annotations

from dataclasses import dataclass

from targets.options import LowerOptions

STEP_ATTENTION = ("grouped", "fused", "sdpa")  # Generation.step_attention's values


@dataclass(frozen=True)
class Generation:
    # how a generating step's attention reaches this target (exporter/lm/attention.py):
    # "grouped": the cache read in place by plain matmuls (no repeated heads, no concat);
    # "fused": full-attention layers as runtime/generation/attention_op.py's op, which
    # the target lowers to one kernel; "sdpa": one SDPA call over concat(past, new) with
    # the query heads grouped by its enable_gqa (GPU attention kernels)
    step_attention: str = "grouped"
    # A generating build's one-token step is its prefill program (a length of 1 to the
    # chunk) rather than a program of its own: where a second program would cost a second
    # copy of the weights at run time and the fixed length buys nothing measurable
    # (exporter/lm/build.py, onnx).
    decode_on_prefill: bool = False
    # The decode step also returns its greedy next token (runtime/generation/layout.py's
    # NEXT_TOKEN), which the runtime's decode graph feeds back in place of an argmax of
    # its own: where the target takes it inside the head's kernel (cuda).
    next_token: bool = False
    # The decode step's attention stores its new keys and values in the cache buffers it
    # reads (at slot position % slots), and the partition names those outputs stored, so
    # the runtime's cache write leaves them: where the target's attention kernel can (cuda).
    store_rows: bool = False
    # Each decode layer's attention and o's product (+ residual) as one launch, o's rows
    # spinning on a flag the attention's joins count on (targets/aoti/passes/
    # attention_o.py): where the target's kernels can (cuda). With store_rows too, that
    # launch stores the rows (decode_attention_o_store).
    attention_o: bool = False
    # With next_token, the head's token kernel also writes the token into the decode
    # step's own input ids and adds one to its positions, in place (the next step's
    # inputs), so the runtime's decode graph copies and adds nothing after the step
    # (targets/aoti/passes/decode_argmax.py): where the target's token kernel can (cuda).
    advance_inputs: bool = False
    # next_token's head kernel and attention_o's launch over int4 rows too (int4-weight);
    # off, an int4 build keeps torch's argmax and the attention and o as two launches
    # (a width of its own: its kernels switch on only where a target timed them)
    int4_fused: bool = False
    # int8-weight decode products with the norm folded (q/k/v, gate/up, the head) read x as int8
    # codes in blocks of 32 columns, four products a dp4a (targets/aoti/passes/
    # decode_kernels.py): activations quantized as llama.cpp's GPU kernels quantize them,
    # where the target's kernels can (cuda); off, x stays float
    int8_x_codes: bool = False

    def __post_init__(self) -> None:
        if self.step_attention not in STEP_ATTENTION:  # a target's own declaration
            raise ValueError(f"step_attention {self.step_attention!r} is not one of "
                             f"{', '.join(STEP_ATTENTION)}")

    def shares_weights(self, options: LowerOptions) -> bool:
        """Whether partitions built with these options can take their weights from the
        artifact's one shared copy (``LowerOptions.shared_weights``), as a generating
        artifact's two entry points want; False where the lowering must own them."""
        return True
