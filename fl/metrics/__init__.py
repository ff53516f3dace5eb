from fl.metrics import adaptability  # noqa: F401  (registers the adaptability evaluators)
from fl.metrics import system  # noqa: F401,E402  (registers the system / routing accuracy evaluator)
from fl.metrics.clients import ClientAccuracy, summarize_clients
from fl.metrics.summary import higher_is_better, summarize_history

__all__ = ["ClientAccuracy", "summarize_clients", "higher_is_better", "summarize_history"]
