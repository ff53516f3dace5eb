"""Fixtures only; what tests import (constants, runs, checkpoints, patches) is in tests/helpers.py."""
import pytest
import torch

from tests import helpers


@pytest.fixture
def out(tmp_path):
    """Output dir and the data cache live in the test's tmp dir."""
    return tmp_path


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
