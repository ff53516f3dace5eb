"""What start-up says about the clients before anything is written: those that will take no local step, and
under trainer.drop_last those smaller than a batch (they train on one batch of all their samples, where torch's
DataLoader(drop_last=True), as in pFedFDA's code, would give them no step). A federation where no training client
holds training data is refused earlier, by fl/data/federate.py, naming the key that emptied them."""
from __future__ import annotations

import os
import sys

from omegaconf import DictConfig

from fl.core import METHODS, ClientModule, FederatedData
from fl.core.batches import count_batches
from fl.run.run_dir import RUN_DIR_ENV, external_launch


def _listed(cids: list[int], limit: int = 12) -> str:
    shown = ", ".join(map(str, cids[:limit]))
    return shown + (f", ... ({len(cids) - limit} more)" if len(cids) > limit else "")


def client_notes(cfg: DictConfig, data: FederatedData) -> list[str]:
    """One line per finding (empty when every training client takes a full local step). Methods that train on
    another split than the clients' own (centralized's pooled data) are not judged by the clients' sizes."""
    if METHODS[cfg.method.name].client_cls.train_split is not ClientModule.train_split:
        return []
    t = cfg.trainer
    sizes = [len(c.train) for c in data.clients[:data.num_train_clients]]
    idle = [cid for cid, n in enumerate(sizes)
            if count_batches(n, t.batch_size, t.local_epochs, t.local_steps, t.drop_last) == 0]
    notes = []
    if idle:
        notes.append(f"warning: {len(idle)} of {len(sizes)} training clients take no local step, as they hold no "
                     f"training data: clients {_listed(idle)}")
    short = [cid for cid, n in enumerate(sizes) if 0 < n < t.batch_size]
    if t.drop_last and short:
        notes.append(f"notice: {len(short)} of {len(sizes)} training clients hold fewer than trainer.batch_size="
                     f"{t.batch_size} training samples (clients {_listed(short)}): with trainer.drop_last=true each of "
                     "their local epochs is one batch of all their samples, where torch's DataLoader(drop_last=True) "
                     "would give them no step")
    return notes


def print_client_notes(cfg: DictConfig, data: FederatedData) -> None:
    """client_notes on stderr, once: not again in the processes a launcher starts (Fabric's: they find the run
    directory in FL_RUN_DIR; torchrun's and srun's: rank > 0)."""
    launch = external_launch()
    if os.environ.get(RUN_DIR_ENV) or (launch is not None and launch[2] != 0):
        return
    for line in client_notes(cfg, data):
        print(line, file=sys.stderr)
