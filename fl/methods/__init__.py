"""Every method, one module (or a folder, when it has helpers) each; importing this package registers them.

The five papers: FedPALS (fedpals/), FedDRM (feddrm.py), FedMosaic (fedmosaic/, with FedCT), pFedFDA
(pfedfda/), FedACD (fedacd/). Their baselines: FedAvg, FedProx, FedAvg-FT, FedPer, Local, Centralized,
SCAFFOLD, FedRep, Ditto, APFL, pFedMe, Per-FedAvg, FedPHP, FedBN, FedBABU, LG-FedAvg, FedRoD, FedPAC.
"""
from fl.methods import (  # noqa: F401
                        apfl,
                        centralized,
                        ditto,
                        fedacd,
                        fedavg,
                        fedavg_ft,
                        fedbabu,
                        fedbn,
                        feddrm,
                        fedmosaic,
                        fedpac,
                        fedpals,
                        fedper,
                        fedphp,
                        fedprox,
                        fedrep,
                        fedrod,
                        lg_fedavg,
                        local,
                        perfedavg,
                        pfedfda,
                        pfedme,
                        scaffold,
)
from fl.methods.fedmosaic import fedct  # noqa: F401
