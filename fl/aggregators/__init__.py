"""The aggregators, a module each: how the server turns a round's parameter uploads into the new shared parameters,
for any method whose server takes their weighted mean (`server.aggregator.name`). Each registers
`fn(uploads, start, s) -> params` with `@register_aggregator(name, Settings)`, where `uploads`
(fl.core.aggregation.Uploads) holds the round's uploads in client order (`uploads.clients`: cid, params on the CPU,
the method's weight) and their weighted mean (`uploads.mean()`), `start` the shared parameters the clients started
from (the server's global model) and `s` the `server.aggregator` block (its own Settings among its keys); it returns
the parameters `server_step` receives as its mean, on the run's device. `streams=True` declares a rule that needs
only `uploads.mean()` (summed as clients finish: no upload is kept); `check=fn(s, clients)` refuses settings that
cannot work with a round of that many clients. fl/core/aggregation.py has what the rules compute with. Every module
here is imported, so a new aggregator is one new file."""
from fl.core.registry import discover

discover(__name__)
