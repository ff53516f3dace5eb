"""The README's "Adding a method" example is code that works: registered under a test name, it runs, and its
persistent attribute is kept per client across rounds."""
import re
from pathlib import Path

from fl.core import sample_clients
from tests.helpers import load_ckpt, read_metrics, run_tiny

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
