"""No two modules share a name for different things: a reader who meets ``backend.py`` or
``job.py`` in a traceback or a search should know which one it is. A name may repeat only for
one concern across the format's layers: the records (``format/schema/X``), their rules
(``format/schema/rules/X``) and the codec that turns torch objects into them (``codec/X``)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ONE_CONCERN = {"reproarchive/format/schema", "reproarchive/format/schema/rules", "reproarchive/codec"}


def test_each_module_name_names_one_thing():
    folders = defaultdict(set)
    for path in [*ROOT.joinpath("reproarchive").rglob("*.py"), *ROOT.joinpath("cli").rglob("*.py")]:
        if path.name != "__init__.py":
            folders[path.name].add(path.parent.relative_to(ROOT).as_posix())
    shared = {name: sorted(where) for name, where in folders.items()
              if len(where) > 1 and not where <= ONE_CONCERN}
    assert shared == {}, f"modules of one name in several folders: {shared}; name each for what it holds"
