"""How much of an artifact the reader accepts, and the refusal when a file is past it.

The defaults bound what a hostile file can make the loader read or inflate. A genuine
artifact can be past them too (an fp32 model of about 1B parameters is 4-5 GB, its
ExecuTorch program one entry), so a refusal names the limit, the size and the call that
raises it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    max_archive_bytes: int = 4 << 30
    max_entries: int = 10_000
    max_entry_bytes: int = 2 << 30
    max_manifest_bytes: int = 16 << 20
    max_compression_ratio: float = 200.0  # uncompressed/compressed; entries < 1 MiB are exempt
    # Summed over all entries, checked from the zip directory before anything is inflated:
    # 3,000 entries just under 1 MiB each pass every per-entry check and still make 3 GB.
    max_total_bytes: int = 8 << 30


def over_limit(what: str, size: int, field: str, limit: int,
               also: tuple[str, ...] = ()) -> tuple[str, str]:
    """The problem and the hint of ``what`` (of ``size`` bytes) past ``Limits.<field>``;
    the hint raises ``also`` with it (a file's entries can be as large as the file)."""
    raised = max(-(-size // (1 << 30)), 1)  # the size rounded up to whole GiB
    problem = (f"{what} is {_gib(size)} ({size} bytes), over runtime.load's limit "
               f"Limits.{field} = {_gib(limit)}")
    fields = ", ".join(f"{name}={raised} << 30" for name in (field, *also))
    hint = (f"if you built or trust this file, raise the limit: runtime.load(path, "
            f"limits=runtime.Limits({fields})) (fp32 models of about 1B parameters are this "
            "large); otherwise rebuild the artifact with the exporter")
    return problem, hint


def _gib(size: int) -> str:
    return f"{size / (1 << 30):.2f} GiB" if size >= 1 << 20 else f"{size} bytes"
