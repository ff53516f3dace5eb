"""The run directory a run claims: a fresh name, or the next suffix when it is taken, even by a run that
claimed it a moment ago."""
from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from fl.run.run_dir import new_run_dir


def cfg(out: Path):
    return OmegaConf.create({"logger": {"run_name": "r", "output_dir": str(out)}, "method": {"name": "fedavg"},
                             "data": {"name": "embedded"}, "seed": 0})


def test_taken_names_get_the_next_suffix(tmp_path):
    assert [new_run_dir(cfg(tmp_path)).name for _ in range(3)] == ["r", "r-1", "r-2"]


def test_a_name_claimed_between_the_check_and_the_mkdir_moves_on(tmp_path, monkeypatch):
    real_mkdir = Path.mkdir
    raced = []

    def mkdir(self, *args, **kwargs):  # another process creates r just before this one does
        if self.name == "r" and not raced:
            raced.append(self)
            real_mkdir(self)
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    assert new_run_dir(cfg(tmp_path)).name == "r-1"
