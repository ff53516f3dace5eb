"""Local: each client trains only on its own data; nothing is communicated."""
from dataclasses import dataclass

from fl.client import ClientModule, Upload
from fl.config import MethodConfig
from fl.registry import register_method
from fl.server import Server


@dataclass
class LocalConfig(MethodConfig):
    name: str = "local"


class LocalClient(ClientModule):
    def is_private(self, key: str) -> bool:
        return True  # the whole model stays on the client

    def upload(self) -> Upload:
        return Upload(weight=float(self.num_train))


class LocalServer(Server):
    has_global_model = False


register_method("local", LocalConfig, LocalClient, LocalServer)
