"""The code the notebook tools run in a kernel to look at its variables.

Each snippet defines one function, calls it, deletes it again and prints one
JSON value. It reads the kernel's namespace without calling the person's
code where it can: a value's type by ``type()`` (``isinstance`` reads
``__class__``, which a class may compute), shapes and lengths only of the
very types known to have cheap, harmless ones (builtin containers, and NumPy
arrays and pandas frames when those modules are loaded), never a property of
an unknown object, and values only through bounded formatting (``describe``
shows a short repr of other objects: that one calls their ``__repr__``).
"""

from __future__ import annotations

import json

LIST_VARIABLES = r"""
def _agentruns_variables():
    import json, sys, types
    shell = get_ipython()
    hidden = set(getattr(shell, "user_ns_hidden", {}))
    # Types whose shape is cheap and harmless, when their modules are loaded already.
    shaped = set()
    numpy, pandas = sys.modules.get("numpy"), sys.modules.get("pandas")
    if numpy is not None:
        shaped.add(numpy.ndarray)
    if pandas is not None:
        shaped.update((pandas.DataFrame, pandas.Series))
    sized = (list, tuple, dict, set, frozenset, str, bytes, bytearray, range)
    found = []
    for name, value in list(shell.user_ns.items()):
        # type(), never isinstance(): that reads __class__, which a class may compute.
        kind = type(value)
        if not isinstance(name, str) or name.startswith("_") or name in hidden:
            continue
        if issubclass(kind, types.ModuleType):
            continue
        prefix = "" if kind.__module__ == "builtins" else kind.__module__ + "."
        entry = {"name": name, "type": prefix + kind.__qualname__}
        if kind in shaped:
            entry["shape"] = list(value.shape)
        elif kind in sized:
            entry["length"] = len(value)
        found.append(entry)
        if len(found) >= %(limit)d:
            break
    print(json.dumps(found))
try:
    _agentruns_variables()
finally:
    del _agentruns_variables
"""

DESCRIBE = r"""
def _agentruns_describe(name):
    import json, reprlib, sys
    shell = get_ipython()
    if name not in shell.user_ns:
        print(json.dumps({"missing": name}))
        return
    value = shell.user_ns[name]
    kind = type(value)
    prefix = "" if kind.__module__ == "builtins" else kind.__module__ + "."
    about = {"name": name, "type": prefix + kind.__qualname__}
    numpy, pandas = sys.modules.get("numpy"), sys.modules.get("pandas")
    if pandas is not None and kind is pandas.DataFrame:
        with pandas.option_context("display.max_columns", 30, "display.width", 200, "display.max_colwidth", 40):
            about["shape"] = list(value.shape)
            about["dtypes"] = {str(column): str(dtype) for column, dtype in list(value.dtypes.items())[:100]}
            about["head"] = value.head(5).to_string()
            try:
                about["summary"] = value.describe(include="all").to_string()
            except Exception as exc:
                about["summary"] = "(no summary: %%s)" %% exc
    elif pandas is not None and kind is pandas.Series:
        with pandas.option_context("display.width", 200, "display.max_colwidth", 40):
            about["shape"] = list(value.shape)
            about["dtype"] = str(value.dtype)
            about["head"] = value.head(5).to_string()
            try:
                about["summary"] = value.describe().to_string()
            except Exception as exc:
                about["summary"] = "(no summary: %%s)" %% exc
    elif numpy is not None and kind is numpy.ndarray:
        about["shape"] = list(value.shape)
        about["dtype"] = str(value.dtype)
        about["values"] = numpy.array2string(value.ravel()[:10], threshold=10, max_line_width=200)
    else:
        if kind in (list, tuple, dict, set, frozenset, str, bytes, bytearray, range):
            about["length"] = len(value)
        shown = reprlib.Repr()
        shown.maxstring = shown.maxother = %(limit)d
        shown.maxlist = shown.maxtuple = shown.maxdict = shown.maxset = 20
        about["repr"] = shown.repr(value)[:%(limit)d]
    print(json.dumps(about, default=str))
try:
    _agentruns_describe(%(name)s)
finally:
    del _agentruns_describe
"""


def list_variables(limit: int = 300) -> str:
    return LIST_VARIABLES % {"limit": limit}


def describe(name: str, limit: int = 2000) -> str:
    return DESCRIBE % {"name": json.dumps(name), "limit": limit}
