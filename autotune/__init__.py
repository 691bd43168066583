"""autotune: find the fastest LLM-engine configuration that meets your constraints.

config -> search space -> ask -> trial subprocess -> metrics -> tell + log -> Pareto / export.

The metrics (``autotune.objectives``) and presets (``autotune.conf``) live at the repository's top
level, ``objectives/`` and ``conf/``, as the project's design card draws it. A wheel or an
editable install maps them into the package (setup.py); a checkout run without an install (the
GPU kit puts the tree on ``PYTHONPATH``) finds ``objectives/`` through :class:`_TopLevelFinder`.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from pathlib import Path

__version__ = "0.1.0"

_HERE = Path(__file__).resolve().parent
_OBJECTIVES = _HERE.parent / "objectives"


class _TopLevelFinder(importlib.abc.MetaPathFinder):
    """Finds ``autotune.objectives`` in the checkout's top-level ``objectives/`` folder.

    Only installed when this package is a checkout's ``autotune/`` (a wheel has the folder inside
    the package). Its submodules are then found through the package's ``__path__`` as usual.
    """

    def find_spec(self, fullname, path=None, target=None):  # noqa: D102 - importlib's protocol
        if fullname != "autotune.objectives":
            return None
        return importlib.util.spec_from_file_location(
            fullname, _OBJECTIVES / "__init__.py", submodule_search_locations=[str(_OBJECTIVES)])


if not (_HERE / "objectives").is_dir() and (_OBJECTIVES / "__init__.py").is_file():
    sys.meta_path.insert(0, _TopLevelFinder())
