"""Importing this package registers every method (one module each)."""
from fl.methods import centralized, fedavg, fedavg_ft, fedpals, fedper, fedprox, local, scaffold  # noqa: F401
from fl.methods import fedct, fedmosaic  # noqa: F401,E402  (FedMosaic and its FedCT baseline)
from fl.methods import pfedfda  # noqa: F401,E402
from fl.methods import feddrm, fedrep  # noqa: F401,E402  (FedDRM and its FedRep baseline)
from fl.methods import fedacd  # noqa: F401,E402
from fl.methods import fedbabu, fedbn, fedpac, fedrod, lg_fedavg  # noqa: F401,E402  (issue 10 baselines)
from fl.methods import apfl, ditto, fedphp, perfedavg, pfedme  # noqa: F401,E402  (issue 10 baselines)
