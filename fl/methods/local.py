"""Local: each client trains only on its own data; nothing is communicated."""
from dataclasses import dataclass
from typing import Optional

from fl.config import MethodConfig
from fl.core import ClientModule, Server, Upload, register_method


@dataclass
class LocalConfig(MethodConfig):
    name: str = "local"


class LocalClient(ClientModule):
    has_global_model = False
    functional = True  # cross-entropy: the base client_loss, for one client or K at once

    def is_private(self, key: str) -> bool:
        return True  # the whole model stays on the client

    def upload(self) -> Upload:
        return Upload(weight=float(self.num_train))


class LocalServer(Server):
    @classmethod
    def own_aggregation(cls, hp) -> Optional[str]:
        return "nothing is communicated"


register_method("local", LocalConfig, LocalClient, LocalServer)
