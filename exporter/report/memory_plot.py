"""``exporter inspect --plot FILE.png``: the memory plan drawn from the manifest.

Top: bytes alive at each step of the program's ATen graph, with the planned arena and
the lower bound as lines (where they meet, the plan wastes nothing). Bottom: the arena
itself, each buffer a box from the step that writes it to its last reader, at its
offset, so fragmentation and reuse can be seen.
"""

from __future__ import annotations

from pathlib import Path

from exporter.errors import UserInputError
from runtime.format.manifest import Manifest
from runtime.host.outfiles import written_whole


def live_bytes_per_step(plan: dict) -> list[int]:
    """Bytes of planned activations alive at each step (node) of the ATen graph."""
    buffers = list(plan["offsets"].values())  # [offset, size, start, end]
    last = max((end for *_, end in buffers), default=0)
    return [sum(size for _, size, start, end in buffers if start <= t <= end)
            for t in range(last + 1)]


def plot_memory(manifest: Manifest, out: Path) -> None:
    plan = manifest.memory_plan
    if not plan or not plan.get("offsets"):
        raise UserInputError("the artifact has no memory plan to draw",
                             hint="rebuild it with this exporter (plans are recorded since 0.1)")
    if not out.parent.is_dir():
        raise UserInputError(f"the directory {out.parent} does not exist", where=str(out))
    import matplotlib
    matplotlib.use("Agg")  # files only: no display on build machines
    from matplotlib import pyplot
    from matplotlib.patches import Rectangle

    buffers = list(plan["offsets"].values())  # [offset, size, start, end]
    live = [size / 1e6 for size in live_bytes_per_step(plan)]
    last = len(live) - 1
    steps = range(last + 1)
    fig, (top, bottom) = pyplot.subplots(2, 1, figsize=(10, 7), sharex=True)
    top.step(steps, live, where="post", label="live activations")
    top.axhline(plan["arena_bytes"] / 1e6, color="tab:red", linestyle="--",
                label=f"arena {plan['arena_bytes'] / 1e6:.3f} MB")
    top.axhline(plan["lower_bound_bytes"] / 1e6, color="tab:green", linestyle=":",
                label=f"lower bound {plan['lower_bound_bytes'] / 1e6:.3f} MB")
    top.set_ylabel("MB")
    top.set_title(f"{manifest.source.get('spec', '')} on {manifest.target}: activations at "
                  f"{plan.get('sized_at', 'the example shapes')}")
    top.legend(loc="best")
    for offset, size, start, end in buffers:
        bottom.add_patch(Rectangle((start, offset / 1e6), max(end - start, 0.5), size / 1e6,
                                   alpha=0.6, edgecolor="black", linewidth=0.3))
    bottom.set_xlim(0, last + 1)
    bottom.set_ylim(0, max(plan["arena_bytes"], 1) / 1e6)
    bottom.set_xlabel("step (node of the ATen graph)")
    bottom.set_ylabel("arena offset, MB")
    fig.tight_layout()
    try:
        with written_whole(out, flag="--plot", suffix=".png") as partial:
            fig.savefig(partial, dpi=100)
    finally:
        pyplot.close(fig)
