"""Run fl.train, but SIGKILL the process (a hard crash) when local training of round FL_TEST_KILL_ROUND starts,
half-way through writing the first client state file of round FL_TEST_KILL_WRITE_ROUND (state.cache_mb), or when the
image cache's build decodes its FL_TEST_KILL_DECODE-th part (parts of FL_TEST_CACHE_PART_BYTES bytes)."""
import os
import signal
import sys

import fl.core.loop as orchestrator
import fl.core.state as state
import fl.data.cache as image_cache
from fl.data.sources import domains

KILL_ROUND = os.environ.get("FL_TEST_KILL_ROUND")
KILL_WRITE_ROUND = os.environ.get("FL_TEST_KILL_WRITE_ROUND")
KILL_DECODE = os.environ.get("FL_TEST_KILL_DECODE")
PART_BYTES = os.environ.get("FL_TEST_CACHE_PART_BYTES")
_decode_images = domains.decode_images
_decoded = 0
_train_client = orchestrator.Orchestrator.train_client
_write_file = state.DiskStateStore._write_file


def train_client_then_die(self, rnd, cid):
    if rnd == int(KILL_ROUND):
        os.kill(os.getpid(), signal.SIGKILL)
    return _train_client(self, rnd, cid)


def write_half_then_die(self, cid, rnd, client_state):
    if rnd == int(KILL_WRITE_ROUND):
        path = self.path(cid, rnd)
        path.with_name(path.name + ".tmp").write_bytes(b"\x80\x02half a state")
        os.kill(os.getpid(), signal.SIGKILL)
    return _write_file(self, cid, rnd, client_state)


def decode_then_die(files, size, obtain):
    global _decoded
    _decoded += 1
    if _decoded == int(KILL_DECODE):
        os.kill(os.getpid(), signal.SIGKILL)
    return _decode_images(files, size, obtain)


if KILL_ROUND is not None:
    orchestrator.Orchestrator.train_client = train_client_then_die
if KILL_WRITE_ROUND is not None:
    state.DiskStateStore._write_file = write_half_then_die
if KILL_DECODE is not None:
    domains.decode_images = decode_then_die
if PART_BYTES is not None:
    image_cache.PART_BYTES = int(PART_BYTES)

if __name__ == "__main__":
    from fl.run.train import main

    sys.exit(main(sys.argv[1:]))
