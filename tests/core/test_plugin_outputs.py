"""What a plug-in returns is checked where fl receives it (issue 47 item 1): an aggregator's result (type, keys,
shapes, dtypes, finite values) and a dataset's Pool, each fault in one line naming the component and its file."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

from fl.core import plugins, registry
from fl.run.train import main
from fl.testing import close_state
from tests.helpers import assert_same_rows, load_ckpt, read_metrics, tiny
from tests.process_pairs import on_one_and_two_processes

# what a faulty aggregator returns, given the uploads' mean `m` -> what the error line says
AGGREGATES = {
    "none": ("None", "returned None, not a dict of torch tensors"),
    "numpy": ("{k: v.cpu().numpy() for k, v in m.items()}", "returned numpy.ndarray for "),
    "missing": ("dict(list(m.items())[1:])", "returned no tensor for 1 of the "),
    "extra": ("{**m, 'zz_extra': torch.zeros(1)}", "returned 1 key the clients did not upload (first: 'zz_extra')"),
    "shape": ("{k: v.reshape(-1) if v.dim() > 1 else v for k, v in m.items()}", "of shape ("),
    "dtype": ("{k: v.double() if v.is_floating_point() else v for k, v in m.items()}", "as float64; the uploads' is "
              "float32"),
}


@pytest.fixture
def isolated_registry(monkeypatch, tmp_path):
    """The tables as they were, and tmp_path importable: what a test registers (zz_*) is gone afterwards."""
    registry.load_plugins()
    saved, modules = {kind: dict(table) for kind, table in registry.TABLES.items()}, set(sys.modules)
    monkeypatch.setattr(plugins, "FAILED", {})
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for kind, table in registry.TABLES.items():
        table.clear()
        table.update(saved[kind])
    for name in [n for n in set(sys.modules) - modules if n.startswith("zz_")]:
        del sys.modules[name]


def aggregator_file(tmp_path, name: str, result: str, at_round: int = 0) -> str:
    """A plug-in module registering aggregator `name` that returns the mean from round `at_round` on as `result`."""
    (tmp_path / f"{name}.py").write_text(
        "import torch\n\nfrom fl.core.registry import register_aggregator\n\n\n"
        f"@register_aggregator({name!r})\n"
        "def agg(uploads, start, s):\n"
        "    m = uploads.mean()\n"
        f"    return m if _round() < {at_round} else {result}\n\n\n"
        "_calls = [0]\n\n\n"
        "def _round():\n"
        "    _calls[0] += 1\n"
        "    return _calls[0] - 1\n")
    return name


@pytest.mark.parametrize("fault", sorted(AGGREGATES))
def test_an_aggregate_of_the_wrong_structure_stops_the_run_naming_the_aggregator(fault, tmp_path, capsys,
                                                                                 isolated_registry):
    name = aggregator_file(tmp_path, f"zz_agg_{fault}", AGGREGATES[fault][0])
    code = main(tiny(tmp_path, f"plugins=[{name}]", f"server.aggregator.name={name}", "trainer.rounds=2",
                     "logger.run_name=run"))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert len(err) == 1 and err[0].startswith(f"error: server.aggregator.name={name!r} ({tmp_path / name}.py:6) "), err
    assert AGGREGATES[fault][1] in err[0] and "(round 0)" in err[0], err
    assert not (tmp_path / "outputs" / "run" / "summary.json").exists()  # nothing scored on its result


def test_non_finite_aggregates_stop_the_run_and_no_number_is_scored_on_them(tmp_path, capsys, isolated_registry):
    name = aggregator_file(tmp_path, "zz_agg_nan", "{k: v * float('nan') if v.is_floating_point() else v "
                                                   "for k, v in m.items()}", at_round=1)
    code = main(tiny(tmp_path, f"plugins=[{name}]", f"server.aggregator.name={name}", "trainer.rounds=3",
                     "logger.run_name=run"))
    out, err = capsys.readouterr()
    assert code == 1
    assert f"error: server.aggregator.name={name!r} ({tmp_path / name}.py:6) returned non-finite values in " in err
    assert "round 1" in err
    run = tmp_path / "outputs" / "run"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["diverged"]["round"] == 1 and summary["diverged"]["client"] is None
    assert "DIVERGED at the server's aggregate, round 1" in out
    assert [row["round"] for row in read_metrics(run)] == [0]  # round 1 was never committed nor evaluated


def test_the_built_in_aggregators_pass_the_check(tmp_path, isolated_registry):
    for name in ("mean", "median", "trimmed_mean", "krum", "geometric_median", "norm_clip"):
        settings = {"krum": ["server.aggregator.f=0"],  # tiny trains 3 clients a round
                    "trimmed_mean": ["server.aggregator.trim_fraction=0.34"]}.get(name, [])
        assert main(tiny(tmp_path, f"server.aggregator.name={name}", *settings, "trainer.rounds=1",
                         f"logger.run_name={name}")) == 0, name


# a dataset fault: the Pool(...) its plug-in returns (x, y, names as below) -> what the error line says
POOLS = {
    "short_labels": ("Pool('zz', Split(x, y[:190]), None, 4)", "x has 200 samples and y 190; every sample needs"),
    "float_labels": ("Pool('zz', Split(x, y.float()), None, 4)", "y is float32 of shape (200,); labels are one"),
    "one_hot": ("Pool('zz', Split(x, torch.nn.functional.one_hot(y, 4)), None, 4)", "of shape (200, 4); labels"),
    "numpy_x": ("Pool('zz', Split(x.numpy(), y), None, 4)", "x is numpy.ndarray, not a torch.Tensor"),
    "none": ("None", "returned None, not a fl.data.Pool"),
    "class_names": ("Pool('zz', Split(x, y), None, 4, class_names=['a', 'b'])", "2 class_names for num_classes=4"),
    "nan_mean": ("Pool('zz', Split(x, y), None, 4, mean=(0.5, float('nan'), 0.5), std=(0.5,) * 3)",
                 "mean=[0.5, nan, 0.5]; each channel's must be a finite number"),
    "short_domain": ("Pool('zz', Split(x, y, torch.arange(197) % 2), None, 4, domain_names=['a', 'b'])",
                     "domain has 197 entries for 200 samples"),
    "test_split": ("Pool('zz', Split(x, y), [x, y], 4)", "test is list, not a fl.data.Split"),
}


def dataset_file(tmp_path, name: str, pool: str) -> str:
    (tmp_path / f"{name}.py").write_text(
        "import torch\n\nfrom fl.core.registry import register_dataset\nfrom fl.data import Pool, Split\n\n\n"
        f"@register_dataset({name!r})\n"
        "def data(d):\n"
        "    g = torch.Generator().manual_seed(0)\n"
        "    x = torch.randint(0, 256, (200, 3, 16, 16), dtype=torch.uint8, generator=g)\n"
        "    y = torch.arange(200) % 4\n"
        f"    return {pool}\n")
    return name


def own_data(tmp_path, name: str, *extra: str) -> list[str]:
    """A tiny run on dataset plug-in `name` (without the embedded dataset's own settings)."""
    return [a for a in tiny(tmp_path, f"plugins=[{name}]", f"data.name={name}", "model.name=cnn", *extra)
            if not a.startswith("data.embedded.")]


@pytest.mark.parametrize("fault", sorted(POOLS))
def test_a_malformed_dataset_is_one_line_naming_it_and_its_file_before_any_run_directory(fault, tmp_path, capsys,
                                                                                        isolated_registry):
    name = dataset_file(tmp_path, f"zz_data_{fault}", POOLS[fault][0])
    code = main(own_data(tmp_path, name, "logger.run_name=run"))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith(f"error: data.name={name!r} ({tmp_path / name}.py:7): "), err
    assert POOLS[fault][1] in err[0], err
    assert not (tmp_path / "outputs").exists()


def test_a_well_formed_dataset_plugin_trains(tmp_path, isolated_registry):
    name = dataset_file(tmp_path, "zz_data_good", "Pool('zz', Split(x, y, torch.arange(200) % 2), None, 4, "
                                                  "class_names=list('abcd'), domain_names=['a', 'b'])")
    assert main(own_data(tmp_path, name, "trainer.rounds=1", "logger.run_name=run")) == 0


# ---- an exception inside a plug-in is reported as that plug-in's (issue 47 item 2) ----------------------------------
RAISING = {  # kind -> (the key that chooses it, the module's text given the exception to raise on its line 6)
    "partition": ("data.partition.name", "from fl.core.registry import register_partition\n\n\n"
                  "@register_partition('{name}')\ndef part(candidates, num_clients, s, rng):\n    {stmt}\n"),
    "dataset": ("data.name", "from fl.core.registry import register_dataset\n\n\n"
                "@register_dataset('{name}')\ndef data(d):\n    {stmt}\n"),
    "aggregator": ("server.aggregator.name", "from fl.core.registry import register_aggregator\n\n\n"
                   "@register_aggregator('{name}')\ndef agg(uploads, start, s):\n    {stmt}\n"),
}


def without_settings_of(kind: str, args: list[str]) -> list[str]:
    """tiny's arguments less the settings of the built-in the plug-in replaces (tiny cannot see a plug-in's schema)."""
    replaced = {"dataset": "data.embedded.", "partition": "data.partition.min_client_size"}.get(kind)
    return [a for a in args if replaced is None or not a.startswith(replaced)]


@pytest.mark.parametrize("kind", sorted(RAISING))
@pytest.mark.parametrize("stmt, said", [("raise ValueError('failed on purpose')", "raised ValueError: failed on "
                                                                                  "purpose"),
                                        ("return [][3]", "raised IndexError: list index out of range")])
def test_an_exception_inside_a_plugin_is_one_line_naming_it_where_it_was_raised_exit_1(kind, stmt, said, tmp_path,
                                                                                      capsys, isolated_registry):
    key, text = RAISING[kind]
    name = f"zz_raise_{kind}"
    (tmp_path / f"{name}.py").write_text(text.format(name=name, stmt=stmt))
    args = tiny(tmp_path, f"plugins=[{name}]", f"{key}={name}", "trainer.rounds=1", "logger.run_name=run")
    code = main(without_settings_of(kind, args))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert len(err) == 1 and err[0].startswith(f"error: {key}={name!r} ({tmp_path / name}.py:6) {said}"), err
    assert (tmp_path / "outputs").exists() == (kind == "aggregator")  # data plug-ins fail before any run directory


def test_a_config_error_a_plugin_raises_stays_a_config_error(tmp_path, capsys, isolated_registry):
    key, text = RAISING["partition"]
    (tmp_path / "zz_refusing.py").write_text(text.format(
        name="zz_refusing", stmt="from fl.config import ConfigError; raise ConfigError('data.partition.x=3 is too "
                                 "many')"))
    assert main(without_settings_of("partition", tiny(tmp_path, "plugins=[zz_refusing]", f"{key}=zz_refusing"))) == 2
    assert capsys.readouterr().err.strip() == "error: data.partition.x=3 is too many"


# ---- a robust aggregator survives a faulty client (issue 47 item 5) -------------------------------------------------
def faulty_client_method(name: str, clients: tuple[int, ...]) -> None:
    """Method `name`: FedAvg whose clients in `clients` train on a NaN loss at round 1 (a faulty client)."""
    from dataclasses import make_dataclass

    from fl.config import MethodConfig
    from fl.core import ClientModule, Server
    from fl.core.registry import register_method

    class Faulty(ClientModule):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            return loss * float("nan") if self.round == 1 and self.cid in clients else loss

    register_method(name, make_dataclass(f"{name}_config", [("name", str, name)], bases=(MethodConfig,)), Faulty,
                    Server)


@pytest.mark.parametrize("aggregator", ["median", "krum"])
def test_a_robust_aggregator_leaves_a_non_finite_upload_out_and_the_run_goes_on(aggregator, tmp_path, capsys,
                                                                               isolated_registry):
    faulty_client_method("zz_faulty_1", (1,))
    args = tiny(tmp_path, "method.name=zz_faulty_1", f"server.aggregator.name={aggregator}", "trainer.rounds=3",
                "trainer.participation=1.0", "logger.run_name=run", optional=("server.aggregator.f=1",))
    assert main(args) == 0
    err = capsys.readouterr().err
    assert err.count("warning: client 1's upload is non-finite at round 1; server.aggregator.name=") == 1
    run = tmp_path / "outputs" / "run"
    rows = read_metrics(run)
    assert [r["server/faulty_uploads"] for r in rows] == [0.0, 1.0, 0.0]
    assert "client/1/loss" not in rows[1] and all(math.isfinite(v) for r in rows for v in r.values())
    assert "diverged" not in json.loads((run / "summary.json").read_text())
    params = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)["server"]["global_params"]
    assert all(torch.isfinite(v).all() for v in params.values() if v.is_floating_point())


@on_one_and_two_processes("robust_leaves_out_a_faulty_client", "plugins=[tests.faulty_client]",
                          "method.name=test_faulty_client", "server.aggregator.name=median", "trainer.rounds=3",
                          "data.num_clients=7", "trainer.participation=1.0")
def faulty_client_left_out_alike_on_one_and_two_processes(one: Path, two: Path) -> None:
    """Client 1 (on the second process of two) is left out of round 1 on both: the same rounds, metrics and model."""
    a, b = read_metrics(one), read_metrics(two)
    assert [r["server/faulty_uploads"] for r in a] == [0.0, 1.0, 0.0]
    assert_same_rows(a, b, abs=1e-5)
    ga, gb = (load_ckpt(d)["server"]["global_params"] for d in (one, two))
    assert close_state(ga, gb, atol=1e-5) == []


@pytest.mark.parametrize("aggregator, clients", [("mean", (1,)), ("median", tuple(range(6)))])
def test_the_mean_or_a_round_of_only_faulty_clients_stops_the_run_as_before(aggregator, clients, tmp_path, capsys,
                                                                           isolated_registry):
    faulty_client_method("zz_faulty_n", clients)
    assert main(tiny(tmp_path, "method.name=zz_faulty_n", f"server.aggregator.name={aggregator}", "trainer.rounds=3",
                     "trainer.participation=1.0", "logger.run_name=run")) == 1
    assert "non-finite loss or parameters in method 'zz_faulty_n', client " in capsys.readouterr().err


# ---- a client transform's result (issue 47 item 1) -----------------------------------------------------------------
TRANSFORMS = {  # what it returns for x (one client's images, uint8 [N, 3, H, W]) -> what the error line says
    "none": ("None", "for client 0 returned None; a client transform returns the images as a torch tensor"),
    "numpy": ("x.numpy()", "for client 0 returned numpy.ndarray; a client transform returns"),
    "row_dropped": ("x[1:]", "for client 0 returned uint8 ("),
    "one_channel": ("x[:, :1]", "for client 0 returned uint8 ("),
    "int64": ("x.long()", "for client 0 returned int64 ("),
    "cropped": ("x[..., :4, :4] if client == 1 else x", "for client 1 returned uint8 ("),
}


@pytest.mark.parametrize("fault", sorted(TRANSFORMS))
def test_a_client_transforms_result_is_checked_per_client_before_any_run_directory(fault, tmp_path, capsys,
                                                                                  isolated_registry):
    name = f"zz_shift_{fault}"
    (tmp_path / f"{name}.py").write_text(
        "from fl.core.registry import register_client_transform\n\n\n"
        f"@register_client_transform({name!r})\n"
        "def shift(x, client, num_clients, seed, s):\n"
        f"    return {TRANSFORMS[fault][0]}\n")
    code = main(tiny(tmp_path, f"plugins=[{name}]", f"data.client_transform.name={name}", "data.name=embedded_domains",
                     "logger.run_name=run"))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith(f"error: data.client_transform.name={name!r} ({tmp_path / name}.py:4) "
                                               f"{TRANSFORMS[fault][1]}"), err
    assert not (tmp_path / "outputs").exists()


# ---- a model's output (issue 47 item 1) ----------------------------------------------------------------------------
@pytest.mark.parametrize("forward, said", [
    ("x.flatten(1)[:, :7]", "returned shape (2, 7) for 2 inputs; a model returns logits [N, num_classes] = (2, 10)"),
    ("(x.flatten(1)[:, :10], x)", "returned tuple for 2 inputs; a model returns logits"),
])
def test_a_model_whose_output_is_not_logits_is_one_line_before_any_run_directory(forward, said, tmp_path, capsys,
                                                                                isolated_registry):
    (tmp_path / "zz_model.py").write_text(
        "from torch import nn\n\nfrom fl.core.registry import register_model\n\n\n"
        "class Bad(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.w = nn.Linear(1, 1)\n\n"
        "    def forward(self, x):\n"
        f"        return {forward}\n\n\n"
        "@register_model('zz_model')\n"
        "def build(cfg, input_shape, num_classes):\n"
        "    return Bad()\n")
    assert main(tiny(tmp_path, "plugins=[zz_model]", "model.name=zz_model", "logger.run_name=run")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: model.name='zz_model' ({tmp_path}/zz_model.py:15) {said}"), err
    assert not (tmp_path / "outputs").exists()


def test_a_left_out_clients_message_does_not_reach_the_server_step(tmp_path, capsys, isolated_registry):
    # SCAFFOLD's clients send their control-variate change as a message beside the upload: under a robust rule a
    # faulty client's is left out with it, or the server's control variate would turn NaN
    from fl.methods.scaffold import ScaffoldClient

    original = ScaffoldClient.client_loss

    def faulty(self, forward, params, inputs, batch, mask=None):
        out = original(self, forward, params, inputs, batch, mask)
        return {k: v * float("nan") for k, v in out.items()} if self.round == 1 and self.cid == 1 else out

    ScaffoldClient.client_loss = faulty
    try:
        assert main(tiny(tmp_path, "method.name=scaffold", "server.aggregator.name=median", "trainer.rounds=3",
                         "trainer.participation=1.0", "logger.run_name=run")) == 0
    finally:
        ScaffoldClient.client_loss = original
    state = torch.load(tmp_path / "outputs" / "run" / "checkpoints" / "last.ckpt", weights_only=False)["server"]
    tensors = [v for part in state.values() if isinstance(part, dict) for v in part.values() if torch.is_tensor(v)]
    assert tensors and all(torch.isfinite(v).all() for v in tensors if v.is_floating_point())
