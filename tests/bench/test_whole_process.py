"""bench/fedavg_overhead.py --whole-process compares fl with bench/bare_fedavg.py only if both do the same work: the
bare script's per-client and pooled accuracies must be fl's, which whole_process checks every repeat (and refuses to
report a ratio otherwise)."""
import pytest

from bench import fedavg_overhead


@pytest.mark.slow
def test_the_bare_script_does_fls_work_and_every_phase_is_timed():
    w = fedavg_overhead.whole_process(rounds=2, repeats=1, warm_up=False)
    assert w["same_accuracies"] and w["clients"] == 20
    assert set(w["fl"]) == set(w["fl_plots"]) == {*fedavg_overhead.PHASES, "total"}
    assert set(w["bare"]) == {*fedavg_overhead.BARE_PHASES, "total"}
    assert len(w["fl_pair_ratios"]) == len(w["fl_plots_pair_ratios"]) == 1
    for side in ("fl", "fl_plots", "bare"):
        phases = {k: v for k, v in w[side].items() if k != "total"}
        assert all(v >= 0 for v in phases.values())
        assert sum(phases.values()) == pytest.approx(w[side]["total"], rel=0.05)
