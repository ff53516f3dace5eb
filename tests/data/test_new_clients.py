"""data.new_clients (pFedFDA's Table 4): the last clients never train, are evaluated with the others and reported
apart, and may have every image corrupted."""
import pytest
import torch

from fl.config import ConfigError, load_config
from fl.core.seeding import derive_seed
from fl.data import build_data
from fl.data.transforms import corrupt
from tests.helpers import read_metrics, run_tiny, tiny


@pytest.mark.parametrize("method", ["fedavg", "pfedfda"])
def test_new_clients_never_train_and_are_reported_apart(out, method):
    rows = read_metrics(run_tiny(out, f"method.name={method}", "data.new_clients.count=2", "trainer.participation=1.0",
                                 "trainer.rounds=2", name=method))
    for row in rows:
        trained = {int(k.split("/")[1]) for k in row if k.startswith("client/") and k.endswith("/loss")}
        assert trained == {0, 1, 2, 3} and row["train/clients"] == 4  # pFedFDA's full last round too
    data = build_data(load_config(tiny(out, "data.new_clients.count=2")))
    last, sizes = rows[-1], data.test_sizes()
    for name, cids in (("original", range(4)), ("new", range(4, 6))):
        correct = sum(last[f"client/{c}/acc"] * sizes[c] for c in cids)
        assert last[f"test/acc_{name}_clients"] == pytest.approx(correct / sum(sizes[c] for c in cids), abs=1e-12)


def test_a_corruption_reaches_every_image_of_the_new_clients_only(out):
    common = tiny(out, "data.new_clients.count=2")
    plain = build_data(load_config(common))
    shifted = build_data(load_config(common + ["data.new_clients.corruption=brightness"]))
    for cid, (p, s) in enumerate(zip(plain.clients, shifted.clients)):
        both = torch.cat([p.train.x, p.test.x])
        if cid < 4:
            assert torch.equal(torch.cat([s.train.x, s.test.x]), both)
        else:
            gen = torch.Generator().manual_seed(derive_seed(0, 0, cid, "new-client-corruption"))
            assert torch.equal(torch.cat([s.train.x, s.test.x]), corrupt(both, "brightness", 3, gen))
    with pytest.raises(ConfigError, match="leaves no client to train"):
        build_data(load_config(common[:-1] + ["data.new_clients.count=6"]))


def test_table_4s_config_and_its_twin_hold_half_of_the_clients_out():
    real, twin = (load_config([f"conf=pfedfda_cifar10_new_clients{s}"]) for s in ("", "_synthetic"))
    assert real.data.new_clients.count * 2 == real.data.num_clients == 100
    assert twin.data.new_clients.count * 2 == twin.data.num_clients and twin.data.name == "embedded"
