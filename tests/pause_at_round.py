"""Run fl.train, but when local training of round FL_TEST_PAUSE_ROUND starts, create the file FL_TEST_PAUSED and wait
until the file FL_TEST_GO exists: a run held alive half-way, for tests of what another run does meanwhile."""
import os
import sys
import time
from pathlib import Path

import fl.core.loop as orchestrator

PAUSE_ROUND = int(os.environ["FL_TEST_PAUSE_ROUND"])
PAUSED, GO = Path(os.environ["FL_TEST_PAUSED"]), Path(os.environ["FL_TEST_GO"])
_train_client = orchestrator.Orchestrator.train_client


def train_client_after_pause(self, rnd, cid):
    if rnd == PAUSE_ROUND and not PAUSED.exists():
        PAUSED.touch()
        while not GO.exists():
            time.sleep(0.05)
    return _train_client(self, rnd, cid)


orchestrator.Orchestrator.train_client = train_client_after_pause

if __name__ == "__main__":
    from fl.run.train import main

    sys.exit(main(sys.argv[1:]))
