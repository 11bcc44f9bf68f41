"""Where packaging a large generating artifact spends its time, stage by stage, on the
build's own functions (no compile): the weights made into the shared store
(exporter/builder/shared_weights.py), the staged artifact written for validation, that
artifact read back as the runtime loads it (verify, private copy, safetensors load), and
the final artifact written (from the staged one, as the pipeline does; ``--rewrite``: from
the sources again, as builds did before).

    python bench/package_timing.py --gb 2.2 --dir /tmp/packaging-bench --label HEAD

The tensors are a LLaMA-shaped model's (hidden 2048, 5632, vocabulary 32000; layers
added until ``--gb`` of fp16), random so that no two share a content key; both entry
points read all of them, as a generating build's prefill and decode do. Each partition
gets a ``model.pt2`` of ``--pt2-mb`` random bytes and the artifact a tokenizer.json.
Rows (wall and CPU seconds per stage) are appended to ``--json-out``; ``--profile N``
prints each stage's N heaviest functions (cProfile, cumulative).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from exporter.builder.shared_weights import share_weights  # noqa: E402
from exporter.ship.archive_writer import stage_artifact, write_artifact  # noqa: E402
from runtime.format.archive import ArtifactReader  # noqa: E402
from runtime.format.weights import load_checked  # noqa: E402
from runtime.host.hostinfo import cpu_model  # noqa: E402
from targets.base import Lowered  # noqa: E402

HIDDEN, INTER, VOCAB, KV = 2048, 5632, 32000, 256


def llama_tensors(gigabytes: float) -> dict[str, torch.Tensor]:
    """fp16 tensors of a LLaMA-shaped model, layers added until ``gigabytes``."""
    gen = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float32).to(torch.float16)

    tensors = {"embed_tokens.weight": rand(VOCAB, HIDDEN), "lm_head.weight": rand(VOCAB, HIDDEN),
               "norm.weight": rand(HIDDEN)}
    layer = 0
    while sum(t.numel() * 2 for t in tensors.values()) < gigabytes * 1e9:
        p = f"layers.{layer}."
        tensors.update({p + "qkv.weight": rand(HIDDEN + 2 * KV, HIDDEN),
                        p + "o.weight": rand(HIDDEN, HIDDEN),
                        p + "gate_up.weight": rand(2 * INTER, HIDDEN),
                        p + "down.weight": rand(HIDDEN, INTER),
                        p + "input_norm.weight": rand(HIDDEN), p + "post_norm.weight": rand(HIDDEN)})
        layer += 1
    return tensors


def side_files(folder: Path, pt2_mb: int) -> dict[str, Path]:
    """Each entry point's compiled package (opaque, stored) and the tokenizer (deflated)."""
    files = {}
    for name in ("prefill", "decode"):
        path = folder / name / "model.pt2"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(pt2_mb << 20))
        files[f"partitions/{name}_p0/model.pt2"] = path
    tokenizer = folder / "tokenizer.json"
    tokenizer.write_text(json.dumps({"model": {"vocab": {f"tok{i}": i for i in range(VOCAB)}}}))
    files["generation/tokenizer.json"] = tokenizer
    return files


class Stages:
    """Wall and CPU seconds of each named stage, optionally under cProfile."""

    def __init__(self, profile: int) -> None:
        self.rows, self.profile = [], profile

    def run(self, name: str, fn, *args):
        prof = cProfile.Profile() if self.profile else None
        wall, cpu = time.perf_counter(), time.process_time()
        if prof:
            prof.enable()
        try:
            return fn(*args)
        finally:
            if prof:
                prof.disable()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            self.rows.append({"stage": name, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2)})
            print(f"{name:28s} wall {wall:6.2f} s  cpu {cpu:6.2f} s", flush=True)
            if prof:
                text = io.StringIO()
                pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(self.profile)
                print("\n".join(text.getvalue().splitlines()[6:]), flush=True)


def read_back(path: Path) -> int:
    """What the validation process does to the staged artifact before it runs: verify,
    copy the partitions' entries to a private folder, load the weight shards."""
    with ArtifactReader.open(path) as reader:
        root = reader.extract_private()
        index = reader.manifest["shared_weights"]["entries"]
        return sum(len(load_checked(root / name, index[name], "cpu", where=name))
                   for name in sorted(index))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gb", type=float, default=2.2)
    parser.add_argument("--pt2-mb", type=int, default=16)
    parser.add_argument("--dir", default="/tmp/packaging-bench")
    parser.add_argument("--label", default="")
    parser.add_argument("--json-out", default="")
    parser.add_argument("--profile", type=int, default=0)
    parser.add_argument("--keep", action="store_true", help="leave the files in --dir")
    parser.add_argument("--rewrite", action="store_true",
                        help="write the final artifact from the sources, as builds did before")
    args = parser.parse_args()
    root = Path(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    work = root / "work"
    work.mkdir(parents=True)
    tensors = llama_tensors(args.gb)
    stages = Stages(args.profile)
    try:
        lowered = [Lowered(files={}, meta={}, requirements=None, weights=dict(tensors))
                   for _ in ("prefill", "decode")]
        store, files = stages.run("share weights", share_weights, lowered, work)
        files.update(side_files(work, args.pt2_mb))
        manifest = {"shared_weights": store, "toolchain": {"version": "bench"}}
        staged, out = root / ".model.artifact.validating", root / "model.artifact"
        if args.rewrite:  # before stage_artifact: the final file written from the sources
            stages.run("write staged artifact", write_artifact, staged, manifest, files)
        else:
            kept = stages.run("write staged artifact", stage_artifact, staged, manifest, files)
        stages.run("read back (validation)", read_back, staged)
        manifest["validation"] = {"passed": True}
        if args.rewrite:
            stages.run("write final artifact", write_artifact, out, manifest, files)
        else:
            stages.run("write final artifact", kept.finish, out, manifest)
        staged.unlink()
        size = out.stat().st_size
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    total = {k: round(sum(r[k] for r in stages.rows), 2) for k in ("wall_s", "cpu_s")}
    print(f"{'all':28s} wall {total['wall_s']:6.2f} s  cpu {total['cpu_s']:6.2f} s  "
          f"({size / 1e9:.2f} GB artifact)")
    if args.json_out:
        row = {"label": args.label, "gb": args.gb, "artifact_bytes": size, "stages": stages.rows,
               "total": total, "machine": cpu_model(), "cores": os.cpu_count(),
               "python": platform.python_version(), "torch": torch.__version__,
               "utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime())}
        with open(args.json_out, "a") as fh:
            fh.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
