"""notebooks/compare.ipynb executes on runs made by short quickstarts, so it never rots; it counts a seed run twice
once, as fl.report does, and writes its report beside itself, under notebooks/outputs/ (git-ignored).

The kernel is this interpreter (a kernel spec written to a temporary JUPYTER_PATH), so the test needs no
installed Jupyter kernel and no network."""
import json
import shutil
import subprocess
import sys

import pytest

from fl.run.train import main
from tests.helpers import ROOT, tiny

nbformat = pytest.importorskip("nbformat", reason="the dev extra (pip install -e '.[dev]') brings nbformat")
nbclient = pytest.importorskip("nbclient", reason="the dev extra brings nbclient")
pytest.importorskip("ipykernel", reason="the dev extra brings ipykernel")

pytestmark = pytest.mark.slow  # a notebook kernel


def test_compare_notebook_executes_on_quickstart_runs(tmp_path, monkeypatch):
    # fedavg seed 0 twice: the second run (fedavg-s0-again) is the one counted
    for method, seed, name in (("fedavg", 0, "fedavg-s0"), ("fedavg", 1, "fedavg-s1"), ("fedprox", 0, "fedprox-s0"),
                               ("fedavg", 0, "fedavg-s0-again")):
        assert main(tiny(tmp_path, f"method.name={method}", f"seed={seed}", "trainer.rounds=2",
                         "fabric.cpu_threads=1", f"logger.run_name={name}")) == 0
    spec = tmp_path / "jupyter" / "kernels" / "fl-test"
    spec.mkdir(parents=True)
    spec.joinpath("kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "fl test", "language": "python"}))
    for key, value in {"JUPYTER_PATH": str(tmp_path / "jupyter"), "JUPYTER_RUNTIME_DIR": str(tmp_path / "rt"),
                       "FL_COMPARE_RUNS": str(tmp_path / "outputs"), "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg",
                       "OMP_NUM_THREADS": "1"}.items():
        monkeypatch.setenv(key, value)
    for key in ("FL_COMPARE_WANDB", "FL_COMPARE_OUT"):
        monkeypatch.delenv(key, raising=False)

    folder = tmp_path / "notebooks"  # a copy, so that its default output folder is the test's, not the checkout's
    folder.mkdir()
    shutil.copy(ROOT / "notebooks" / "compare.ipynb", folder)
    nb = nbformat.read(folder / "compare.ipynb", as_version=4)
    nbclient.NotebookClient(nb, kernel_name="fl-test", timeout=240,
                            resources={"metadata": {"path": str(folder)}}).execute()

    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    text = "\n".join(o.get("text", "") + json.dumps(o.get("data", {}), ensure_ascii=False) for o in outputs)
    assert "3 runs in 2 groups" in text and "1 more run(s) repeat a counted run's setting, variant and seed" in text
    assert "| embedded/dirichlet | fedavg | 2‡ |" in text and "| embedded/dirichlet | fedprox | 1 |" in text
    assert "kept fedavg-s0-again" in text and "left out fedavg-s0 (" in text
    summaries = {p.parent.name: json.loads(p.read_text()) for p in (tmp_path / "outputs").glob("*/summary.json")}
    finals = [summaries[name]["final"]["test/acc_mean_clients"] for name in ("fedavg-s0-again", "fedavg-s1")]
    mean = sum(finals) / 2
    assert f"{100 * mean:.1f} ± " in text  # the table's fedavg cell (percent) is the mean of the two runs' summary.json
    assert any("image/png" in o.get("data", {}) for o in outputs)
    for name in ("report.md", "report.tex", "report.html"):
        assert (folder / "outputs" / "report" / name).is_file()
    assert "‡ a seed run more than once" in (folder / "outputs" / "report" / "report.md").read_text()
    ignored = subprocess.run(["git", "check-ignore", "-q", "notebooks/outputs/report/report.md"], cwd=ROOT)
    assert ignored.returncode == 0  # what the notebook writes in a checkout is git-ignored
