"""Run fl.train, but SIGKILL the process when local training of round KILL_ROUND starts (a hard crash)."""
import os
import signal
import sys

import fl.core.loop as orchestrator

KILL_ROUND = int(os.environ["FL_TEST_KILL_ROUND"])
_train_client = orchestrator.Orchestrator.train_client


def train_client_then_die(self, rnd, cid):
    if rnd == KILL_ROUND:
        os.kill(os.getpid(), signal.SIGKILL)
    return _train_client(self, rnd, cid)


orchestrator.Orchestrator.train_client = train_client_then_die

if __name__ == "__main__":
    from fl.run.train import main

    sys.exit(main(sys.argv[1:]))
