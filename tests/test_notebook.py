"""notebooks/compare.ipynb executes on runs made by short quickstarts, so it never rots.

The kernel is this interpreter (a kernel spec written to a temporary JUPYTER_PATH), so the test needs no
installed Jupyter kernel and no network."""
import json
import sys

import pytest

from tests.helpers import ROOT, run_cli, tiny

nbformat = pytest.importorskip("nbformat", reason="the dev extra (pip install -e '.[dev]') brings nbformat")
nbclient = pytest.importorskip("nbclient", reason="the dev extra brings nbclient")
pytest.importorskip("ipykernel", reason="the dev extra brings ipykernel")

pytestmark = pytest.mark.slow  # quickstart processes and a notebook kernel


def test_compare_notebook_executes_on_quickstart_runs(tmp_path, monkeypatch):
    for method, seed in (("fedavg", 0), ("fedavg", 1), ("fedprox", 0)):
        res = run_cli(tiny(tmp_path, f"method.name={method}", f"seed={seed}", "trainer.rounds=2",
                           "fabric.cpu_threads=1", f"logger.run_name={method}-s{seed}"), cwd=tmp_path)
        assert res.returncode == 0, res.stderr
    spec = tmp_path / "jupyter" / "kernels" / "fl-test"
    spec.mkdir(parents=True)
    spec.joinpath("kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "fl test", "language": "python"}))
    for key, value in {"JUPYTER_PATH": str(tmp_path / "jupyter"), "JUPYTER_RUNTIME_DIR": str(tmp_path / "rt"),
                       "FL_COMPARE_RUNS": str(tmp_path / "outputs"), "FL_COMPARE_OUT": str(tmp_path / "report"),
                       "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("FL_COMPARE_WANDB", raising=False)

    nb = nbformat.read(ROOT / "notebooks" / "compare.ipynb", as_version=4)
    nbclient.NotebookClient(nb, kernel_name="fl-test", timeout=240,
                            resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()

    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    text = "\n".join(o.get("text", "") + json.dumps(o.get("data", {}), ensure_ascii=False) for o in outputs)
    assert "3 runs in 2 groups" in text
    assert "| embedded/dirichlet | fedavg | 2 |" in text and "| embedded/dirichlet | fedprox | 1 |" in text
    summaries = {p.parent.name: json.loads(p.read_text()) for p in (tmp_path / "outputs").glob("*/summary.json")}
    finals = [summaries[f"fedavg-s{s}"]["final"]["test/acc_mean_clients"] for s in (0, 1)]
    mean = sum(finals) / 2
    assert f"{100 * mean:.1f} ± " in text  # the table's fedavg cell (percent) is the mean of the two runs' summary.json
    assert any("image/png" in o.get("data", {}) for o in outputs)
    for name in ("report.md", "report.tex", "report.html"):
        assert (tmp_path / "report" / name).is_file()
