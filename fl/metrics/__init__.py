from fl.metrics.clients import ClientAccuracy, summarize_clients
from fl.metrics.summary import higher_is_better, summarize_history

__all__ = ["ClientAccuracy", "summarize_clients", "higher_is_better", "summarize_history"]
