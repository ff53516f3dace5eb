"""Console output of a run: a progress bar over rounds with live metrics, and the final summary table.

Rounds are numbered from 0 here as in metrics.jsonl, summary.json and the checkpoints, so a round seen on the
console is the same row in the files."""
from __future__ import annotations

import sys
from typing import Optional, TextIO

from tqdm import tqdm

from fl.report.tables import DEFAULT_METRIC

LIVE_KEYS = ("train/loss", "test/acc_mean_clients", "test/acc_global")
TIME_KEY = "time/round_s"  # the round's wall time, logged by the loop


def round_label(rnd: int, rounds: int) -> str:
    """`round 3 of 0..19`: the round's index as the files write it, with the range, so a 0-based index is not
    read as a count."""
    return f"round {rnd} of 0..{rounds - 1}"


class RoundProgress:
    """A tqdm bar on a terminal; on a file (a sweep's run log, CI) one plain line per evaluated round and the
    last, flushed, so `tail -f` follows it. Both show the method's headline metric first (`headline`, default
    the mean client accuracy), the training loss, the mean client and global accuracies and the round's time."""

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


def format_summary(summary: dict, keys: list[str] | None = None) -> str:
    """metric | final | best (round, 0-based as in the files) | mean of last K, for the headline test metrics."""
    last_key = f"mean_last_{summary['last_k']}"
    keys = keys or [k for k in summary["final"] if k.startswith("test/")] + ["train/loss"]
    keys = [k for k in keys if k in summary["final"]]
    width = max([len(k) for k in keys] + [6])
    head = f"{'metric':<{width}}  {'final':>8}  {'best':>8}  {'@round':>6}  {'last ' + str(summary['last_k']):>8}"
    lines = [head, "-" * len(head)]
    for k in keys:
        lines.append(f"{k:<{width}}  {summary['final'][k]:>8.4f}  {summary['best'][k]:>8.4f}  "
                     f"{summary['best_round'][k]:>6}  {summary[last_key][k]:>8.4f}")
    if "at_best_val" in summary:  # model selection on the target validation set
        sel = summary["at_best_val"]
        picked = " ".join(f"{k}={v:.4f}" for k, v in sel.items() if k.startswith("test/target"))
        lines.append(f"selected by val/target_acc (round {sel['round']}): {picked}")
    if "diverged" in summary:  # trainer.on_divergence=warn: the numbers above come from a diverged run
        d = summary["diverged"]
        lines.append(f"DIVERGED at client {d['client']}, round {d['round']}: {d['reason']}")
    if TIME_KEY in summary.get(last_key, {}):
        lines.append(f"round time: {summary[last_key][TIME_KEY]:.2f} s (mean of the last {summary['last_k']} rounds)")
    return "\n".join(lines)
