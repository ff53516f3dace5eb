"""The README's examples work: "Adding a method" registered under a test name runs and keeps its persistent attribute
per client across rounds; "Datasets larger than memory" maps the pool and runs as the pool in memory does."""
import re
import shlex
from pathlib import Path

import pytest

from fl.core import sample_clients
from tests.helpers import load_ckpt, read_metrics, run_cli, run_tiny

README = Path(__file__).resolve().parent.parent / "README.md"


def test_the_add_a_method_example_registers_and_runs(out):
    section = README.read_text().split("## Adding a method", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    exec(compile(code.replace('"mymethod"', '"readme_example"'), "README.md", "exec"), {})
    run_dir = run_tiny(out, "method.name=readme_example", "method.server_lr=0.5", name="readme")
    rows = read_metrics(run_dir)
    assert all(f"client/{c}/ce" in rows[0] for c in sample_clients(0, 0, 6, 0.5))
    visits = {c: sum(c in sample_clients(0, r, 6, 0.5) for r in range(3)) for c in range(6)}
    clients = load_ckpt(run_dir)["clients"]
    assert {c: s["visits"] for c, s in clients.items()} == {c: v for c, v in visits.items() if v}


@pytest.mark.slow
def test_the_larger_than_memory_example_maps_the_pool_and_runs_as_the_pool_in_memory(out):
    section = README.read_text().split("**Datasets larger than memory**", 1)[1].split("**Bring your own data**")[0]
    commands = [shlex.split(line) for line in re.search(r"```bash\n(.*?)```", section, re.S).group(1).splitlines()]
    assert [c[:3] for c in commands] == [["python", "-m", "fl.train"]] * 2
    runs = [run_cli(c[3:] + ["logger.wandb.mode=disabled", "logger.progress=false"], cwd=out) for c in commands]
    assert [r.returncode for r in runs] == [0, 0], runs[0].stderr[-2000:] + runs[1].stderr[-2000:]
    printed = " ".join(re.search(r"prints `(data: .*?)`", section, re.S).group(1).split())
    assert re.search(re.escape(printed).replace("<hash>", r"\w+"), runs[0].stderr), runs[0].stderr[-2000:]
    assert "memory-mapped" not in runs[1].stderr and (out / "data" / "embedded" / ".fl_cache").is_dir()
    mapped, in_memory = (read_metrics(out / "outputs" / c[-1].split("=")[1]) for c in commands)
    assert mapped == in_memory and len(mapped) == 2
