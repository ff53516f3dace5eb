"""Seeding (fl/core/seeding.py): derived seeds, and the client-sampling stream they drive."""
from fl.core.loop import sample_clients
from fl.core.seeding import derive_seed


def test_derived_seeds_depend_on_every_part():
    base = derive_seed(0, 1, 2, "train")
    assert base == derive_seed(0, 1, 2, "train")
    assert len({base, derive_seed(1, 1, 2, "train"), derive_seed(0, 2, 2, "train"),
                derive_seed(0, 1, 3, "train"), derive_seed(0, 1, 2, "eval")}) == 5


def test_client_sampling_is_a_fixed_stream():
    a = [sample_clients(3, r, 100, 0.1) for r in range(5)]
    assert a == [sample_clients(3, r, 100, 0.1) for r in range(5)]
    assert all(len(s) == 10 and s == sorted(set(s)) for s in a)
    assert a[0] != a[1]
    assert sample_clients(0, 0, 7, 1.0) == list(range(7))
    assert len(sample_clients(0, 0, 7, 0.01)) == 1
