"""Run by Python at the start of each server a test starts (``servers.py`` puts this
folder on its PYTHONPATH) and of the test processes (``scripts/test``): rfc3987-syntax's
grammar is built when first used, not at import, and sqlite-utils does not import pandas
and numpy.

jsonschema imports rfc3987-syntax when it is installed (jupyter_server imports jsonschema),
and that import builds a Lark Earley parser of the IRI grammar: about a second of CPU, more
than a third of a test server's start, for the ``iri`` formats these servers never check.
Here the import gives a module whose functions import the real one at their first call
(the same answers) and whose other names are the real module's.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys

NAME = "rfc3987_syntax"


def _real():
    module = sys.modules.get(NAME)
    if module is not None and not getattr(module, "_deferred", False):
        return module
    spec = importlib.machinery.PathFinder.find_spec(NAME)
    real = importlib.util.module_from_spec(spec)
    sys.modules[NAME] = real
    spec.loader.exec_module(real)
    return real


def is_valid_syntax(term, value):
    return _real().is_valid_syntax(term, value)


def parse(term, value):
    return _real().parse(term, value)


class _Deferred:  # a finder and loader (importlib.abc's bases: slower to import)
    def find_spec(self, name, path, target=None):
        if name != NAME or importlib.machinery.PathFinder.find_spec(NAME) is None:
            return None  # not installed: its ImportError as before
        return importlib.util.spec_from_loader(name, self)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module._deferred = True
        module.is_valid_syntax = is_valid_syntax
        module.parse = parse
        module.__getattr__ = _other


def _other(attribute):
    if attribute.startswith("__"):  # the import system's questions (a package's __path__)
        raise AttributeError(attribute)
    return getattr(_real(), attribute)


class _NotForSqliteUtils:
    """pandas and numpy are not found while sqlite-utils imports, and only then.

    sqlite-utils imports them when they are installed (the kernels of the tests need
    pandas) only to map their types when it inserts their values, which this store
    never does: half a CPU-second of a test server's start. Any other import finds them.
    """

    def find_spec(self, name, path, target=None):
        if name in ("pandas", "numpy") and _importing("sqlite_utils.db"):
            raise ModuleNotFoundError(f"No module named {name!r} here", name=name)
        return None


def _importing(module: str) -> bool:
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_globals.get("__name__") == module:
            return True
        frame = frame.f_back
    return False


sys.meta_path.insert(0, _Deferred())
sys.meta_path.insert(0, _NotForSqliteUtils())
