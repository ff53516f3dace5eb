"""The tests whose numbers depend on the CPU's float kernels, run once more under torch's other kernel sets
(ATEN_CPU_CAPABILITY=default, the scalar kernels, and =avx2), so that a tolerance fitted to one machine's kernels fails
where it is written, not on another machine of the kind (an AVX-512 CPU rounds bf16 at other points than an AVX2 one).

Kernel-sensitive: the tests that compare numbers across code paths under reduced precision or pin computed values
(K clients vmapped against the sequential loop, every precision path, FedPALS' solver anchors). A capability above
the CPU's own falls back to the CPU's, so on an AVX2 machine =avx2 is its native set and on an AVX-512 one it is not."""
import re

import pytest

from tests.helpers import ROOT, run_cli

KERNEL_SENSITIVE = ("tests/core/test_parallel_clients.py", "tests/core/test_precision.py",
                    "tests/methods/test_fedpals.py")
# tests in those files that compare no computed numbers (a loss is finite, a model is drawn on the CPU, a message is
# said once): they hold under any kernels and are not run again; nor is one whose kernels another test covers
NO_NUMBERS = ("test_every_method_trains_a_round_with_finite_losses",
              "test_the_initial_model_is_drawn_on_the_cpu_under_any_device_context",
              "test_an_opted_in_method_writes_its_loss_once_for_both_loops",
              "test_a_method_without_a_functional_step_runs_one_client_at_a_time_with_a_notice",
              "test_k_clients_at_once_on_a_cpu_say_once_that_they_are_meant_for_gpus",
              "test_16_mixed_trains_one_client_at_a_time_and_says_why",
              # the same float32 tolerance against the same vmapped kernels as FedAvg's test, which runs again with
              # every optimizer; the opted-in methods add element-wise terms to it (14 s under the scalar kernels)
              "test_opted_in_methods_k_clients_at_once_equal_the_sequential_loop")


def native_capability() -> str:
    """The kernel set torch picked for this CPU ("avx2", "avx512", "default", ...): the suite itself runs under it."""
    import torch

    return torch.backends.cpu.get_cpu_capability().lower()


@pytest.mark.slow
@pytest.mark.parametrize("capability", ["default", "avx2"])
def test_the_kernel_sensitive_tests_hold_under_other_cpu_kernels(capability):
    if capability == native_capability():
        pytest.skip(f"{capability} is this CPU's own kernel set: the suite has just run these tests under it")
    res = run_cli([*KERNEL_SENSITIVE, "-m", "not slow", "-k", " and ".join(f"not {t}" for t in NO_NUMBERS), "-x",
                   "-p", "no:cacheprovider"], cwd=ROOT,
                  # inductor sets TORCHINDUCTOR_CACHE_DIR in this process once it has compiled: unset, the child's
                  # conftest gives the capability a cache of its own (a vectorised kernel does not build under default)
                  env={"ATEN_CPU_CAPABILITY": capability, "TORCHINDUCTOR_CACHE_DIR": None}, script=("-m", "pytest"),
                  timeout=1200)
    assert res.returncode == 0, res.stdout[-3000:]
    ran = re.search(r"(\d+) passed", res.stdout)
    assert ran and int(ran.group(1)) >= 20 and "failed" not in res.stdout.splitlines()[-1]  # the tests ran
