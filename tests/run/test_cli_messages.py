"""What a new user reads (issue 26, item 12): listings that say what each item is, a method's help without a
full config, the sweep's usage, one spelling of "error:", data faults that say what is wrong with the file,
a method key that names the methods taking it, and nothing left behind that was not asked for."""
from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

from fl.config import ConfigError, load_config
from fl.core import registry
from fl.run.train import main


def listed(capsys, kind: str) -> dict[str, str]:
    assert main(["--list", kind]) == 0
    return dict(line.split(maxsplit=1) for line in capsys.readouterr().out.splitlines())


def test_list_methods_describes_each_method_by_its_own_module(capsys):
    methods = listed(capsys, "methods")
    # fedpals trains with FedProx's client class; it used to be listed as "FedProx (Li et al., 2020) ..."
    assert methods["fedpals"].startswith("FedPALS") and methods["fedprox"].startswith("FedProx")
    assert methods["fedacd_base"].startswith("FedACD_base") and methods["fedct"].startswith("FedCT")
    shipped = [d for m, d in methods.items() if registry.METHODS[m].client_cls.__module__.startswith("fl.")]
    assert not {d for d in shipped if shipped.count(d) > 1}


def test_list_models_gives_each_model_its_own_line(capsys):
    models = listed(capsys, "models")
    shared = {n: d for n, d in models.items() if list(models.values()).count(d) > 1}
    assert not shared


def test_method_help_needs_no_target(capsys):
    """FedPALS refuses a run without data.target; its help shows the hyperparameters all the same."""
    assert main(["method.name=fedpals", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("method.name=fedpals: FedPALS") and "method.lam=" in out and "method.ess_frac=" in out


def test_a_method_without_hyperparameters_says_so(capsys):
    """`method.name=fedavg --help` ended in an empty `hyperparameters:`."""
    assert main(["method.name=fedavg", "--help"]) == 0
    out = capsys.readouterr().out
    assert "hyperparameters: none of its own" in out and "optim.*, trainer.*" in out
    assert not out.rstrip().endswith("hyperparameters:")


def test_a_model_too_big_for_the_images_is_the_error_line_alone(out, capsys):
    """Images too small for the CNN: the error said why, after two lines of torch's UserWarning about a zero-sized
    layer."""
    path = out / "tiny_images.npz"
    np.savez(path, x=np.random.default_rng(0).integers(0, 256, (60, 3, 2, 2), dtype=np.uint8), y=np.arange(60) % 3)
    with warnings.catch_warnings(record=True) as shown:  # what would reach the terminal (pytest records them)
        warnings.simplefilter("always")
        assert main(["logger.wandb.mode=disabled", "data.name=arrays", f"data.root={path}", "data.num_clients=3",
                     "data.partition.min_client_size=2", f"logger.output_dir={out / 'outputs'}"]) == 2
    assert not [str(w.message) for w in shown if "zero-element" in str(w.message)]
    err = capsys.readouterr().err
    assert err.startswith("error: model.name='cnn' cannot take the inputs") and err.count("\n") == 1, err
    assert not (out / "outputs").exists()


def test_method_help_still_refuses_an_unknown_key(capsys):
    assert main(["method.name=fedpals", "method.lamda=1", "--help"]) == 2
    assert "method.lamda" in capsys.readouterr().err


def test_sweep_help_shows_make(capsys):
    from fl.sweep.runner import main as sweep_main

    with pytest.raises(SystemExit) as stop:
        sweep_main(["--help"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert "--make conf=NAME params=" in out


def test_an_unexpected_error_is_one_error_line_without_the_exception_class(out, capsys, monkeypatch):
    """Every message starts with 'error:'; the catch-all used to print 'error: FileNotFoundError: ...'."""
    import fl.run.train as train

    def fail(cfg):
        raise FileNotFoundError(2, "No such file or directory", str(out / "gone"))

    monkeypatch.setattr(train, "build_data", fail)
    assert main(["logger.wandb.mode=disabled", f"logger.output_dir={out}"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: [Errno 2] No such file or directory: '{out / 'gone'}'\n"


def test_an_existing_arrays_file_with_int64_x_says_what_is_wrong(out, capsys):
    path = out / "mine.npz"
    np.savez(path, x=np.arange(60 * 8, dtype=np.int64).reshape(60, 8), y=np.arange(60) % 3)
    assert main(["logger.wandb.mode=disabled", "data.name=arrays", f"data.root={path}",
                 f"logger.output_dir={out / 'outputs'}"]) == 2
    err = capsys.readouterr().err
    assert "not found" not in err and str(path) in err
    assert "x is int64" in err and "uint8" in err and "float" in err


def test_a_missing_arrays_file_is_reported_as_missing(out, capsys):
    assert main(["logger.wandb.mode=disabled", "data.name=arrays", f"data.root={out / 'none.npz'}"]) == 2
    assert f"dataset not found at {out / 'none.npz'}" in capsys.readouterr().err


def test_a_hyperparameter_of_other_methods_names_them():
    with pytest.raises(ConfigError) as err:
        load_config(["method.mu=0.1"])
    message = str(err.value)
    takes_mu = sorted(n for n, s in registry.METHODS.items() if "mu" in s.config_cls.__dataclass_fields__)
    assert "fedprox" in takes_mu and f"method.mu is a hyperparameter of {', '.join(takes_mu)}" in message
    assert "method.name=fedavg" in message


def test_no_wandb_id_when_w_and_b_is_disabled(out, monkeypatch):
    from fl.run.run_dir import RUN_DIR_ENV, prepare_run_dir

    monkeypatch.delenv(RUN_DIR_ENV, raising=False)
    for mode, has_id in (("disabled", False), ("offline", True)):
        cfg = load_config([f"logger.wandb.mode={mode}", f"logger.output_dir={out / mode}"])
        try:
            run_dir = prepare_run_dir(cfg)
        finally:  # prepare_run_dir exports the run dir for launched processes; later tests' runs must not see it
            os.environ.pop(RUN_DIR_ENV, None)
        assert (run_dir / "wandb_id").is_file() == has_id, mode


@pytest.mark.parametrize("dataset, tv_name", [("cifar10", "CIFAR10"), ("fmnist", "FashionMNIST")])
def test_a_failed_download_leaves_no_folder_behind(out, monkeypatch, dataset, tv_name):
    """torchvision creates the dataset's folders before it fetches anything; a download that fails removes the
    folders it created (and only those)."""
    import torchvision.datasets as tvd

    from fl.data import DataError, build_data

    class Offline:
        def __init__(self, root, *args, **kwargs):
            (out / "data" / tv_name / "raw").mkdir(parents=True)  # as torchvision does, then the network fails
            raise OSError("<urlopen error [Errno -3] Temporary failure in name resolution>")

    monkeypatch.setattr(tvd, tv_name, Offline)
    (out / "kept").mkdir()
    cfg = load_config([f"data.name={dataset}", f"data.root={out / 'data'}", "data.download=true"])
    with pytest.raises(DataError, match="download failed|name resolution"):
        build_data(cfg)
    assert sorted(p.name for p in out.iterdir()) == ["kept"]
