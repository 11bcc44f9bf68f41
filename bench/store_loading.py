"""How long an artifact's shared weight store takes to load, two ways, in one process:
copied to the private folder and read back from it (the loader's way before the store
streamed), and streamed from the archive into tensors (runtime.memory.shared_weights,
what `runtime.load` does now).

    python bench/store_loading.py [--gib 1.0] [--shards 2] [--rounds 5] [--dir DIR]

The store is random fp16 tensors of 8 MiB in shards, written by the project's own writer
into DIR (default: a scratch folder under the system's temporary folder, removed after).
Each round times both ways in turns (the order flips every round), each on the artifact
opened and verified as `runtime.load` opens it (not timed); the medians and the bytes
each way wrote to disk are printed as one JSON line.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from exporter.ship.archive_writer import write_artifact  # noqa: E402
from runtime.format.archive import ArtifactReader  # noqa: E402
from runtime.format.weights import load_checked, read_index  # noqa: E402
from runtime.memory.shared_weights import SharedWeights, shard_entry  # noqa: E402

TENSOR_ELEMENTS = 4 << 20  # 8 MiB of fp16


def make_store(folder: Path, gib: float, shards: int) -> tuple[Path, dict]:
    from safetensors.torch import save_file
    count = max(1, int(gib * (1 << 30)) // (2 * TENSOR_ELEMENTS) // shards)
    files, indexes = {}, {}
    for shard in range(1, shards + 1):
        tensors = {f"t{shard}_{i}": torch.randn(TENSOR_ELEMENTS, dtype=torch.float16)
                   for i in range(count)}
        path = folder / f"shard{shard}.safetensors"
        save_file(tensors, str(path))
        files[shard_entry(shard)], indexes[shard_entry(shard)] = path, read_index(path)
    artifact = write_artifact(folder / "store.edge", {"toolchain": {"version": "bench"}}, files)
    for path in files.values():
        path.unlink()
    return artifact, indexes


def through_private_copy(reader: ArtifactReader, indexes: dict) -> tuple[int, int]:
    folder = reader.extract_private(sorted(indexes))
    on_disk = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    tensors = {}
    for entry, index in sorted(indexes.items()):
        loaded = load_checked(folder / entry, index, "cpu", where=entry)
        for value in loaded.values():  # touch every page, as placing the weights does
            value.view(torch.int16).sum()
        tensors.update(loaded)
    return len(tensors), on_disk


def streamed(reader: ArtifactReader, indexes: dict) -> tuple[int, int]:
    store = SharedWeights(reader, indexes, where="bench")
    names = {name: name for index in indexes.values() for name in index}
    return len(store.tensors(names, "cpu", partition="bench")), 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="store-loading-", dir=args.dir))
    try:
        artifact, indexes = make_store(folder, args.gib, args.shards)
        ways = {"private copy + load_file": through_private_copy, "streamed": streamed}
        times = {name: [] for name in ways}
        disk = {}
        for round_ in range(args.rounds):
            order = list(ways) if round_ % 2 == 0 else list(reversed(ways))
            for name in order:
                with ArtifactReader.open(artifact) as reader:  # opened and verified, untimed
                    start = time.perf_counter()
                    count, disk[name] = ways[name](reader, indexes)
                    times[name].append(time.perf_counter() - start)
        row = {"bytes": artifact.stat().st_size, "tensors": count, "rounds": args.rounds,
               **{f"{name} s": round(statistics.median(t), 3) for name, t in times.items()},
               **{f"{name} disk bytes": d for name, d in disk.items()}}
        print(json.dumps(row))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
