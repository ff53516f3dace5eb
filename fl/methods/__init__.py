"""Every method, one module (or a folder, when it has helpers) each; importing this package registers them.

The five papers: FedPALS (fedpals/), FedDRM (feddrm.py), FedMosaic (fedmosaic/, with FedCT), pFedFDA
(pfedfda/), FedACD (fedacd/). Their baselines: FedAvg, FedProx, FedAvg-FT, FedPer, Local, Centralized,
SCAFFOLD, FedRep, Ditto, APFL, pFedMe, Per-FedAvg, FedPHP, FedBN, FedBABU, LG-FedAvg, FedRoD, FedPAC, FedSAM,
FedNova, FedLC, FedNTD, FedDecorr, FedNH.

Every module under this package is imported, in name order, so a new method is one new file (or folder).
"""
from fl.core.registry import discover

discover(__name__)
