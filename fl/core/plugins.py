"""Importing the modules that register into the tables (fl/core/registry.py), so that one broken plug-in breaks
nothing else: the files of the package's plug-in folders, the modules installed packages name under the entry-point
group `fl.plugins`, and those a config names in `plugins`.

A module that fails to import (a syntax error, an import error, an exception at import) or registers a name another
module holds is skipped: what it had registered is taken back out, and one warning line names the file and the
error. A name the module had registered, a name two modules claim, and a name nothing registered while a module that
could have registered it failed, are explained when a config selects them (`unavailable`), in one line naming the
file.
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import pkgutil
import sys
import traceback
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Optional

ENTRY_POINT_GROUP = "fl.plugins"

# the package folder whose files register each kind: a failed file there may be what a missing name was
FOLDERS = {"method": "fl.methods", "dataset": "fl.data.sources", "partition": "fl.data.partitions",
           "client transform": "fl.data.client_transforms", "aggregator": "fl.aggregators", "model": "fl.models",
           "evaluator": "fl.metrics", "augmentation": "fl.data"}


class PluginNotFound(ImportError):
    """A module `plugins` names that is not importable at all (not installed, not on the path)."""


@dataclass
class Failure:
    """A module skipped: its file, the error in one line, and the (kind, name) pairs it had registered."""
    module: str
    file: str
    error: str
    names: list[tuple[str, str]] = field(default_factory=list)


ORIGINS: dict[tuple[str, str], str] = {}  # (kind, name) -> the module that registered it
FAILED: dict[str, Failure] = {}  # module -> why it was skipped
_entry_points_done = False
_entry_point: Optional[str] = None  # the entry point being imported ("name = module" of a distribution), for warnings


def record_origin(kind: str, name: str, module: str) -> None:
    ORIGINS[(kind, name)] = module


def origin(kind: str, name: str) -> Optional[str]:
    return ORIGINS.get((kind, name))


def outside(kind: str, name: str) -> bool:
    """Whether `name` was registered by a module outside fl (a plug-in from `plugins=` or an installed package)."""
    module = origin(kind, name)
    return module is not None and module != "fl" and not module.startswith("fl.")


def module_file(module: str) -> str:
    """Where a module's source is, relative to the working directory when under it (as a user would type it)."""
    found = sys.modules.get(module)
    path = getattr(found, "__file__", None)
    if path is None:
        try:
            spec = importlib.util.find_spec(module)
        except Exception:  # a parent package that itself fails to import
            spec = None
        path = spec.origin if spec is not None and spec.origin not in (None, "built-in") else None
    return module if path is None else short_path(path)


def one_line(err: BaseException, file: str) -> str:
    """An import failure in one line: its type, message and where it happened (the line of the syntax error or of
    the innermost frame; its file too when that is not `file`, the module's own)."""
    if isinstance(err, SyntaxError):
        path, line, text = err.filename, err.lineno, err.msg
    else:
        frames = [f for f in traceback.extract_tb(err.__traceback__)  # not the import machinery's, nor this file's
                  if "importlib" not in f.filename and not _same(f.filename, __file__)]
        path, line = (frames[-1].filename, frames[-1].lineno) if frames else (None, None)
        text = (str(err).splitlines() or [""])[0][:200]
    where = "" if path is None else f" (line {line})" if _same(path, file) else f" ({short_path(path)}, line {line})"
    return f"{type(err).__name__}: {text}{where}" if text else f"{type(err).__name__}{where}"


def code_location(fn) -> str:
    """`path:line` of a function's definition (the path relative to the working directory when under it)."""
    fn = inspect.unwrap(fn)
    try:
        return f"{short_path(inspect.getsourcefile(fn) or '?')}:{fn.__code__.co_firstlineno}"
    except (TypeError, AttributeError):  # a builtin or a callable object without code
        return getattr(fn, "__module__", "?")


def type_name(value) -> str:
    """What a plug-in returned, for a message: None, list, numpy.ndarray, torch.Tensor."""
    if value is None:
        return "None"
    module = type(value).__module__
    return type(value).__qualname__ if module == "builtins" else f"{module.split('.')[0]}.{type(value).__qualname__}"


def short_path(path: str) -> str:
    """`path` relative to the working directory when under it, else as it is."""
    try:
        rel = os.path.relpath(path)
    except ValueError:  # another drive (Windows)
        return path
    return rel if not rel.startswith("..") else path


def _same(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def refuse_taken(kind: str, name: str, module: str) -> None:
    """A registration of a name another module holds: refused alone, in one warning line naming the file (and the
    entry point it came through); the first holder keeps the name."""
    first = origin(kind, name) or "?"
    if os.environ.get("LOCAL_RANK", "0") not in ("", "0"):
        return
    via = f" (entry point {_entry_point})" if _entry_point else ""
    print(f"warning: {module_file(module)}{via}: {kind} {name!r} is taken by {module_file(first)}; this registration "
          f"is refused and {name!r} stays that one: rename it to select it", file=sys.stderr)


def _warn(failure: Failure, err: Exception) -> None:
    """One line on stderr, from the first process of a node only (launched ranks repeat the import)."""
    if os.environ.get("LOCAL_RANK", "0") not in ("", "0"):
        return
    via = f" (entry point {_entry_point})" if _entry_point else ""
    print(f"warning: {failure.file}{via}: {failure.error}; skipped, and nothing it registers can be selected",
          file=sys.stderr)


def guarded_import(module: str, tables: dict[str, dict]) -> bool:
    """Import `module`; on failure take back what it registered, record and report it, and return False."""
    if module in FAILED:
        return False
    before = {kind: set(table) for kind, table in tables.items()}
    try:
        importlib.import_module(module)
        return True
    except Exception as err:  # anything a plug-in may raise at import, reported in one line
        names = [(kind, n) for kind, table in tables.items() for n in set(table) - before[kind]]
        for kind, n in names:
            del tables[kind][n]
            ORIGINS.pop((kind, n), None)
        file = module_file(module)
        FAILED[module] = Failure(module, file, one_line(err, file), names)
        _warn(FAILED[module], err)
        return False


def import_tree(package: str, tables: dict[str, dict]) -> None:
    """Every module under `package`'s folders, in name order, each guarded; a sub-package that imports is walked
    in turn (a method with helper modules is a folder)."""
    path = importlib.import_module(package).__path__
    for info in sorted(pkgutil.iter_modules(path, prefix=f"{package}."), key=lambda m: m.name):
        if guarded_import(info.name, tables) and info.ispkg:
            import_tree(info.name, tables)


def import_entry_points(tables: dict[str, dict]) -> None:
    """The modules installed packages declare under [project.entry-points."fl.plugins"] (name = "package.module"),
    once per process, in name order."""
    global _entry_points_done
    if _entry_points_done:
        return
    _entry_points_done = True
    global _entry_point
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        dist = getattr(ep, "dist", None)
        _entry_point = f"{ep.name} = {ep.value}" + (f" of {dist.name}" if dist is not None else "")
        try:
            guarded_import(ep.module, tables)
        finally:
            _entry_point = None


def import_named(module: str, tables: dict[str, dict]) -> None:
    """A module the config's `plugins` names: PluginNotFound when nothing by that name can be imported, else
    imported as a plug-in file is (a failure is one warning line)."""
    if module in sys.modules or module in FAILED:
        return
    try:
        found = importlib.util.find_spec(module)
    except ModuleNotFoundError:  # a parent package that does not exist
        found = None
    except Exception:  # a parent package that fails to import: reported as this module's failure
        found = True
    if found is None:
        raise PluginNotFound(module)
    guarded_import(module, tables)


def unavailable(kind: str, name: str, table: dict) -> Optional[str]:
    """Why `name` cannot be selected from `table` (its kind's) when a module meant to register it: two modules
    registered it, the module that registered it failed, or a failed module is named like it; None when nothing is
    known against it."""
    for failure in FAILED.values():
        if (kind, name) in failure.names:
            return f"{failure.file} registers it but failed to import: {failure.error}"
    if name in table:
        return None
    named = [f for f in FAILED.values() if might_register(f.module, kind)
             and (f.module.rsplit(".", 1)[-1] == name or Path(f.file).parent.name == name)]
    return f"{named[0].file} failed to import: {named[0].error}" if named else None


def not_loaded(kind: str) -> str:
    """The failed modules that may have registered something of `kind`, for the message naming the choices."""
    suspects = [f for f in FAILED.values() if might_register(f.module, kind)]
    return "; ".join(f"{f.file} failed to import ({f.error})" for f in suspects[:3])


def might_register(module: str, kind: str) -> bool:
    """A module of the kind's own folder, or one from outside the package (entry points, `plugins`)."""
    folder = FOLDERS.get(kind, "")
    return module.startswith(folder + ".") or not module.startswith("fl.")
