"""bench/reproduce_budget.py --publish: a paper's reproduce.md and its record land in bench/reproduce/ as the
command wrote them, the Markdown under one line naming the command and the record's commit."""
from __future__ import annotations

import argparse
import json

import bench.reproduce_budget as budget


def test_publish_copies_the_output_and_its_record_naming_the_command_and_commit(tmp_path, monkeypatch):
    out = tmp_path / "o" / "tiny" / "twin"
    out.mkdir(parents=True)
    (out / "reproduce.md").write_text("# A tiny paper\n\nTwin: ...\n")
    record = {"paper": "tiny", "provenance": {"commit": "0123456789abcdef" * 2 + "01234567", "dirty": True},
              "runs": [{"run": "s/p000-s0", "final": {"acc": 0.1}}]}
    (out / "reproduce.json").write_text(json.dumps(record))
    monkeypatch.setattr(budget, "RECORDS", tmp_path / "bench")
    budget.publish("tiny", argparse.Namespace(out=tmp_path / "o", seeds=3, overrides=["trainer.rounds=2"]))
    md = (tmp_path / "bench" / "tiny.md").read_text()
    first = md.splitlines()[0]
    assert first.startswith("<!-- What `python -m fl.reproduce tiny --scale twin --seeds 3 trainer.rounds=2` wrote")
    assert "at commit 0123456789ab with uncommitted changes" in first and "tiny.json" in first
    assert md.endswith("# A tiny paper\n\nTwin: ...\n")
    assert json.loads((tmp_path / "bench" / "tiny.json").read_text()) == record
