"""Console output of a run: a progress bar over rounds with live metrics, and the final summary table."""
from __future__ import annotations

import sys

from tqdm import tqdm

LIVE_KEYS = ("train/loss", "test/acc_mean_clients", "test/acc_global")


class RoundProgress:
    """A tqdm bar on a terminal; one line per evaluated round when the output is a file (CI, logs)."""

    def __init__(self, rounds: int, start: int):
        self.tty = sys.stderr.isatty()
        self.rounds = rounds
        self.bar = tqdm(total=rounds, initial=start, desc="rounds", unit="round",
                        dynamic_ncols=True) if self.tty else None
        self.live: dict[str, float] = {}

    def update(self, rnd: int, metrics: dict[str, float]) -> None:
        self.live.update({k.split("/", 1)[1]: metrics[k] for k in LIVE_KEYS if k in metrics})
        text = " ".join(f"{k}={v:.4f}" for k, v in self.live.items())
        if self.bar is not None:
            self.bar.set_postfix_str(text, refresh=False)
            self.bar.update(1)
        elif any(k in metrics for k in LIVE_KEYS[1:]) or rnd == self.rounds - 1:
            print(f"round {rnd + 1}/{self.rounds} {text}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def format_summary(summary: dict, keys: list[str] | None = None) -> str:
    """metric | final | best (round) | mean of last K, for the headline test metrics."""
    last_key = f"mean_last_{summary['last_k']}"
    keys = keys or [k for k in summary["final"] if k.startswith("test/")] + ["train/loss"]
    keys = [k for k in keys if k in summary["final"]]
    width = max([len(k) for k in keys] + [6])
    head = f"{'metric':<{width}}  {'final':>8}  {'best':>8}  {'@round':>6}  {'last ' + str(summary['last_k']):>8}"
    lines = [head, "-" * len(head)]
    for k in keys:
        lines.append(f"{k:<{width}}  {summary['final'][k]:>8.4f}  {summary['best'][k]:>8.4f}  "
                     f"{summary['best_round'][k] + 1:>6}  {summary[last_key][k]:>8.4f}")
    if "at_best_val" in summary:  # model selection on the target validation set
        sel = summary["at_best_val"]
        picked = " ".join(f"{k}={v:.4f}" for k, v in sel.items() if k.startswith("test/target"))
        lines.append(f"selected by val/target_acc (round {sel['round'] + 1}): {picked}")
    return "\n".join(lines)
