"""`--check` off the recording kernels (issue 46 item 5): bit for bit where the float kernels are the recording's,
otherwise every value within SPREADS standard deviations of its recorded seeds, each moved value's largest difference
printed, and every value beyond its tolerance listed."""
from __future__ import annotations

import statistics

from fl.reproduce.check import SPREADS, differences, same_kernels, seed_spread, within_seed_spread
from fl.reproduce.record import cpu_info

AVX2 = {"versions": {"torch": "2.14.1"}, "machine": "x86_64", "cpu_capability": "AVX2",
        "aten_cpu_capability_env": None, "cpu": {"model": "AMD EPYC", "flags": ["avx", "avx2", "fma"]}}


def test_the_kernels_are_the_same_only_with_the_same_torch_capability_and_flags():
    assert same_kernels(AVX2, dict(AVX2)) is None
    avx512 = {**AVX2, "cpu_capability": "AVX512", "cpu": {"model": "Xeon", "flags": ["avx", "avx2", "avx512f"]}}
    said = same_kernels(AVX2, avx512)
    assert "torch's CPU capability AVX2 then, AVX512 now" in said and "CPU flags avx avx2 fma then" in said
    assert "ATEN_CPU_CAPABILITY None then, default now" in same_kernels(AVX2, {**AVX2,
                                                                               "aten_cpu_capability_env": "default"})
    old_record = {k: v for k, v in AVX2.items() if k != "cpu"}  # made before the CPU was recorded
    assert same_kernels(old_record, AVX2) is None
    assert set(cpu_info()) == {"model", "flags"}


def entry(seed: int, acc: float, cell: float, bytes_up: float = 10.0) -> dict:
    return {"run": f"sweep/p000-s{seed}", "sweep": "s.yaml", "point": {"method.name": "fedavg"},
            "overrides": ["method.name=fedavg", f"seed={seed}"], "status": "finished",
            "final": {"test/acc": acc, "comm/bytes_up": bytes_up, "time/round_s": 1.0 + seed},
            "selected": {"t1/c1/fedavg": cell}}


DOC = {"runs": [entry(0, 0.40, 40.0), entry(1, 0.42, 42.0), entry(2, 0.44, 44.0),
                {**entry(0, 0.9, 90.0), "point": {"method.name": "other"}, "run": "sweep/p001-s0"}]}


def test_the_seed_spread_is_over_the_same_point_and_its_other_seeds():
    spread = seed_spread(DOC, DOC["runs"][0])
    assert spread["final test/acc"] == statistics.stdev([0.40, 0.42, 0.44])
    assert spread["cell t1/c1/fedavg"] == statistics.stdev([40.0, 42.0, 44.0]) and spread["final comm/bytes_up"] == 0
    assert "final time/round_s" not in spread  # wall-clock: never compared


def rerun(acc: float, cell: float, bytes_up: float = 10.0) -> dict:
    return {"final test/acc": acc, "final comm/bytes_up": bytes_up, "cell t1/c1/fedavg": cell}


def test_values_within_the_seed_spread_pass_and_each_moved_values_largest_difference_is_printed(capsys, tmp_path):
    first = DOC["runs"][0]
    assert within_seed_spread(DOC, [(first, rerun(0.43, 41.0))], "flags differ", 3, tmp_path) == 0
    out = capsys.readouterr().out
    assert "not bit for bit (docs/reproduce.md)" in out and f"within {SPREADS} standard deviations" in out
    assert "  final test/acc: 0.03 (tolerance 0.06; sweep/p000-s0)" in out
    assert "  cell t1/c1/fedavg: 1 (tolerance 6; sweep/p000-s0)" in out


def test_every_value_beyond_its_tolerance_is_listed_and_an_exact_one_must_stay_exact(capsys, tmp_path):
    first = DOC["runs"][0]
    assert within_seed_spread(DOC, [(first, rerun(0.50, 47.0, bytes_up=11.0))], "flags differ", 3, tmp_path) == 1
    out = capsys.readouterr().out
    assert "DIFFERS beyond the tolerance: 3 value(s):" in out
    assert "final test/acc: recorded 0.4, now 0.5; |difference| 0.1 > 3 x its seed std 0.02" in out
    assert "final comm/bytes_up: recorded 10.0, now 11.0; |difference| 1 > 3 x its seed std 0" in out
    assert "cell t1/c1/fedavg: recorded 40.0, now 47.0" in out


def test_a_point_of_one_seed_has_no_spread_to_judge_by(capsys, tmp_path):
    alone = DOC["runs"][3]
    assert within_seed_spread(DOC, [(alone, {**rerun(0.91, 90.0)})], "flags differ", 3, tmp_path) == 1
    assert "no recorded seed spread to judge it by (one seed of its point)" in capsys.readouterr().out


def test_differences_name_every_value_absent_on_one_side():
    assert differences({"a": 1.0, "b": 2.0}, {"a": 1.0, "c": 3.0}) == [("b", 2.0, "absent"), ("c", "absent", 3.0)]
