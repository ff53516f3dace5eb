"""bench/pfllib_compare.py trains fl and PFLlib on the same images with the same network: its model plug-in is
FedAvgCNN's size (878,538 parameters at 3x32x32, 10 classes), and each client's data are written in PFLlib's layout,
normalised as fl normalises them."""
from __future__ import annotations

import numpy as np
import torch

from bench import pfllib_compare
from fl.config import load_config
from fl.core import build_model
from fl.data import build_data


def small_config(tmp_path):
    args = [a for a in pfllib_compare.fl_args(str(tmp_path), rounds=2) if not a.startswith("data.embedded.samples")]
    return load_config([*args, "data.embedded.samples_per_class=30"])


def test_the_plugin_model_is_fedavgcnns_size_and_shape(tmp_path):
    cfg = small_config(tmp_path)
    model = build_model(cfg, (3, 32, 32), 10)
    # conv 3->32 5x5, conv 32->64 5x5, 1600->512, 512->10
    assert sum(p.numel() for p in model.parameters()) == (3 * 32 * 25 + 32) + (32 * 64 * 25 + 64) + (
        1600 * 512 + 512) + (512 * 10 + 10) == 878_538
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)


def test_each_clients_data_are_written_as_pfllib_reads_them(tmp_path):
    cfg = small_config(tmp_path)
    pfllib_compare.write_pfllib_data(cfg, tmp_path / "out")
    data = build_data(cfg)
    mean = torch.tensor(data.mean).view(1, -1, 1, 1)
    std = torch.tensor(data.std).view(1, -1, 1, 1)
    for i, client in enumerate(data.clients):
        for split, part in (("train", client.train), ("test", client.test)):
            with open(tmp_path / "out" / split / f"{i}.npz", "rb") as f:  # PFLlib's read_data
                stored = np.load(f, allow_pickle=True)["data"].tolist()
            assert stored["x"].dtype == np.float32 and stored["y"].dtype == np.int64
            expected = (part.x.float() / 255 - mean) / std
            assert torch.allclose(torch.from_numpy(stored["x"]), expected, atol=1e-6)
            assert torch.equal(torch.from_numpy(stored["y"]), part.y.long())
