"""Bad configuration fails before any work: exit 2, one line naming the key, no run directory."""

import pytest
from omegaconf import OmegaConf

from fl.config import ConfigError, load_config
from fl.run.train import main
from tests.helpers import run_cli, tiny


@pytest.mark.parametrize("arg, words", [
    ("optim.lr=-1", ["optim.lr", "> 0"]),
    ("trainer.participation=1.5", ["trainer.participation", "<= 1"]),
    ("trainer.participation=0", ["trainer.participation", "> 0"]),
    ("trainer.rounds=abc", ["trainer.rounds", "int"]),
    ("trainer.roundz=3", ["trainer.roundz", "did you mean 'trainer.rounds'"]),
    ("method.name=fedavgg", ["method.name", "did you mean 'fedavg'", "fedprox"]),
    ("data.name=cifar11", ["data.name", "embedded"]),
    ("model.name=resnet", ["model.name", "cnn"]),
    ("optim.name=sgdd", ["optim.name", "did you mean 'sgd'"]),
    ("method.mu=0.1", ["method.mu"]),  # fedavg has no mu
    ("conf=quickstrat", ["conf", "did you mean 'quickstart'"]),
    ("conf=missing/file.yaml", ["conf", "not found"]),
    ("trainer.rounds", ["key=value"]),
    ("fabric.accelerator=cuda", ["fabric.accelerator='cuda'"]),
    # accepted, then fabric.launch() raised TypeError in a run directory already made (ddp_spawn), or one GPU (dp)
    ("fabric.strategy=ddp_spawn fabric.devices=2", ["fabric.strategy='ddp_spawn' is not supported", "script",
                                                    "fabric.strategy=ddp", "auto"]),
    ("fabric.strategy=dp", ["fabric.strategy='dp' is not supported", "one GPU", "fabric.strategy=ddp"]),
    ("data.num_clients=500", ["data.partition.min_client_size"]),
    ("trainer.compile_backend=inductr", ["trainer.compile_backend='inductr'", "inductor", "eager"]),
    # values that were accepted and ran (issue: silently wrong results)
    ("data.client_train_fraction=[0,1,1,1,1,1]", ["data.client_train_fraction[0]=0", "(0, 1]"]),
    ("data.client_train_fraction=[1,1,-1,1,1,1]", ["data.client_train_fraction[2]=-1"]),
    ("data.client_train_fraction=[1,1,1,1,1,2]", ["data.client_train_fraction[5]=2"]),
    ("data.drop_labels=[[11],[],[],[],[],[]]", ["data.drop_labels[0]", "11", "0..9"]),
    ("data.drop_labels=[[],[0,1,2,3,4,5,6,7,8,9],[],[],[],[]]", ["data.drop_labels[1]", "all 10 labels"]),
    ("data.target.distribution=[.nan,0.5,0.5,0,0,0,0,0,0,0]", ["data.target.distribution", "nan"]),
    ("data.variant=byclass", ["unknown key 'data.variant'",
                              "a setting of data.name=emnist, not of data.name='embedded'"]),
    ("data.pool_splits=true", ["data.pool_splits", "no test split"]),
    ("logger.run_name=../escape", ["logger.run_name='../escape'", "logger.output_dir"]),
    ("logger.run_name=/tmp/abs", ["logger.run_name='/tmp/abs'"]),
    # tracebacks before (one line now)
    ("data.augment.flip=true", ["data.augment is a list", "data.augment=[flip]"]),
    ("trainer=5", ["trainer=5 sets a group", "trainer.<key>"]),
    ("method=fedprox", ["method='fedprox' sets a group", "method.name=fedprox"]),
    ("data.augment=[flip", ["cannot parse 'data.augment=[flip'"]),
    ("optim.lr=1e308", ["optim.lr=1e+308", "float32"]),
    ("model.width=100000", ["model.width=100000 cannot be built"]),
    ("method.name=pfedfda model.name=logistic", ["method.name='pfedfda'", "no backbone"]),
    ("method.name=fedbabu model.name=logistic", ["method.name='fedbabu'", "no backbone"]),
    ("method.name=fedpac model.name=logistic", ["method.name='fedpac'", "no backbone"]),
    ("model.name=resnet18 model.norm=group model.groups=7", ["model.groups=7"]),
    ("seed=${nope}", ["seed:", "'nope' not found", "command line"]),
    # messages that misled
    ("data.public_size=100000", ["data.public_size=100000 leaves no samples for the clients"]),
    ("method.name={a:1}", ["method.name=", "is not valid", "fedavg"]),
    (".trainer.rounds=2", ["'.trainer.rounds=2'", "leading"]),
    ("model.name=alexnet_bn", ["model.name='alexnet_bn' cannot take the inputs", "(3, 16, 16)"]),
    ("trainer.rounds=null", ["trainer.rounds=null has the wrong type", "int"]),
    ("trainer.rounds={}", ["trainer.rounds={} has the wrong type"]),
    ("evaluators.system.x=1", ["'evaluators.system' has no settings"]),
    ("data.partition.name=iid data.num_clients=5000", ["data.num_clients=5000 exceeds the", "needs one"]),
    # a StopIteration traceback before (issue 26, item 7)
    ("data.test_fraction=0.999", ["data.test_fraction=0.999 leaves all 6 training clients with no training data"]),
    ("data.val_fraction=0.99 data.embedded.samples_per_class=8",
     ["data.val_fraction=0.99 leaves all 6 training clients with no training data"]),
    # a bare ValueError before (item 10)
    ("data.client_train_fraction=[a,b,c,d,e,f]", ["data.client_train_fraction[0]='a' is not a number", "(0, 1]"]),
    # accepted and silently ignored before (item 11)
    ("state.dir=states", ["state.dir='states'", "state.cache_mb"]),
    ("finetune.schedule=cosine", ["finetune.schedule='cosine'", "set finetune.lr and finetune.after_round"]),
    ("method.name=fedavg_ft finetune.schedule=cosine finetune.lr=0.1", ["finetune.schedule='cosine'",
                                                                     "set finetune.after_round,"]),
    ("finetune.lr=0.1", ["finetune.lr=0.1", "finetune.after_round", "method.name='fedavg'"]),
    ("trainer.evaluators=[system] evaluators.adaptability.kl_tau=0.9",  # issue 47: accepted silently before
     ["evaluators.adaptability.kl_tau=0.9 is read only when the 'adaptability' evaluator runs", "[system]"]),
    ("data.partition.seed=-1", ["data.partition.seed=-1", ">= 0"]),
    ("conf=", ["'conf='", "names no config", "conf=quickstart"]),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(out, capsys, arg, words):
    assert main(tiny(out, *arg.split(" "))) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    for w in words:
        assert w in lines[0], (w, lines[0])
    assert not (out / "outputs").exists()


@pytest.mark.slow
def test_cli_exit_code_is_2(out):
    res = run_cli(tiny(out, "optim.lr=-1"), cwd=out)
    assert res.returncode == 2 and res.stderr.strip() == "error: optim.lr=-1.0 is out of range; it must be > 0.0"
    assert not (out / "outputs").exists()


def test_method_block_is_typed_per_method():
    cfg = load_config(["method.name=fedprox", "method.mu=0.5"])
    assert cfg.method.mu == 0.5 and OmegaConf.get_type(cfg.method).__name__ == "FedProxConfig"
    with pytest.raises(ConfigError, match="method.mu"):
        load_config(["method.name=fedprox", "method.mu=-1"])


def test_local_steps_override_epochs_in_resolved_config():
    cfg = load_config(["trainer.local_steps=7"])
    assert cfg.trainer.local_steps == 7 and cfg.trainer.local_epochs is None


def test_resume_refuses_to_change_the_experiment(tmp_path):
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(load_config([])))
    with pytest.raises(ConfigError, match="optim.lr cannot change"):
        load_config([f"resume={tmp_path}", "optim.lr=0.1"])
    assert load_config([f"resume={tmp_path}", "trainer.rounds=50"]).trainer.rounds == 50


@pytest.mark.parametrize("args", [
    ["state.dir=states", "state.cache_mb=64"],
    ["finetune.after_round=15", "trainer.last_k=2", "finetune.lr=0.01", "finetune.schedule=cosine"],
    ["method.name=fedavg_ft", "finetune.lr=0.01"],  # FedAvg-FT fine-tunes at it before every evaluation
])
def test_settings_that_take_effect_together_load(args):
    load_config(args)


def test_every_shipped_config_loads():
    from fl.config import available_confs

    for name in available_confs():
        load_config([f"conf={name}"])


def test_missing_real_data_names_the_synthetic_twin(out, capsys):
    """A paper config without its dataset on disk fails in one line that names the data path and the twin."""
    assert main(["conf=fedpals_cifar10_c2", f"data.root={out / 'empty'}", f"logger.output_dir={out / 'outputs'}",
                 "logger.wandb.mode=disabled"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "cifar-10-batches-py" in lines[0], lines
    assert lines[0].endswith("python -m fl.train conf=fedpals_cifar10_c2_synthetic"), lines[0]
    assert not (out / "outputs").exists()


def test_unknown_augmentation_and_evaluator_are_config_errors():
    with pytest.raises(ConfigError, match="data.augment='flipp'.*did you mean 'flip'"):
        load_config(["data.augment=[flipp]"])
    with pytest.raises(ConfigError, match="trainer.evaluators='nope'"):
        load_config(["trainer.evaluators=[nope]"])


@pytest.mark.parametrize("text, words", [
    ("- seed: 0\n", ["top level must be a mapping"]),
    ("include: 3\n", ["include must be a list of config names"]),
    ("method: fedprox\n", ["method='fedprox' sets a group", "method.name=fedprox"]),
    ("seed: ${nope}\n", ["seed:", "'nope' not found", "bad.yaml"]),
])
def test_bad_config_files_are_one_line_errors_naming_the_file(out, capsys, text, words):
    path = out / "bad.yaml"
    path.write_text(text)
    assert main(tiny(out, f"conf={path}")) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and all(w in lines[0] for w in words), lines
    assert str(path) in lines[0] or "nope" in lines[0]
    assert not (out / "outputs").exists()


def test_online_wandb_without_an_api_key_is_refused_before_the_run_directory(out, capsys, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setattr("fl.run.train.has_wandb_key", lambda: False)
    assert main(tiny(out, "logger.wandb.mode=online")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "logger.wandb.mode=online needs a W&B API key" in err[0]
    assert not (out / "outputs").exists()


def test_an_included_protocol_of_another_method_gives_its_settings_but_not_its_hyperparameters(tmp_path):
    conf = tmp_path / "fedprox_on_fedacd.yaml"
    conf.write_text("include: [fedacd_cifar100_dir01_synthetic]\nmethod:\n  name: fedprox\n  mu: 0.01\n")
    cfg, protocol = load_config([f"conf={conf}"]), load_config(["conf=fedacd_cifar100_dir01_synthetic"])
    assert dict(cfg.method) == {"name": "fedprox", "mu": 0.01}  # FedACD's lam, tau, ... are not FedProx's
    assert cfg.trainer == protocol.trainer and cfg.data == protocol.data and cfg.optim == protocol.optim


def test_a_variant_of_the_files_method_keeps_the_settings_it_inherits_and_takes_its_own(tmp_path):
    """FedACD_base's config subclasses FedACD's: switched to it, on the command line or in a file that includes
    FedACD's twin, the twin's hyperparameters (its mixup alpha, 0.2, not the default 1) stay, and the field it
    redefines (aggregation) is its own; another method keeps none of them."""
    twin = load_config(["conf=fedacd_cifar100_dir01_synthetic"])
    conf = tmp_path / "base_on_fedacd.yaml"
    conf.write_text("include: [fedacd_cifar100_dir01_synthetic]\nmethod:\n  name: fedacd_base\n")
    for cfg in (load_config(["conf=fedacd_cifar100_dir01_synthetic", "method.name=fedacd_base"]),
                load_config([f"conf={conf}"])):
        assert cfg.method.alpha == twin.method.alpha == 0.2 and cfg.method.aggregation == "uniform"
        assert {k: v for k, v in cfg.method.items() if k not in ("name", "aggregation")} == {
            k: v for k, v in twin.method.items() if k not in ("name", "aggregation")}
    cli = load_config(["conf=fedacd_cifar100_dir01_synthetic", "method.name=fedacd_base", "method.alpha=0.5"])
    assert cli.method.alpha == 0.5
    assert dict(load_config(["conf=fedacd_cifar100_dir01_synthetic", "method.name=fedavg"]).method) == {
        "name": "fedavg"}


def test_a_config_file_is_read_again_when_its_bytes_change_and_a_loaded_config_is_the_callers(tmp_path):
    """load_conf_file keeps what it read; a rewrite of the same size at once (the same modification time on a
    coarse clock) must still be seen, and changing one loaded config must not change the next."""
    conf = tmp_path / "mine.yaml"
    conf.write_text("include: [quickstart]\nseed: 1\n")
    first = load_config([f"conf={conf}"])
    conf.write_text("include: [quickstart]\nseed: 2\n")
    assert load_config([f"conf={conf}"]).seed == 2 and first.seed == 1
    first.trainer.rounds = 999
    from fl.config.load import load_conf_file
    node = load_conf_file(conf)
    node.trainer.rounds = 998
    assert load_config([f"conf={conf}"]).trainer.rounds == load_config(["conf=quickstart"]).trainer.rounds != 998
    conf.unlink()
    with pytest.raises(ConfigError):
        load_config([f"conf={conf}"])
