"""The order `make test` sends test files out in (tests/schedule.py)."""

from __future__ import annotations

from tests.conftest import ROOT
from tests.schedule import HEAVIEST, heaviest_first


def test_every_file_the_schedule_names_exists_once():
    """A renamed or moved file would drop out of the order silently."""
    assert [path for path in HEAVIEST if not (ROOT / path).is_file()] == []
    assert len(set(HEAVIEST)) == len(HEAVIEST)


def test_listed_files_go_first_and_each_files_tests_keep_their_order():
    class Item:
        def __init__(self, nodeid: str) -> None:
            self.nodeid = nodeid
    second, first = HEAVIEST[1], HEAVIEST[0]
    ids = ["tests/a.py::x", f"{second}::y", "tests/b.py::z", f"{first}::u", f"{first}::v",
           "tests/a.py::w"]
    items = [Item(i) for i in ids]
    heaviest_first(items)
    assert [i.nodeid for i in items] == [f"{first}::u", f"{first}::v", f"{second}::y",
                                         "tests/a.py::x", "tests/b.py::z", "tests/a.py::w"]
