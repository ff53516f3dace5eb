"""Console output of a run: a progress bar over rounds with live metrics, and the final summary table.

Rounds are numbered from 0 here as in metrics.jsonl, summary.json and the checkpoints, so a round seen on the
console is the same row in the files."""
from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Optional, TextIO

from tqdm import tqdm

from fl.report.tables import DEFAULT_METRIC

LIVE_KEYS = ("test/acc_mean_clients", "test/acc_global_micro", "train/loss")
TIME_KEY = "time/round_s"  # the round's wall time, logged by the loop
COMM_KEYS = ("comm/bytes_up", "comm/bytes_down")  # summed over the round's clients
# The accuracies every method's evaluation reports (fl/core/evaluation.py) and a target client's: the summary shows
# them after the headline; every other test/ metric (evaluators', the method's own) is a diagnostic, shown below.
STANDARD_KEYS = ("test/acc_mean_clients", "test/acc_weighted", "test/acc_weighted_train", "test/acc_micro",
                 "test/acc_std_clients", "test/acc_worst10", "test/acc_original_clients", "test/acc_new_clients",
                 "test/acc_global_micro", "test/target_acc", "test/target_f1")


def round_label(rnd: int, rounds: int) -> str:
    """`round 3 of 0..19`: the round's index as the files write it, with the range, so a 0-based index is not
    read as a count."""
    return f"round {rnd} of 0..{rounds - 1}"


class RoundProgress:
    """A tqdm bar on a terminal; on a file (a sweep's run log, CI) one plain line per evaluated round and the
    last, flushed, so `tail -f` follows it. Both show the method's headline metric first (`headline`, default
    the mean client accuracy), then the mean client and global accuracies, the training loss and the round's time."""

    def __init__(self, rounds: int, start: int, headline: Optional[str] = None, stream: Optional[TextIO] = None):
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty()
        self.rounds = rounds
        self.keys = tuple(dict.fromkeys([headline or DEFAULT_METRIC, *LIVE_KEYS]))
        self.bar = tqdm(total=rounds, initial=start, desc="rounds", unit="round", dynamic_ncols=True,
                        file=self.stream) if self.tty else None
        self.live: dict[str, float] = {}  # the last value of each key: the bar keeps showing the last evaluation

    def update(self, rnd: int, metrics: dict[str, float]) -> None:
        self.live.update({k: metrics[k] for k in self.keys if k in metrics})
        text = " ".join(f"{k.split('/', 1)[1]}={self.live[k]:.4f}" for k in self.keys if k in self.live)
        if TIME_KEY in metrics:
            text += f" round_s={metrics[TIME_KEY]:.2f}"
        if self.bar is not None:
            self.bar.set_postfix_str(f"round={rnd} {text}", refresh=False)
            self.bar.update(1)
        elif any(k.startswith("test/") for k in metrics) or rnd == self.rounds - 1:
            print(f"{round_label(rnd, self.rounds)}: {text}", file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def format_summary(summary: dict, own: Sequence[str] = ()) -> str:
    """metric | final | best (round, 0-based as in the files) | mean of the last values: first the method's headline
    metric (summary["headline"], else the mean client accuracy), the standard accuracies and the training loss; then,
    under "diagnostics", the other test metrics, the method's own metrics and the evaluators' others (`own`:
    fl/core/run_metrics.py's diagnostics), and the round's time and communication. Best is by each metric's declared
    direction; a metric better neither way has none (—). The last column is labelled with how many values it
    averages (trainer.last_k, or fewer when fewer were logged: `last 3` after 3 evaluations); when the rows average
    different counts, a `k` column gives each row's."""
    final, last_key = summary["final"], f"mean_last_{summary['last_k']}"
    counts = summary.get(f"count_last_{summary['last_k']}", {})  # absent in summaries written before it was kept
    first = summary.get("headline") or DEFAULT_METRIC
    tested = [k for k in final if k.startswith("test/")]
    main = [k for k in dict.fromkeys([first, *(k for k in tested if k in STANDARD_KEYS), "train/loss"]) if k in final]
    diagnostics = list(dict.fromkeys([*(k for k in tested if k not in main), *(k for k in own if k in final)]))
    width = max([len(k) for k in main + diagnostics] + [6])
    shown = {counts.get(k, summary["last_k"]) for k in main + diagnostics}
    label = f"last {shown.pop()}" if len(shown) == 1 else "last k"
    head = f"{'metric':<{width}}  {'final':>8}  {'best':>8}  {'@round':>6}  {label:>8}" + (
        "    k" if label == "last k" else "")

    def row(k: str) -> str:
        best = (f"{summary['best'][k]:>8.4f}  {summary['best_round'][k]:>6}" if k in summary["best"] else
                f"{'—':>8}  {'—':>6}")
        return (f"{k:<{width}}  {final[k]:>8.4f}  {best}  {summary[last_key][k]:>8.4f}"
                + (f"  {counts.get(k, summary['last_k']):>3}" if label == "last k" else ""))

    lines = [head, "-" * len(head), *map(row, main)]
    if "at_best_val" in summary:  # model selection on the target validation set
        sel = summary["at_best_val"]
        picked = " ".join(f"{k}={v:.4f}" for k, v in sel.items() if k.startswith("test/target"))
        lines.append(f"selected by val/target_acc (round {sel['round']}): {picked}")
    recent = summary.get(last_key, {})
    per_round = [f"time {recent[TIME_KEY]:.2f} s"] if TIME_KEY in recent else []
    if COMM_KEYS[0] in recent and COMM_KEYS[1] in recent:
        per_round.append(f"comm {recent[COMM_KEYS[0]] / 2**20:.2f} MiB up, {recent[COMM_KEYS[1]] / 2**20:.2f} MiB down")
    if diagnostics or per_round:
        lines += ["", "diagnostics", "-" * len(head), *map(row, diagnostics)]
    if per_round:
        n = counts.get(TIME_KEY, counts.get(COMM_KEYS[0], summary["last_k"]))
        lines.append(f"per round (mean of the last {n} round{'s' if n != 1 else ''}): {', '.join(per_round)}")
    if "diverged" in summary:  # last: the numbers above are a diverged run's (warn) or end where it stopped (stop)
        d = summary["diverged"]
        at = "the server's aggregate" if d.get("client") is None else f"client {d['client']}"
        lines.append(f"DIVERGED at {at}, round {d['round']}: {d['reason']}")
    return "\n".join(lines)
