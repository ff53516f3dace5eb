"""Weights & Biases access: which mode a run uses (online with an API key, offline without; never a prompt),
the names metrics.jsonl keys have on W&B, the rounds a run directory's local W&B segments hold, and finished
runs read back through W&B's API for the report."""
from __future__ import annotations

import contextlib
import json
import os
import re
import struct
from pathlib import Path
from typing import Any, Optional

from fl.report.aliases import current_name, current_names
from fl.report.runs import ReportError, Run, flatten
from fl.report.summary import summarize_history


def has_wandb_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    try:
        return "api.wandb.ai" in netrc.read_text()
    except OSError:
        return False


def wandb_mode(requested: str) -> str:
    """auto -> WANDB_MODE if set, else online with an API key and offline without; never prompts."""
    if requested != "auto":
        return requested
    return os.environ.get("WANDB_MODE") or ("online" if has_wandb_key() else "offline")


# Per-client scalars: metrics.jsonl's client/<i>/<name> is client_<name>/<i> on W&B, whose workspace makes one
# panel section per prefix before the first '/': one section per per-client metric instead of one per client.
_CLIENT_KEY = re.compile(r"^client/(\d+)/(.+)$")
_WANDB_CLIENT_KEY = re.compile(r"^client_(.+)/(\d+)$")


def wandb_key(key: str) -> str:
    """The W&B name of a metrics.jsonl key: client/<i>/<name> -> client_<name>/<i>; other keys unchanged."""
    m = _CLIENT_KEY.match(key)
    return f"client_{m.group(2)}/{m.group(1)}" if m else key


def jsonl_key(key: str) -> str:
    """wandb_key's inverse: client_<name>/<i> -> client/<i>/<name>."""
    m = _WANDB_CLIENT_KEY.match(key)
    return f"client/{m.group(2)}/{m.group(1)}" if m else key


def transaction_log_history(path: Path):
    """The history rows ({key: value}) that a W&B run's local transaction log (run-<id>.wandb) holds
    (`transaction_log_records`)."""
    for record in transaction_log_records(path):
        if record.WhichOneof("record_type") == "history":
            row = {}
            for item in record.history.item:
                with contextlib.suppress(ValueError):
                    row[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
            yield row


def transaction_log_records(path: Path):
    """The wandb protobuf Records a W&B run's local transaction log (run-<id>.wandb) holds. The file is a
    LevelDB-style log of 32 KiB blocks of Records, written a block at a time: a process killed (SIGKILL) mid-run
    leaves only the blocks written so far, so this is what W&B will have of that process."""
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    if data[:4] != b":W&B":
        return
    pos, parts = 7, None  # header: ":W&B", 2-byte magic, 1-byte version; parts: a record's chunks so far
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if left < 7 or kind == 0 or pos + 7 + length > len(data):  # block padding, or a chunk cut off by a kill
            pos += left
            continue
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 2):  # a full record, or the first chunk of one
            parts = [chunk]
        elif parts is not None:  # 3 middle, 4 last
            parts.append(chunk)
        if kind not in (1, 4) or parts is None:
            continue
        record, raw, parts = wandb_internal_pb2.Record(), b"".join(parts), None
        try:
            record.ParseFromString(raw)
        except Exception:  # a damaged record: skip it
            continue
        yield record


def local_last_round(wandb_dir: Path, run_id: str) -> int:
    """The last round in the history of W&B run `run_id` over its local segments in `wandb_dir` (a run directory's
    wandb/, one offline-run-* or run-* folder per process that logged it); -1 if none. Rows of older versions
    carry trainer/global_step instead of round."""
    last = -1
    for path in Path(wandb_dir).glob(f"*-{run_id}/run-{run_id}.wandb"):
        for row in transaction_log_history(path):
            value = row.get("round", row.get("trainer/global_step"))
            if isinstance(value, (int, float)):
                last = max(last, int(value))
    return last


def _headline(name: Any) -> Any:
    return current_name(name) if isinstance(name, str) else name


def load_wandb(project: str, filters: Optional[dict] = None, api: Any = None) -> list[Run]:
    """Finished runs of a W&B project (entity/project) through wandb.Api; per round, the history rows
    logged at the same round are merged into one metrics.jsonl-like row (W&B's client_<name>/<i> read back as
    client/<i>/<name>)."""
    if project.count("/") != 1:
        raise ReportError(f"--wandb {project!r}: expected ENTITY/PROJECT")
    if api is None:
        if wandb_mode("auto") != "online":
            raise ReportError("--wandb needs W&B online: no API key (set WANDB_API_KEY or run `wandb login`) or "
                              "WANDB_MODE forces offline; use run directories instead")
        try:
            import wandb

            api = wandb.Api(timeout=30)
        except Exception as err:  # the W&B client failing to start is reported in one line
            raise ReportError(f"--wandb {project}: cannot reach W&B: {str(err).splitlines()[0]}") from None
    try:
        remote = [r for r in api.runs(project, filters=filters or {}) if r.state == "finished"]
        runs = []
        for r in remote:
            config = flatten({k: v for k, v in dict(r.config).items() if not k.startswith("_")})
            rows: dict[int, dict] = {}
            for row in r.scan_history():
                step = row.get("round", row.get("trainer/global_step"))  # trainer/global_step: older runs
                if step is None:
                    continue
                merged = rows.setdefault(int(step), {"round": int(step)})
                merged.update(current_names({jsonl_key(k): v for k, v in row.items()
                                             if not k.startswith(("_", "trainer/")) and k != "round"
                                             and isinstance(v, (int, float)) and not isinstance(v, bool)}))
            history = [rows[k] for k in sorted(rows)]
            remote_summary = dict(r.summary)
            directions = remote_summary.get("directions")  # logged by fl.train at the end of the run
            directions = current_names(dict(directions)) if hasattr(directions, "keys") else None
            summary = {**summarize_history(history, int(config.get("trainer.last_k", 5)), directions),
                       "headline": _headline(remote_summary.get("headline"))}
            diverged = remote_summary.get("diverged")  # a nested W&B summary value is a mapping, not a dict
            if diverged is not None:
                summary["diverged"] = dict(diverged) if hasattr(diverged, "keys") else diverged
            finished = remote_summary.get("_timestamp")  # the run's last log, unix seconds: its newest of repeats
            finished = finished if isinstance(finished, (int, float)) else None
            runs.append(Run(r.name, getattr(r, "url", r.name), config, summary, history, finished=finished,
                            finished_from="W&B's last log time" if finished is not None else ""))
    except ReportError:
        raise
    except Exception as err:  # network and permission errors end in one line, not a traceback
        raise ReportError(f"--wandb {project}: {type(err).__name__}: {str(err).splitlines()[0]}") from None
    if not runs:
        raise ReportError(f"--wandb {project}: no finished runs{' matching the filter' if filters else ''}")
    return runs
