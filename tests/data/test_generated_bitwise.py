"""The generated datasets are the same bytes on every machine (issue 32): under torch's scalar kernels
(ATEN_CPU_CAPABILITY=default) a fresh process builds the clients of every pinned config, and the images of every
style of the multi-domain generator, bitwise as pinned (and as the machine's own kernels build them:
tests/data/test_data_plugins.py pins them with those)."""
from __future__ import annotations

import hashlib
import json
import sys

import pytest

from tests.data.test_data_plugins import BEFORE, SLOW_BEFORE, data_hash
from tests.helpers import ROOT, run_cli

# sha256 of embedded_domains.make_pool(6, 12, 4, 2, 16): every style twice (domains 6-11 repeat them with their
# own streams), both splits, and the pool's mean / std
DOMAINS_POOL = "f4d856f74cdf56cc"


def domains_pool_hash() -> str:
    from fl.data import embedded_domains

    pool = embedded_domains.make_pool(6, 12, 4, 2, 16)
    h = hashlib.sha256()
    for split in (pool.train, pool.test):
        for t in (split.x, split.y, split.domain):
            h.update(t.contiguous().numpy().tobytes())
    h.update(repr((pool.mean, pool.std)).encode())
    return h.hexdigest()[:16]


def config_hashes(root: str) -> dict[str, list[str]]:
    """(partition fingerprint, data hash) of every pinned config, as tests/data/test_data_plugins.py computes them."""
    from fl.config import load_config
    from fl.data import build_data

    out = {}
    for args in (*BEFORE, *SLOW_BEFORE):
        data = build_data(load_config([*args.split(), f"data.root={root}"]))
        out[args] = [data.fingerprint(), data_hash(data)]
    return out


def test_the_domain_generator_paints_every_style_as_pinned():
    assert domains_pool_hash() == DOMAINS_POOL


@pytest.mark.slow
def test_scalar_kernels_generate_the_same_bytes_as_the_machines_own(tmp_path):
    code = ("import json, sys; from tests.data.test_generated_bitwise import config_hashes, domains_pool_hash; "
            "print(json.dumps({'configs': config_hashes(sys.argv[1]), 'domains': domains_pool_hash()}))")
    res = run_cli([str(tmp_path / "scalar")], cwd=ROOT, env={"ATEN_CPU_CAPABILITY": "default"},
                  script=("-c", code), timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    scalar = json.loads(res.stdout.strip().splitlines()[-1])
    assert scalar["domains"] == domains_pool_hash() == DOMAINS_POOL
    # the machine's own kernels give the pinned hashes: tests/data/test_data_plugins.py checks every one of them
    pinned = {args: list(want) for args, want in {**BEFORE, **SLOW_BEFORE}.items()}
    for args in pinned:
        assert scalar["configs"][args] == pinned[args], (args, sys.platform)
