"""iWildCam in WILDS' layout (FedPALS Table 2): the loader on a fabricated copy, whole cameras dealt to clients
(data.partition.name=domain_groups), the test split's label marginal as the target, and the config end to end."""
import numpy as np
import pytest
import torch

from fl.config import ConfigError, load_config
from fl.data import build_data
from fl.data.sources.iwildcam import load_iwildcam
from fl.run.train import main
from tests import fakes
from tests.helpers import read_metrics

CAMERAS = {"train": [0, 1, 2, 3, 4, 5, 7], "test": [10, 11], "val": [20], "id_test": [0]}


def test_the_loader_reads_wilds_train_and_test_with_cameras_as_domains(tmp_path):
    made = fakes.iwildcam(tmp_path, CAMERAS)
    cfg = load_config([f"data.root={tmp_path}", "data.name=iwildcam", "data.image_size=16"])
    pool = load_iwildcam(cfg.data)
    assert pool.num_classes == 182 and pool.train.x.shape == (7 * 4, 3, 16, 16)
    assert pool.train.y.tolist() == made["labels"]["train"] and pool.test.y.tolist() == made["labels"]["test"]
    assert pool.domain_names[:7] == [f"camera{c}" for c in CAMERAS["train"]]  # val and id_test rows are left out
    assert len(set(pool.train.domain.tolist()) & set(pool.test.domain.tolist())) == 0  # test = other cameras
    (tmp_path / "iwildcam_v2.0" / "metadata.csv").write_text("split,y\ntrain,1\n")
    with pytest.raises(ConfigError, match="missing location_remapped, filename"):
        load_iwildcam(cfg.data)


def test_whole_cameras_are_dealt_to_the_clients_and_the_target_is_the_test_marginal(tmp_path):
    fakes.iwildcam(tmp_path, CAMERAS, per_camera=6)
    common = [f"data.root={tmp_path}", "data.name=iwildcam", "data.image_size=16", "data.partition.name=domain_groups",
              "data.target.distribution=test", "data.target.val_size=4", "data.test_fraction=0.25"]
    data = build_data(load_config(common + ["data.num_clients=3"]))
    cams = [set(torch.cat([c.train.domain, c.test.domain]).tolist()) for c in data.clients]
    assert sorted(len(c) for c in cams) == [2, 2, 3] and set.union(*cams) == set(range(7))
    assert all(not (a & b) for i, a in enumerate(cams) for b in cams[i + 1:])  # a camera belongs to one client
    test_y = torch.tensor(fakes.iwildcam(tmp_path / "again", CAMERAS, per_camera=6)["labels"]["test"])
    marginal = torch.bincount(test_y, minlength=182).double() / len(test_y)
    np.testing.assert_allclose(data.target.distribution.numpy(), marginal.numpy())
    with pytest.raises(ConfigError, match="exceeds the 7 domains"):
        build_data(load_config(common + ["data.num_clients=8"]))


def test_the_fedpals_iwildcam_config_runs_on_the_fabricated_copy(tmp_path):
    fakes.iwildcam(tmp_path / "data", {"train": list(range(8)), "test": [10, 11, 12]}, per_camera=8)
    args = ["conf=fedpals_iwildcam", f"data.root={tmp_path / 'data'}", f"logger.output_dir={tmp_path / 'out'}",
            "logger.run_name=iw", "logger.wandb.mode=disabled", "logger.progress=false", "data.num_clients=4",
            "data.image_size=32", "data.target.val_size=8", "model.name=cnn", "model.width=4", "model.pretrained=null",
            "trainer.rounds=1", "fabric.cpu_threads=1"]
    assert main(args) == 0
    row = read_metrics(tmp_path / "out" / "iw")[-1]
    assert {"test/target_f1", "val/target_acc", "server/ess"} <= set(row)
