"""`python -m fl.data.show` (docs/data.md, "Looking at a split"): what it prints is the partition the config makes,
client by client, and png=DIR writes its heatmaps; a bad key is one line and exit 2."""
from __future__ import annotations

import ast

import pytest

from fl.config import load_config
from fl.data import build_data, show
from tests.helpers import tiny


@pytest.mark.parametrize("extra", [(), ("data.target.distribution=partition", "data.public_size=30")],
                         ids=["plain", "target_and_public"])
def test_it_prints_the_partition_the_config_makes_and_writes_its_heatmaps(out, capsys, extra):
    args = tiny(out, *extra)
    assert show.main([*args, f"png={out / 'png'}"]) == 0
    lines = capsys.readouterr().out.splitlines()
    data = build_data(load_config(args))
    assert lines[0].startswith(f"dataset {data.name}: {data.num_clients} clients, {data.num_classes} classes")
    assert lines[0].endswith(f"fingerprint {data.fingerprint()}")
    header = next(i for i, line in enumerate(lines) if line.split()[:4] == ["client", "domain", "train", "test"])
    rows = lines[header + 1:header + 1 + data.num_clients]
    counts = data.label_counts("train").tolist()
    for i, row in enumerate(rows):  # client, domain, train size, test size, then its label counts
        client, _, train, test, rest = row.split(maxsplit=4)
        assert (int(client), int(train), int(test)) == (i, data.train_sizes()[i], data.test_sizes()[i])
        assert ast.literal_eval(rest) == counts[i] and sum(counts[i]) == int(train)
    assert (data.target is not None) == any(line.startswith("target: distribution") for line in lines)
    public = [line for line in lines if line.startswith("public set: ")]
    assert public == ([f"public set: {len(data.public)} samples"] if data.public is not None else [])
    written = [line.removeprefix("wrote ") for line in lines if line.startswith("wrote ")]
    assert written and all((out / "png").joinpath(p.rsplit("/", 1)[-1]).is_file() for p in written)


def test_a_bad_key_is_one_line_naming_it_and_exit_2(out, capsys):
    assert show.main(tiny(out, "data.nonsense=1")) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("error: ") and "nonsense" in err


def test_help_is_its_usage(capsys):
    assert show.main(["--help"]) == 0
    assert capsys.readouterr().out.startswith("`python -m fl.data.show")
