"""A baseline's paper config runs the protocol of the paper whose table it is in: outside the method block it equals
that paper's config, and its synthetic twin equals that paper's twin."""
import pytest
from omegaconf import OmegaConf

from fl.config import load_config

FEDDRM, FEDACD = "feddrm_cifar10_dir03", "fedacd_cifar100_dir01"
PROTOCOL = {
    "confree_cifar10_dir03": FEDDRM, "fedala_cifar10_dir03": FEDDRM, "fedas_cifar10_dir03": FEDDRM,
    "fedsam_cifar10_dir03": FEDDRM,
    "creff_cifar100_dir01": FEDACD, "fednh_cifar100_dir01": FEDACD, "fednova_cifar100_dir01": FEDACD,
    "fedlc_cifar100_dir01": FEDACD, "fedntd_cifar100_dir01": FEDACD, "feddecorr_cifar100_dir01": FEDACD,
}


@pytest.mark.parametrize("twin", ["", "_synthetic"])
@pytest.mark.parametrize("baseline", PROTOCOL)
def test_a_baseline_config_is_its_papers_protocol_outside_the_method_block(baseline, twin):
    mine, theirs = (OmegaConf.to_container(load_config([f"conf={name}{twin}"]), resolve=True)
                    for name in (baseline, PROTOCOL[baseline]))
    assert mine.pop("method")["name"] == baseline.split("_")[0]
    theirs.pop("method")
    assert mine == theirs
