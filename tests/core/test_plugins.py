"""Plug-ins (fl/core/plugins.py, issue 34 items 2-3): a file that fails to import, or registers a name already taken,
dropped into one of the package's plug-in folders or named in `plugins=`, costs one warning line naming it, every
command that does not choose it works, and choosing it is one line naming the file (exit 2); a package outside the
tree registers one of each kind through the `fl.plugins` entry point or `plugins=`, and its runs resume."""
from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import pytest

from fl.config import ConfigError, load_config
from fl.core import plugins, registry
from fl.run.train import main
from tests.helpers import doc_section, read_metrics, run_cli, tiny

# package -> (the key that chooses from it, its registrar's import, a name it already holds)
FOLDERS = {
    "fl.data.sources": ("data.name", "from fl.core.registry import register_dataset as register", "cifar10"),
    "fl.data.partitions": ("data.partition.name", "from fl.core.registry import register_partition as register", "iid"),
    "fl.data.client_transforms": ("data.client_transform.name",
                                  "from fl.core.registry import register_client_transform as register", "cifar_s"),
    "fl.aggregators": ("server.aggregator.name", "from fl.core.registry import register_aggregator as register",
                       "median"),
    "fl.methods": ("method.name", "from fl.config import MethodConfig\nfrom fl.core import ClientModule, Server, "
                   "register_method", "fedprox"),
}
# kind of failure -> (the file's text, given the registration of a name; what its warning line says)
FAILURES = {
    "syntax": (lambda register: "def broken(:\n", "SyntaxError: invalid syntax (line 1)"),
    "import": (lambda register: "import numpy\nimport fl_no_such_dependency\n",
               "ModuleNotFoundError: No module named 'fl_no_such_dependency' (line 2)"),
    "raise": (lambda register: register + "raise RuntimeError('boom at import')\n",
              "RuntimeError: boom at import (line"),
}


def registration(package: str, name: str) -> str:
    key, imports, _ = FOLDERS[package]
    if package == "fl.methods":
        return f"{imports}\nregister_method({name!r}, MethodConfig, ClientModule, Server)\n"
    return f"{imports}\n\n\n@register({name!r})\ndef plugin(*args):\n    return None\n"


@pytest.fixture
def isolated_registry(monkeypatch):
    """The tables, the failure records and the modules as they were: what a test drops in (zz_*) is gone
    afterwards."""
    registry.load_plugins()  # the package's own first, so that they are what is restored
    saved, modules = {kind: dict(table) for kind, table in registry.TABLES.items()}, set(sys.modules)
    monkeypatch.setattr(plugins, "FAILED", {})
    yield
    for kind, table in registry.TABLES.items():
        table.clear()
        table.update(saved[kind])
    for name in set(sys.modules) - modules:  # the files dropped in (a run imports libraries, which stay)
        if name.rsplit(".", 1)[-1].startswith("zz_"):
            del sys.modules[name]


def drop_in(tmp: Path, monkeypatch, package: str, file: str, text: str) -> Path:
    """`text` as `file` in a folder on `package`'s path (as if dropped into its folder), found by discovery."""
    mod = importlib.import_module(package)
    folder = tmp / package.replace(".", "_")
    folder.mkdir(exist_ok=True)
    (folder / file).write_text(text)
    monkeypatch.setattr(mod, "__path__", [*mod.__path__, str(folder)])
    registry.discover(package)
    return folder / file


@pytest.mark.parametrize("kind", FAILURES)
@pytest.mark.parametrize("package", FOLDERS)
def test_a_broken_plugin_file_costs_one_warning_and_choosing_it_one_line(tmp_path, monkeypatch, capsys,
                                                                         isolated_registry, package, kind):
    key, _, _ = FOLDERS[package]
    name = f"zz_{kind}"
    text, said = FAILURES[kind]
    path = drop_in(tmp_path, monkeypatch, package, f"zz_{kind}.py", text(registration(package, name)))
    warning = capsys.readouterr().err.splitlines()
    assert len(warning) == 1 and warning[0].startswith(f"warning: {path}: ") and said in warning[0], warning
    table = registry.TABLES[{folder: kind for kind, folder in plugins.FOLDERS.items()}[package]]
    assert f"zz_{kind}" not in table  # taken back out
    assert load_config(["trainer.rounds=1"]).method.name == "fedavg"  # what does not choose it is untouched
    assert main(["--list", "methods"]) == 0
    capsys.readouterr()
    assert main([f"{key}={name}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {key}={name!r} cannot be used: ") and str(path) in err


@pytest.mark.parametrize("package", FOLDERS)
def test_a_taken_name_is_refused_alone_and_the_first_holder_stays_selectable(tmp_path, monkeypatch, capsys,
                                                                              isolated_registry, package):
    key, _, taken = FOLDERS[package]
    kind = {folder: kind for kind, folder in plugins.FOLDERS.items()}[package]
    table = registry.TABLES[kind]
    first = table[taken]
    text = registration(package, taken) + registration(package, "zz_beside").split("\n", 2 if package == "fl.methods"
                                                                                  else 1)[-1]
    path = drop_in(tmp_path, monkeypatch, package, "zz_clash.py", text)
    warning = capsys.readouterr().err.splitlines()
    assert len(warning) == 1 and warning[0].startswith(f"warning: {path}: {kind} {taken!r} is taken by fl/"), warning
    assert "this registration is refused" in warning[0]
    assert table[taken] is first and "zz_beside" in table  # the built-in kept, the file's other registration stands
    assert registry.unavailable(table, taken) is None
    capsys.readouterr()
    assert main(["--list", {"fl.data.sources": "datasets", "fl.data.partitions": "partitions",
                            "fl.data.client_transforms": "client_transforms", "fl.aggregators": "aggregators",
                            "fl.methods": "methods"}[package]]) == 0
    listed = capsys.readouterr().out
    assert taken in listed and "zz_beside" in listed


def test_every_command_works_beside_broken_files_in_every_folder(out, monkeypatch, capsys, isolated_registry):
    for package in FOLDERS:
        for kind, (text, _) in FAILURES.items():
            name = FOLDERS[package][2] if kind == "twice" else f"zz_{kind}"
            drop_in(out, monkeypatch, package, f"zz_{kind}.py", text(registration(package, name)))
    assert len(capsys.readouterr().err.splitlines()) == len(FOLDERS) * len(FAILURES)
    assert main(tiny(out, "trainer.rounds=1", "logger.run_name=run")) == 0
    assert len(read_metrics(out / "outputs" / "run")) == 1
    assert main(["--help"]) == 0 and main(["method.name=scaffold", "--help"]) == 0
    assert main(["--list", "aggregators"]) == 0
    from fl.reproduce.cli import main as reproduce

    capsys.readouterr()
    assert reproduce(["pfedfda", "--table", "table2", "--dry-run"]) == 0
    assert "runs to go" in capsys.readouterr().out
    # an unknown name lists the choices and names the files that failed in that folder
    with pytest.raises(ConfigError, match=r"^data.partition.name='nope' is not valid; choices: .*\(.*zz_syntax.py "
                                          r"failed to import \(SyntaxError"):
        load_config(["data.partition.name=nope"])


def test_plugins_imports_modules_before_the_config_is_checked(tmp_path, monkeypatch, capsys, isolated_registry):
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "zz_good_plugin.py").write_text(registration("fl.aggregators", "zz_from_plugins"))
    cfg = load_config(["plugins=[zz_good_plugin]", "server.aggregator.name=zz_from_plugins"])
    assert cfg.server.aggregator.name == "zz_from_plugins" and list(cfg.plugins) == ["zz_good_plugin"]
    conf = tmp_path / "with_plugins.yaml"  # a config file may name them too
    conf.write_text("include: [quickstart]\nplugins: [zz_good_plugin]\nserver:\n  aggregator:\n"
                    "    name: zz_from_plugins\n")
    assert load_config([f"conf={conf}"]).server.aggregator.name == "zz_from_plugins"
    assert main(["--list", "aggregators", "plugins=[zz_good_plugin]"]) == 0
    assert "zz_from_plugins" in capsys.readouterr().out

    (tmp_path / "zz_bad_plugin.py").write_text("raise ImportError('needs a package this machine lacks')\n")
    assert load_config(["plugins=[zz_bad_plugin]"]).plugins == ["zz_bad_plugin"]
    warning = capsys.readouterr().err.splitlines()
    assert len(warning) == 1 and "zz_bad_plugin.py: ImportError: needs a package this machine lacks" in warning[0]
    load_config(["plugins=[zz_bad_plugin]"])  # reported once per process
    assert capsys.readouterr().err == ""
    with pytest.raises(ConfigError, match=r"^plugins: no module named 'zz_not_there'; a plug-in module must be "):
        load_config(["plugins=[zz_not_there]"])
    with pytest.raises(ConfigError, match=r"^plugins: no module named 'zz_not_there.sub'"):
        load_config(["plugins=[zz_not_there.sub]"])
    with pytest.raises(ConfigError, match=r"^plugins='zz_good_plugin' must be a list of module names"):
        load_config(["plugins=zz_good_plugin"])


# ---- a package outside the tree ------------------------------------------------------------------------------------
def study_package(root: Path, entry_point: bool) -> Path:
    """docs/plugins.md's mystudy package under `root`, on a folder to put on PYTHONPATH; with `entry_point`, the
    .dist-info folder pip would write for it (METADATA and entry_points.txt), so importlib.metadata finds it."""
    section = doc_section("docs/plugins.md", "# Plug-ins from outside the package")
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    site = root / "site"
    (site / "mystudy").mkdir(parents=True)
    (site / "mystudy" / "__init__.py").write_text("")
    (site / "mystudy" / "fl_plugin.py").write_text(code)
    if entry_point:
        info = site / "mystudy-0.1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mystudy\nVersion: 0.1.0\n")
        group = re.search(r'\[project.entry-points."fl.plugins"\]\n(\w+) = "([\w.]+)"', section).groups()
        (info / "entry_points.txt").write_text(f"[fl.plugins]\n{group[0]} = {group[1]}\n")
    return site


def with_path(site: Path) -> dict:
    from tests.helpers import ROOT

    return {"PYTHONPATH": f"{ROOT}:{site}"}


STUDY = ["method.name=fedavg_smooth", "data.name=quadrants", "data.partition.name=round_robin",
         "data.client_transform.name=darken", "server.aggregator.name=uniform_mean", "model.name=flat_mlp",
         "trainer.evaluators=[confidence]", "data.num_clients=4", "trainer.participation=1.0", "trainer.rounds=2",
         "trainer.eval_every=1", "logger.progress=false", "logger.wandb.mode=disabled", "fabric.cpu_threads=1"]


@pytest.mark.slow
def test_an_installed_package_registers_one_of_each_through_its_entry_point(tmp_path):
    site = study_package(tmp_path, entry_point=True)
    listed = run_cli(["--list", "methods"], cwd=tmp_path, env=with_path(site))
    assert listed.returncode == 0 and "fedavg_smooth" in listed.stdout.split(), listed.stderr[-2000:]
    res = run_cli([*STUDY, f"logger.output_dir={tmp_path / 'outputs'}", "logger.run_name=study"], cwd=tmp_path,
                  env=with_path(site))
    assert res.returncode == 0, res.stderr[-2000:]
    rows = read_metrics(tmp_path / "outputs" / "study")
    assert len(rows) == 2 and all(0.25 <= r["test/confidence"] <= 1.0 for r in rows)


@pytest.mark.slow
def test_plugins_named_in_the_config_are_found_again_on_resume(tmp_path):
    """No entry point: plugins= names the module; the run's config.yaml records it, so resume= imports it before
    reading the rest."""
    site = study_package(tmp_path, entry_point=False)
    args = [*STUDY, "plugins=[mystudy.fl_plugin]", f"logger.output_dir={tmp_path / 'outputs'}",
            "logger.run_name=study", "trainer.rounds=1"]
    first = run_cli(args, cwd=tmp_path, env=with_path(site))
    assert first.returncode == 0, first.stderr[-2000:]
    run_dir = tmp_path / "outputs" / "study"
    assert "plugins:\n- mystudy.fl_plugin" in (run_dir / "config.yaml").read_text()
    resumed = run_cli([f"resume={run_dir}", "trainer.rounds=2"], cwd=tmp_path, env=with_path(site))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert [r["round"] for r in read_metrics(run_dir)] == [0, 1]


@pytest.mark.parametrize("module, said", [
    ("mystudy.fl_plugn", ": ModuleNotFoundError: No module named 'mystudy.fl_plugn'; skipped"),
    ("mystudy.clash", ": aggregator 'krum' is taken by fl/aggregators/krum.py; this registration is refused"),
])
def test_an_entry_points_warning_names_the_distribution_and_the_entry_point(module, said, tmp_path, monkeypatch,
                                                                            capsys, isolated_registry):
    site = study_package(tmp_path, entry_point=True)
    (site / "mystudy" / "clash.py").write_text(registration("fl.aggregators", "krum"))
    (site / "mystudy-0.1.0.dist-info" / "entry_points.txt").write_text(f"[fl.plugins]\nstudy = {module}\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(plugins, "_entry_points_done", False)
    plugins.import_entry_points(registry.TABLES)
    warning = capsys.readouterr().err.splitlines()
    assert len(warning) == 1 and f" (entry point study = {module} of mystudy){said}" in warning[0], warning
    assert "fl/core/plugins.py" not in warning[0]
    assert registry.AGGREGATORS["krum"].fn.__module__ == "fl.aggregators.krum"  # the built-in still serves krum
