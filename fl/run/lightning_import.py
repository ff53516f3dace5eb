"""Lightning without the imports fl does not use. Lightning imports torchmetrics (its version check), and torchmetrics'
package import loads every metric it has: scipy.signal (audio metrics and a back-compatibility patch for SRMRpy) and
torchvision (the networks of two image metrics), about half a second on an idle 2-core CPU for metrics fl never
computes (issue 35). `import_lightning` imports Lightning with those two deferred: while it runs, importing them gives a
stand-in module whose every attribute is a deferred name, which loads the real module when it is called or its own
attributes are read (so torchmetrics' image and audio metrics still work, and a name used during the import loads the
real module then); the stand-ins leave sys.modules when it returns, so any later import gets the real module. A module
imported before (a torchvision model) is not deferred.

What this changes in torchmetrics: its SRMRpy patch (`scipy.signal.hamming`, removed from scipy 1.13) sees the name
as present and is skipped; SRMRpy is not installed with fl.

torch._dynamo is not deferred: Lightning's Fabric wrappers import it, and torch's optimizers load it at their first
step anyway. Nor is matplotlib (0.4-0.8 s, its pyplot): torchmetrics decorates its plot helpers with pyplot's style
context when it loads, which needs the real module, and fl draws with it in the same run (the partition heatmaps)."""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types

DEFERRED = ("torchvision", "scipy.signal")


def import_lightning() -> None:
    """Import Lightning (fabric and the LightningModule side) and torchmetrics, with DEFERRED deferred; nothing
    when Lightning is loaded already."""
    if "lightning" in sys.modules:
        return
    finder = _StandIns([name for name in DEFERRED if name not in sys.modules])
    sys.meta_path.insert(0, finder)
    try:
        import lightning  # noqa: F401
        import lightning.fabric  # noqa: F401
    finally:
        sys.meta_path.remove(finder)
        finder.withdraw()


class _Deferred:
    """A name of a deferred module: the real object once it is called or an attribute of it is read."""

    def __init__(self, finder: _StandIns, module: str, name: str):
        self._where = (finder, module, name)

    def _real(self):
        finder, module, name = self._where
        return getattr(finder.load(module), name)

    def __call__(self, *args, **kwargs):
        return self._real()(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._real(), name)


class _StandIn(types.ModuleType):
    def __init__(self, name: str, finder: _StandIns):
        super().__init__(name)
        self.__path__ = []  # a package: its submodules are stand-ins too
        self._finder = finder

    def __getattr__(self, name: str):
        if name.startswith("__"):  # the import system's probes (__file__, __spec__ details)
            raise AttributeError(name)
        return _Deferred(self._finder, self.__name__, name)


class _StandIns(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves stand-ins for the modules `roots` and their submodules until withdrawn or until one is used."""

    def __init__(self, roots: list[str]):
        self.roots = roots

    @staticmethod
    def _under(name: str, root: str) -> bool:
        return name == root or name.startswith(root + ".")

    def _deferred(self, name: str) -> bool:
        return any(self._under(name, root) for root in self.roots)

    def find_spec(self, name, path=None, target=None):
        return importlib.machinery.ModuleSpec(name, self, is_package=True) if self._deferred(name) else None

    def create_module(self, spec):
        return _StandIn(spec.name, self)

    def exec_module(self, module) -> None:
        pass

    def load(self, module: str):
        """The real `module`: its deferred root is no longer deferred, the root's stand-ins go, and it is imported."""
        root = next((r for r in self.roots if self._under(module, r)), module)
        self.roots = [r for r in self.roots if r != root]
        self._remove(lambda name: self._under(name, root))
        return importlib.import_module(module)

    def withdraw(self) -> None:
        """Every stand-in leaves sys.modules and its parent package (scipy serves scipy.signal on first use)."""
        self.roots = []
        self._remove(lambda name: True)

    def _remove(self, which) -> None:
        for name in [n for n, m in list(sys.modules.items()) if isinstance(m, _StandIn) and which(n)]:
            del sys.modules[name]
            parent, _, child = name.rpartition(".")
            if parent in sys.modules and isinstance(getattr(sys.modules[parent], child, None), _StandIn):
                delattr(sys.modules[parent], child)
