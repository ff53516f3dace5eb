"""Fixtures only; what tests import (constants, runs, checkpoints, patches) is in tests/helpers.py."""
import getpass
import os
import tempfile

from fl.run.cpu_threads import NUM_THREADS, share_of_cores, sleep_at_barriers

# Before torch loads (fl/run/cpu_threads.py): OpenMP threads that sleep at barriers and, under pytest-xdist, each
# worker's share of the cores, for its in-process runs and the processes its tests start; the environment's win
sleep_at_barriers()
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    os.environ.setdefault(NUM_THREADS, str(share_of_cores(int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))))
# torch's inductor keys its kernel cache without the ATen CPU capability: a kernel compiled under the machine's own
# (vectorised) is reused under ATEN_CPU_CAPABILITY=default, whose precompiled header lacks at::vec, and fails to build;
# a session that sets the capability compiles into a cache of its own
if os.environ.get("ATEN_CPU_CAPABILITY"):
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(
        tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}_{os.environ['ATEN_CPU_CAPABILITY']}"))

import pytest  # noqa: E402
import torch  # noqa: E402

from tests import helpers  # noqa: E402


@pytest.fixture
def out(tmp_path):
    """Output dir and the data cache live in the test's tmp dir."""
    return tmp_path


@pytest.fixture(scope="session")
def shared_data_root(tmp_path_factory):
    """A data root the tests of one pytest process share, for tests that build large generated twins: each shape of
    images is generated once and read from the cache after (fl/data/embedded.py; the generation itself is
    tests/data/test_generated_bitwise.py's)."""
    return tmp_path_factory.mktemp("shared-data")


@pytest.fixture(autouse=True)
def _restore_threads():
    """In-process runs pin the intra-op thread count (fabric.cpu_threads); give the session its own back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _processes_only_in_slow_tests(request):
    """helpers.run_cli refuses to start a process in a test that is not marked slow, so `-m "not slow"`
    stays free of processes."""
    helpers.current_test_is_slow = request.node.get_closest_marker("slow") is not None
    yield
    helpers.current_test_is_slow = None


@pytest.fixture(autouse=True)
def _rank_zero_restored():
    """Lightning's process-wide rank for its rank-zero-only calls: a test that builds Fabric under a launcher's
    environment sets it (tests/run/test_multinode.py's torchrun RANK=1 test leaves it at 1), and every later run in
    that pytest worker then logs nothing to its metrics.jsonl (JsonlLogger's writes are rank-zero-only)."""
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    rank = getattr(rank_zero_only, "rank", 0)
    yield
    rank_zero_only.rank = rank
