"""The disk-backed client state store (state.cache_mb, fl/core/state.py): the LRU cache and its budget, read-ahead,
incremental checkpoints that write only the states changed since the last one and keep the files the last two
checkpoints name; runs bitwise identical to the in-memory store (Ditto's personal models, SCAFFOLD's control
variates, kept momentum); Ctrl-C, SIGKILL (also inside a state file's write) and a full disk leave a resumable run
whose metrics equal an uninterrupted run's; 1 and 2 processes, and a resume with another number of processes. Each
run's files in a namespace of its own, stamped with its run id and checked when read; one live run per namespace
(locks); damaged, missing or foreign files and a vanished state.dir in one line, and resume falling back to
previous.ckpt."""
import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import fl.core.loop as loop_module
import fl.core.state as state_module
import tests.keep_momentum  # noqa: F401  (registers method test_keep_momentum)
from fl.core.state import DiskStateStore, StateStoreError, state_bytes, write_error
from fl.core.state_lock import NamespaceLock, StateDirInUse, namespace_in_use
from fl.run.train import main
from tests.helpers import (
    ROOT,
    assert_same_rows,
    client_states,
    ctrl_c_at_round,
    global_params,
    interrupted_and_resumed,
    load_ckpt,
    read_metrics,
    run_cli,
    run_tiny,
    same_private_states,
    tiny,
)
from tests.process_pairs import on_one_and_two_processes

DISK = "state.cache_mb=0.001"  # 1 KiB: every state goes to disk as soon as it is stored
RUN = "0123abcd"  # a run id, for stores made by hand


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def fake_state(value: float, n: int = 256) -> dict:
    return {"private": {"w": torch.full((n,), float(value))}, "count": int(value)}  # 1 KiB of tensors


def everyone(cid: int) -> bool:
    return True


def files(folder: Path) -> set[str]:
    return {p.name for p in folder.glob("client*.pt")}


# ---- the store -----------------------------------------------------------------------------------------------------
def test_lru_cache_keeps_its_budget_and_writes_each_state_once(tmp_path):
    store = DiskStateStore(tmp_path, cache_bytes=2 * 1024, owns=everyone, run=RUN)  # room for two states
    store.update({c: fake_state(c) for c in range(4)}, rnd=0)
    assert store.cached_bytes <= 2 * 1024 and store.files_written == 2  # clients 0 and 1 were evicted
    assert files(tmp_path) == {f"client000000-r000000-{RUN}.pt", f"client000001-r000000-{RUN}.pt"}
    for c in (0, 3, 1, 2):  # read back from disk or cache, equal either way
        s = store.get(c)
        assert torch.equal(s["private"]["w"], torch.full((256,), float(c))) and s["count"] == c
    assert store.cached_bytes <= 2 * 1024
    assert store.get(99) is None  # never stored: a first visit
    store.prefetch(0)  # read ahead in the background, then served from that read
    assert store.get(0)["count"] == 0
    store.close()


def test_checkpoints_write_only_what_changed_and_keep_the_last_two(tmp_path):
    store = DiskStateStore(tmp_path, cache_bytes=10**9, owns=everyone, run=RUN)  # nothing evicted: writes are
    store.update({c: fake_state(c) for c in range(5)}, rnd=0)                   # checkpoints'
    assert store.files_written == 0
    first = store.state_dict()
    store.checkpointed()
    assert store.files_written == 5 and first == {c: {"round": 0, "run": RUN} for c in range(5)}
    store.update({1: fake_state(10), 3: fake_state(30)}, rnd=1)
    second = store.state_dict()
    store.checkpointed()
    assert store.files_written == 7  # only the two changed states
    assert second[1] == {"round": 1, "run": RUN} and second[0] == {"round": 0, "run": RUN}
    store.update({1: fake_state(100)}, rnd=2)
    store.state_dict()
    store.checkpointed()
    # client 1: round 2 (this checkpoint) and round 1 (the previous one); round 0 is named by neither
    assert {f for f in files(tmp_path) if f.startswith("client000001")} == {f"client000001-r000001-{RUN}.pt",
                                                                             f"client000001-r000002-{RUN}.pt"}
    assert {f for f in files(tmp_path) if f.startswith("client000003")} == {f"client000003-r000001-{RUN}.pt"}
    assert len(files(tmp_path)) == 6  # clients 0, 2, 4 at round 0; 1 at rounds 1 and 2; 3 at round 1
    store.close()


@pytest.mark.parametrize("nodes, advice", [(1, "they were deleted or moved: put them back, or start the run again"),
                                           (2, "resume with the processes and nodes that wrote them, or give every "
                                               "process a state.dir that holds all of them (a shared filesystem)")])
def test_a_resume_missing_state_files_is_one_line_with_the_advice_that_fits(tmp_path, nodes, advice):
    """On one node the files can only have been deleted or moved; across nodes, another node may hold them."""
    store = DiskStateStore(tmp_path, cache_bytes=0, owns=everyone, run=RUN, nodes=nodes)
    with pytest.raises(StateStoreError) as err:
        store.load_state_dict({4: {"round": 3, "run": RUN}}, everyone)
    assert str(err.value) == (f"state.dir {tmp_path} lacks 1 client state file(s) the checkpoint names, e.g. "
                              f"client000004-r000003-{RUN}.pt: {advice}")


def test_a_failed_background_write_waits_for_the_writes_behind_it_before_it_raises(tmp_path, monkeypatch):
    save = torch.save

    def save_failing(obj, path, *args, **kwargs):
        if obj["state"]["count"] == 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        if obj["state"]["count"] == 1:  # still writing when client 0's error is found
            Path(path).write_bytes(b"\x80half")
            time.sleep(0.3)
            raise OSError(errno.ENOSPC, "No space left on device")
        return save(obj, path, *args, **kwargs)

    monkeypatch.setattr(state_module.torch, "save", save_failing)
    store = DiskStateStore(tmp_path, cache_bytes=0, owns=everyone, run=RUN)
    store.stage(0, fake_state(0), rnd=0)
    store.stage(1, fake_state(1), rnd=0)
    time.sleep(0.1)  # client 1's half file is on disk
    with pytest.raises(StateStoreError, match="the disk is full"):
        store.stage(2, fake_state(2), rnd=0)
    assert not list(tmp_path.glob("*.tmp"))  # client 1's write finished (and cleaned up) before the error surfaced
    store.close()


@pytest.mark.parametrize("memory, store, warned", [(1024, (), True), (1024, (DISK,), False), (None, (), False)])
def test_states_that_would_outgrow_memory_are_announced_after_the_first_round(out, monkeypatch, capsys, memory, store,
                                                                              warned):
    if memory is not None:  # a machine with 1 KiB of memory; None: this one
        monkeypatch.setattr(loop_module, "host_memory_bytes", lambda: memory)
    run_tiny(out, "method.name=ditto", *store, name="run")
    err = capsys.readouterr().err
    assert err.count("warning: the client states will take about") == int(warned)
    if warned:
        assert "(6 clients x" in err and "state.cache_mb=2048" in err


def test_state_bytes_counts_nested_tensors():
    assert state_bytes({"a": torch.zeros(3), "b": [torch.zeros(2, dtype=torch.float64)], "c": 1}) == 12 + 16


# ---- runs ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", [["method.name=ditto"], ["method.name=scaffold"],
                                    ["method.name=test_keep_momentum", "optim.momentum=0.9"]],
                         ids=["ditto", "scaffold", "kept_momentum"])
def test_disk_store_runs_are_bitwise_the_in_memory_runs(out, method):
    extra = ("trainer.rounds=4", "trainer.checkpoint_every=3", *method)
    mem = run_tiny(out, *extra, name="mem")
    disk = run_tiny(out, *extra, DISK, name="disk")
    assert read_metrics(disk) == read_metrics(mem)
    ga, gb = global_params(mem), global_params(disk)
    assert all(torch.equal(ga[k], gb[k]) for k in ga)
    sa, sb = client_states(mem), client_states(disk)
    assert same_private_states(sa, sb) and sa
    assert all(set(s) == {"round", "run"} for s in load_ckpt(disk)["clients"].values())  # names files, no tensors


def test_ctrl_c_then_resume_with_the_disk_store_equals_an_uninterrupted_run(out, monkeypatch):
    extra = ("method.name=ditto", "trainer.rounds=5", "trainer.checkpoint_every=1", DISK)
    full, cut = interrupted_and_resumed(out, monkeypatch, *extra, at_round=3)
    assert read_metrics(cut) == read_metrics(full)
    assert same_private_states(client_states(cut), client_states(full))


@pytest.mark.parametrize("full_as", ["enospc", "torch"])
def test_a_full_disk_stops_in_one_line_and_the_last_checkpoint_resumes(out, monkeypatch, capsys, full_as):
    """A full disk as an OSError, and as torch reports it when a write comes up short (`[enforce fail at
    inline_container.cc] unexpected pos`: torch writing to /dev/full)."""
    extra = ("method.name=ditto", "trainer.rounds=5", "trainer.checkpoint_every=2", DISK)
    full = run_tiny(out, *extra, name="full")
    save, calls = torch.save, []

    def save_until_full(obj, path, *args, **kwargs):
        calls.append(path)
        if len(calls) > 8:  # round 0-1's states and the first checkpoint fit, then the disk is full
            Path(path).write_bytes(b"\x80half")  # what a write cut short leaves
            if full_as == "torch":
                return save(obj, "/dev/full", *args, **kwargs)
            raise OSError(errno.ENOSPC, "No space left on device")
        return save(obj, path, *args, **kwargs)

    monkeypatch.setattr(state_module.torch, "save", save_until_full)
    capsys.readouterr()
    assert main(tiny(out, "fabric.cpu_threads=1", "logger.run_name=full_disk", *extra)) == 1
    err = capsys.readouterr().err.strip().splitlines()
    run = out / "outputs" / "full_disk"
    assert len(err) == 1 and f"state.dir {run / 'client_states'}" in err[0] and "the disk is full" in err[0]
    assert "resumable" in err[0]
    assert not list((run / "client_states").glob("*.tmp"))  # the cut-short file is gone
    monkeypatch.setattr(state_module.torch, "save", save)
    assert main([f"resume={run}"]) == 0
    assert read_metrics(run) == read_metrics(full)


def test_an_unwritable_state_dir_is_one_line_before_anything_is_written(out, capsys):
    blocked = out / "blocked"
    blocked.write_text("a file, not a directory")
    capsys.readouterr()
    assert main(tiny(out, "logger.run_name=nope", "state.cache_mb=1", f"state.dir={blocked / 'states'}")) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"state.dir {blocked / 'states'} is not writable" in err[0]
    assert not (out / "outputs" / "nope").exists()


@pytest.mark.slow
def test_sigkill_inside_a_state_file_write_then_resume_equals_an_uninterrupted_run(out, capsys):
    """The killer dies half-way through writing a client state file in round 3: the half file is a .tmp no
    checkpoint names, and the resumed run (in this process) ends where an uninterrupted one does."""
    common = ("method.name=ditto", "trainer.rounds=6", "trainer.checkpoint_every=2", DISK)
    full = run_tiny(out, *common, name="full")
    res = run_cli(tiny(out, "fabric.cpu_threads=1", *common, "logger.run_name=killed"), cwd=out,
                  env={"FL_TEST_KILL_WRITE_ROUND": "3"}, script=(str(ROOT / "tests" / "killer.py"),))
    assert res.returncode == -signal.SIGKILL
    killed = out / "outputs" / "killed"
    assert load_ckpt(killed)["round"] == 1 and list((killed / "client_states").glob("*.tmp"))
    assert [p.name for p in (killed / "client_states").glob("*.lock")] == ["rank0.lock"]  # its holder is dead
    capsys.readouterr()
    assert main([f"resume={killed}"]) == 0
    err = capsys.readouterr().err
    assert "notice: took over the stale lock" in err and "which has ended" in err
    assert not list((killed / "client_states").glob("*.lock"))
    assert read_metrics(killed) == read_metrics(full)
    assert same_private_states(client_states(killed), client_states(full))


@on_one_and_two_processes("disk_store_ditto", "method.name=ditto", "trainer.rounds=4", "data.num_clients=7",
                          "trainer.participation=0.6", "trainer.checkpoint_every=2", DISK)
def disk_store_same_on_one_and_two_processes_and_resumable_on_one(one: Path, two: Path) -> None:
    """ddp on 2 processes with the disk store: the same run as 1 process (each process wrote only the files of the
    clients it owns, cid % 2), and with the shared state.dir a 1-process resume continues it."""
    assert_same_rows(read_metrics(one), read_metrics(two), abs=1e-5)
    sa, sb = client_states(one), client_states(two)
    assert sa.keys() == sb.keys()
    for c in sa:
        for k, v in sa[c]["private"].items():
            torch.testing.assert_close(sb[c]["private"][k], v, rtol=0, atol=1e-5)
    assert not list((two / "client_states").glob("*.lock"))  # each process held its own while it ran
    res = run_cli([f"resume={two}", "trainer.rounds=6"], cwd=two.parent.parent)  # 2 processes wrote it, 1 continues
    assert res.returncode == 0, res.stderr[-2000:]
    assert load_ckpt(two)["round"] == 5


def test_a_resume_with_another_process_count_without_the_files_is_one_line(out, capsys):
    run = run_tiny(out, "method.name=ditto", "trainer.rounds=2", DISK, name="moved")
    for f in (run / "client_states").glob("client000001-*.pt"):  # a node whose files this machine lacks
        os.remove(f)
    capsys.readouterr()
    assert main([f"resume={run}", "trainer.rounds=3"]) == 2
    err = one_error_line(capsys)
    assert "lacks 1 client state file" in err and "client000001-r" in err


# ---- one run's files: namespaces, identity, locks (issue 26, item 1) -------------------------------------------------
def named_file(folder: Path, cid: int, rnd: int) -> Path:
    """Client cid's file of round rnd in a namespace (one run's files there)."""
    found = list(folder.glob(f"client{cid:06d}-r{rnd:06d}*.pt"))
    assert len(found) == 1, found
    return found[0]


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("other", [["seed=1"], ["optim.lr=0.1"]], ids=["other_seed", "same_seed_other_lr"])
def test_a_run_sharing_its_state_dir_with_a_later_run_resumes_to_its_uninterrupted_numbers(out, monkeypatch, other):
    """Run A is stopped after round 2's checkpoint, run B runs to its end with the same state.dir, then A resumes: A
    ends where an uninterrupted A does (before namespaces, B deleted A's files or overwrote them with its own)."""
    common = ("method.name=ditto", "trainer.rounds=5", "trainer.checkpoint_every=1")
    shared = (DISK, f"state.dir={out / 'shared'}")
    full = run_tiny(out, *common, name="full")
    undo = ctrl_c_at_round(monkeypatch, 3)
    assert main(tiny(out, "fabric.cpu_threads=1", "logger.run_name=a", *common, *shared)) == 130
    undo()
    run_tiny(out, *common, *shared, *other, name="b")
    a = out / "outputs" / "a"
    assert main([f"resume={a}"]) == 0
    assert read_metrics(a) == read_metrics(full)
    assert same_private_states(client_states(a, out / "shared"), client_states(full))
    assert sorted(p.name for p in (out / "shared").iterdir()) == ["a", "b"]  # each run's files in its own folder


@pytest.mark.parametrize("source", ["another_client", "another_run"])
def test_a_state_file_copied_over_the_one_a_checkpoint_names_is_refused_on_resume(out, capsys, source):
    """Client c's file replaced by another client's of the same round, or by the same client's file of another run
    (same seed, another lr): the resume stops in one line naming the file, instead of training the wrong model."""
    a = run_tiny(out, "method.name=ditto", "trainer.rounds=2", DISK, name="a")  # one checkpoint: no fallback
    named = load_ckpt(a)["clients"]
    same_round = [c for c in named if named[c]["round"] == 1]
    victim = same_round[0]
    if source == "another_client":
        donor = named_file(a / "client_states", same_round[1], 1)
    else:
        b = run_tiny(out, "method.name=ditto", "trainer.rounds=2", "optim.lr=0.1", DISK, name="b")
        donor = named_file(b / "client_states", victim, 1)
    target = named_file(a / "client_states", victim, 1)
    target.write_bytes(donor.read_bytes())
    capsys.readouterr()
    assert main([f"resume={a}", "trainer.rounds=3"]) == 2
    line = one_error_line(capsys)
    assert str(target) in line and "copied or renamed" in line
    assert load_ckpt(a)["round"] == 1  # nothing trained on it


def test_checkpointed_deletes_only_this_runs_files_of_its_own_clients(tmp_path):
    """A namespace shared anyway (a run dir's name reused): another run's files, and this run's files of clients
    another process owns, survive this process's clean-up."""
    mine = DiskStateStore(tmp_path, cache_bytes=0, owns=lambda c: c % 2 == 0, run=RUN)
    theirs = DiskStateStore(tmp_path, cache_bytes=0, owns=everyone, run="feedbeef")
    theirs.update({c: fake_state(c) for c in range(2)}, rnd=0)
    theirs.state_dict()
    other_process = DiskStateStore(tmp_path, cache_bytes=0, owns=lambda c: c % 2 == 1, run=RUN)
    other_process.update({1: fake_state(1)}, rnd=0)
    other_process.state_dict()
    before = files(tmp_path)
    for rnd in range(3):  # client 0's rounds 0 and 1 go as newer checkpoints replace them
        mine.update({0: fake_state(rnd)}, rnd=rnd)
        mine.state_dict()
        mine.checkpointed()
    assert files(tmp_path) == before | {f"client000000-r000001-{RUN}.pt", f"client000000-r000002-{RUN}.pt"}
    for store in (mine, theirs, other_process):
        store.close()


def test_a_checkpoint_naming_files_without_a_run_identity_is_one_line(out, capsys):
    """A checkpoint written before runs had their own files (entries {"round": r}): refused in one line saying what
    to do, not read from files no run can vouch for."""
    a = run_tiny(out, "method.name=ditto", "trainer.rounds=2", DISK, name="a")
    ckpt = torch.load(a / "checkpoints" / "last.ckpt", weights_only=False)
    ckpt["clients"] = {cid: {"round": s["round"]} for cid, s in ckpt["clients"].items()}
    torch.save(ckpt, a / "checkpoints" / "last.ckpt")
    capsys.readouterr()
    assert main([f"resume={a}", "trainer.rounds=3"]) == 2
    line = one_error_line(capsys)
    assert "without a run identity" in line and "start it again" in line and "last.ckpt" in line


def dead_pid() -> int:
    pid = int(Path("/proc/sys/kernel/pid_max").read_text()) - 1
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            pass
        pid -= 1


def write_lock(folder: Path, rank: int, **holder) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"rank{rank}.lock"
    path.write_text(json.dumps({"host": socket.gethostname(), **holder}))
    return path


def test_a_namespace_lock_has_one_holder_per_rank_and_is_gone_once_released(tmp_path):
    rank0, rank1 = NamespaceLock(tmp_path, 0), NamespaceLock(tmp_path, 1)
    assert rank0.acquire() is None and rank1.acquire() is None  # two processes of one run
    with pytest.raises(StateDirInUse, match=rf"in use by another run \(pid {os.getpid()} on this host, rank0.lock\)"):
        NamespaceLock(tmp_path, 0).acquire()  # a second run's rank 0
    assert f"pid {os.getpid()}" in namespace_in_use(tmp_path)
    rank0.release()
    rank1.release()
    assert not list(tmp_path.glob("*.lock")) and namespace_in_use(tmp_path) is None
    again = NamespaceLock(tmp_path, 0)
    assert again.acquire() is None
    again.release()


def test_a_stale_lock_on_this_host_is_taken_over_and_one_from_another_host_is_refused(tmp_path):
    pid = dead_pid()
    write_lock(tmp_path, 0, pid=pid)
    assert namespace_in_use(tmp_path) is None
    lock = NamespaceLock(tmp_path, 0)
    notice = lock.acquire()
    assert notice.startswith("notice: took over the stale lock") and f"pid {pid} on this host" in notice
    assert json.loads((tmp_path / "rank0.lock").read_text())["pid"] == os.getpid()
    lock.release()
    path = write_lock(tmp_path, 0, pid=1234, host="elsewhere.example")
    with pytest.raises(StateDirInUse) as refused:
        NamespaceLock(tmp_path, 0).acquire()
    assert "pid 1234 on host elsewhere.example" in str(refused.value) and f"delete {path}" in str(refused.value)
    assert namespace_in_use(tmp_path) == str(refused.value)
    assert path.exists()  # left for its owner, or the user, to remove


def test_resuming_a_run_whose_namespace_a_live_run_holds_is_one_line_before_anything_is_written(out, capsys):
    a = run_tiny(out, "method.name=ditto", "trainer.rounds=2", DISK, name="a")
    before = {p: p.read_bytes() for p in a.rglob("*") if p.is_file()}
    holder = NamespaceLock(a / "client_states", 0)  # the run, still going (in this process)
    holder.acquire()
    capsys.readouterr()
    try:
        assert main([f"resume={a}", "trainer.rounds=3"]) == 2
    finally:
        holder.release()
    line = one_error_line(capsys)
    assert f"state.dir {a / 'client_states'} is in use by another run (pid {os.getpid()}" in line
    assert {p: p.read_bytes() for p in a.rglob("*") if p.is_file()} == before
    assert main([f"resume={a}", "trainer.rounds=3"]) == 0  # once it has ended
    assert not list((a / "client_states").glob("*.lock"))


def test_a_new_run_whose_name_a_live_run_holds_in_a_shared_state_dir_is_refused_before_its_run_dir(out, capsys):
    """Two output folders, one state.dir, one logger.run_name: the second run would share the first's namespace."""
    (out / "shared" / "exp").mkdir(parents=True)
    holder = NamespaceLock(out / "shared" / "exp", 0)
    holder.acquire()
    capsys.readouterr()
    try:
        assert main(tiny(out, "logger.run_name=exp", DISK, f"state.dir={out / 'shared'}")) == 2
    finally:
        holder.release()
    assert "is in use by another run" in one_error_line(capsys)
    assert not (out / "outputs" / "exp").exists()


def test_a_stale_lock_left_by_a_dead_run_is_taken_over_with_a_notice(out, capsys):
    a = run_tiny(out, "method.name=ditto", "trainer.rounds=2", DISK, name="a")
    write_lock(a / "client_states", 0, pid=dead_pid())
    capsys.readouterr()
    assert main([f"resume={a}", "trainer.rounds=3"]) == 0
    assert "notice: took over the stale lock" in capsys.readouterr().err
    assert not list((a / "client_states").glob("*.lock"))


def test_torchs_short_write_reads_as_a_full_disk():
    with pytest.raises(RuntimeError) as err:
        torch.save({"w": torch.zeros(1000)}, "/dev/full")  # every write: ENOSPC
    assert "unexpected pos" in str(err.value)  # what torch says
    assert write_error(err.value) == "the disk is full (a write came up short)"


# ---- damaged state files (issue 26, item 6) --------------------------------------------------------------------------
def damage(path: Path, how: str, donor: Path | None = None) -> None:
    """Empty, cut in half, overwritten with bytes that are no torch file, replaced by `donor` (another client's file),
    or deleted."""
    if how == "missing":
        path.unlink()
        return
    data = path.read_bytes()
    path.write_bytes({"empty": b"", "truncated": data[:len(data) // 2], "garbage": bytes(range(256)) * 4,
                      "another_client": donor.read_bytes() if donor else b""}[how])


DAMAGE = ["empty", "truncated", "garbage"]
WHAT = {"empty": "is empty", "truncated": "is truncated or not a torch file",
        "garbage": "is truncated or not a torch file", "another_client": "holds client", "missing": "lacks 1"}


def checkpoints_of(run: Path) -> tuple[dict, dict]:
    """The client entries of last.ckpt and previous.ckpt."""
    return tuple(torch.load(run / "checkpoints" / name, weights_only=False)["clients"]
                 for name in ("last.ckpt", "previous.ckpt"))


@pytest.mark.parametrize("how", [*DAMAGE, "another_client", "missing"])
def test_a_damaged_state_file_only_last_ckpt_names_falls_back_to_previous_ckpt(out, capsys, how):
    """As a damaged last.ckpt does: a warning naming the file, then the run continues from previous.ckpt and ends
    where an uninterrupted run does (the damaged file is written anew when its round is trained again)."""
    full = run_tiny(out, "method.name=ditto", "trainer.rounds=4", "trainer.checkpoint_every=1", name="full")
    a = run_tiny(out, "method.name=ditto", "trainer.rounds=3", "trainer.checkpoint_every=1", DISK, name="a")
    last, previous = checkpoints_of(a)
    cid, other = [c for c in last if previous.get(c) != last[c] and last[c]["round"] == 2][:2]
    path = named_file(a / "client_states", cid, 2)
    damage(path, how, donor=named_file(a / "client_states", other, 2))
    capsys.readouterr()
    assert main([f"resume={a}", "trainer.rounds=4"]) == 0
    err = capsys.readouterr().err
    what = f"state.dir {a / 'client_states'} lacks 1 client state file(s) the checkpoint names, e.g. {path.name}" if (
        how == "missing") else f"client state file {path} {WHAT[how]}"
    assert f"warning: resume from {a / 'checkpoints' / 'last.ckpt'}: {what}" in err
    assert "; using previous.ckpt instead" in err and "from previous.ckpt, continuing at round 2" in err
    assert read_metrics(a) == read_metrics(full)
    assert same_private_states(client_states(a), client_states(full))


@pytest.mark.parametrize("how", DAMAGE)
def test_a_damaged_state_file_both_checkpoints_name_is_one_line_on_resume(out, capsys, how):
    a = run_tiny(out, "method.name=ditto", "trainer.rounds=3", "trainer.checkpoint_every=1", DISK, name="a")
    last, previous = checkpoints_of(a)
    cid = next(c for c in last if previous.get(c) == last[c])  # not trained in the last round
    path = named_file(a / "client_states", cid, last[cid]["round"])
    damage(path, how)
    capsys.readouterr()
    assert main([f"resume={a}", "trainer.rounds=4"]) == 2
    line = one_error_line(capsys)
    assert line.startswith(f"error: resume from {a / 'checkpoints' / 'last.ckpt'}: client state file {path} "
                           f"{WHAT[how]}")
    assert line.endswith("; previous.ckpt names it too")
    assert load_ckpt(a)["round"] == 2


MID_RUN = ["empty", "truncated", "garbage", "another_client", "deleted", "state_dir_deleted", "state_dir_a_file"]


@pytest.mark.parametrize("how", MID_RUN)
def test_a_state_file_damaged_mid_run_stops_in_one_line(out, monkeypatch, capsys, how):
    """After round 0's checkpoint a file it names is damaged or deleted, or the whole state.dir goes: round 1 reads
    every round-0 state (to train or to evaluate it), and the run stops there in one line (exit 1)."""
    checkpointed, folder, damaged = DiskStateStore.checkpointed, out / "outputs" / "a" / "client_states", []

    def checkpointed_then_damage(store):
        checkpointed(store)
        if damaged:
            return
        first, second = sorted(folder.glob("client*.pt"))[:2]
        damaged.append(first)
        if how in DAMAGE:
            damage(first, how)
        elif how == "another_client":
            first.write_bytes(second.read_bytes())
        elif how == "deleted":
            first.unlink()
        else:
            shutil.rmtree(folder)
            if how == "state_dir_a_file":
                folder.write_text("not a folder")

    monkeypatch.setattr(DiskStateStore, "checkpointed", checkpointed_then_damage)
    capsys.readouterr()
    assert main(tiny(out, "fabric.cpu_threads=1", "logger.run_name=a", "method.name=ditto", "trainer.rounds=3",
                     "trainer.checkpoint_every=1", DISK)) == 1
    line = one_error_line(capsys)
    expected = {"empty": f"client state file {damaged[0]} is empty",
                "truncated": f"client state file {damaged[0]} is truncated or not a torch file",
                "garbage": f"client state file {damaged[0]} is truncated or not a torch file",
                "another_client": f"client state file {damaged[0]} holds client",
                "deleted": f"client state file {damaged[0]} is missing",
                "state_dir_deleted": f"state.dir {folder} no longer exists",
                "state_dir_a_file": f"state.dir {folder} is no longer a directory"}[how]
    assert line.startswith(f"error: {expected}")
    assert line.endswith(f"; resume={out / 'outputs' / 'a'} falls back to previous.ckpt if last.ckpt names a damaged "
                         "file")


# ---- two runs at once (processes of their own) ---------------------------------------------------------------------
def start_paused(out: Path, args: list[str], name: str, go: Path) -> tuple[subprocess.Popen, Path]:
    """`fl.train args` in a process of its own that stops when round 2 starts (after round 1's checkpoint) until `go`
    exists; returns the process and the file that says it has stopped there."""
    paused = out / f"{name}.paused"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FL_TEST_PAUSE_ROUND": "2", "FL_TEST_PAUSED": str(paused),
           "FL_TEST_GO": str(go)}
    for key in ("FL_RUN_DIR", "WANDB_SERVICE"):
        env.pop(key, None)
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "pause_at_round.py"), *args,
                             f"logger.run_name={name}"], cwd=out, env=env, text=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    return proc, paused


def wait_for(*paths: Path, procs: list[subprocess.Popen]) -> None:
    deadline = time.monotonic() + 240
    while not all(p.exists() for p in paths):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), [
            p.stderr.read()[-2000:] for p in procs if p.poll() is not None]
        time.sleep(0.1)


@pytest.mark.slow
def test_two_runs_at_once_with_one_state_dir_end_as_each_does_alone(out):
    """Both hold their files in the shared state.dir at the same moment (each stopped in round 2 until the other has
    got there): each ends with the metrics and client states of the same run alone (before namespaces both died
    with tracebacks, and the first evaluated the other's states)."""
    common = ("method.name=ditto", "trainer.rounds=4", "trainer.checkpoint_every=1")
    alone = {seed: run_tiny(out, *common, f"seed={seed}", name=f"alone{seed}") for seed in (0, 1)}
    go = out / "go"
    started = {seed: start_paused(out, tiny(out, "fabric.cpu_threads=1", *common, DISK, f"state.dir={out / 'shared'}",
                                            f"seed={seed}"), f"s{seed}", go) for seed in (0, 1)}
    procs = [proc for proc, _ in started.values()]
    wait_for(*(paused for _, paused in started.values()), procs=procs)
    go.touch()
    for proc in procs:
        assert proc.wait(timeout=300) == 0, proc.stderr.read()[-2000:]
    for seed in (0, 1):
        run = out / "outputs" / f"s{seed}"
        assert read_metrics(run) == read_metrics(alone[seed])
        assert same_private_states(client_states(run, out / "shared"), client_states(alone[seed]))
    assert not list((out / "shared").rglob("*.lock"))


@pytest.mark.slow
def test_resuming_a_run_that_is_still_going_is_refused_and_the_run_ends_as_it_would_have(out, capsys):
    """resume=RUN while RUN still runs (it looks dead, it is not): one line naming the live process, exit 2, nothing
    of RUN touched; RUN then ends where it would have."""
    args = tiny(out, "fabric.cpu_threads=1", "method.name=ditto", "trainer.rounds=4", "trainer.checkpoint_every=1",
                DISK)
    full = run_tiny(out, "method.name=ditto", "trainer.rounds=4", "trainer.checkpoint_every=1", name="full")
    go = out / "go"
    proc, paused = start_paused(out, args, "a", go)
    wait_for(paused, procs=[proc])
    a = out / "outputs" / "a"
    before = {p: p.read_bytes() for p in a.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert main([f"resume={a}"]) == 2  # in this process
    err = one_error_line(capsys)
    assert f"state.dir {a / 'client_states'} is in use by another run (pid {proc.pid} on this host" in err
    assert {p: p.read_bytes() for p in a.rglob("*") if p.is_file()} == before
    go.touch()
    assert proc.wait(timeout=300) == 0, proc.stderr.read()[-2000:]
    assert read_metrics(a) == read_metrics(full)
    assert same_private_states(client_states(a), client_states(full))
