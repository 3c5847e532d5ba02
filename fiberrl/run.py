"""A run's directory: its config, metrics, TensorBoard events, checkpoints
and best policy, and the progress line printed per iteration.

    <run>/config.yaml          the resolved config the run started with
    <run>/metrics.jsonl        one JSON object per iteration
    <run>/tensorboard/         the same scalars as TensorBoard events
    <run>/checkpoints/NNNNNN.npz  everything needed to continue exactly
    <run>/best_policy.npz      the parameters with the best eval reward so far

Files are replaced atomically (written beside, then renamed), so a run killed
at any moment leaves the last complete checkpoint readable.
"""
from __future__ import annotations

import json
import math
import os
import re
import tempfile
from pathlib import Path

import numpy as np
from rich.console import Console

CHECKPOINT = re.compile(r"^(\d{6,})\.npz$")


class CheckpointMismatch(ValueError):
    pass


def atomic_write(path: Path, write) -> None:
    """``write(file)`` into a temporary file beside ``path``, then rename it over ``path``."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def save_npz(path: Path, arrays: dict, values: dict) -> None:
    blob = np.frombuffer(json.dumps(values).encode(), dtype=np.uint8)
    atomic_write(path, lambda f: np.savez(f, __values__=blob, **arrays))


def load_npz(path: Path) -> tuple[dict, dict]:
    with np.load(path, allow_pickle=False) as data:
        values = json.loads(bytes(data["__values__"]).decode())
        arrays = {k: data[k] for k in data.files if k != "__values__"}
    return arrays, values


def flatten(tree: dict, prefix: str = "") -> dict:
    """``{"algo": {"sigma": 0.02}}`` -> ``{"algo.sigma": 0.02}``"""
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _scalar(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class RunDirectory:
    """``fingerprint``: the settings a checkpoint must have been made with to be
    resumed here (those that change the result), as a JSON-able dict."""

    def __init__(self, path, fingerprint: dict, config_yaml: str | None = None, keep_checkpoints: int = 3,
                 tensorboard: bool = True, console: Console | None = None):
        self.path = Path(path)
        self.checkpoints = self.path / "checkpoints"
        self.checkpoints.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.path / "metrics.jsonl"
        self.fingerprint = json.loads(json.dumps(fingerprint))
        self.keep_checkpoints = keep_checkpoints
        self.console = console or Console(highlight=False, soft_wrap=True)
        if config_yaml is not None and not (self.path / "config.yaml").exists():
            atomic_write(self.path / "config.yaml", lambda f: f.write(config_yaml.encode()))
        self._tensorboard = tensorboard
        self._writer = None

    # --- checkpoints ------------------------------------------------------
    def checkpoint_paths(self) -> list[Path]:
        found = [(int(m.group(1)), p) for p in self.checkpoints.iterdir() if (m := CHECKPOINT.match(p.name))]
        return [p for _, p in sorted(found)]

    def save_checkpoint(self, iteration: int, arrays: dict, values: dict) -> Path:
        path = self.checkpoints / f"{iteration:06d}.npz"
        save_npz(path, arrays, dict(values, fingerprint=self.fingerprint))
        for old in self.checkpoint_paths()[:-self.keep_checkpoints]:
            old.unlink()
        return path

    def load_checkpoint(self) -> tuple[dict, dict] | None:
        """The newest checkpoint, or None for a fresh run; refuses one made with other settings."""
        paths = self.checkpoint_paths()
        if not paths:
            return None
        arrays, values = load_npz(paths[-1])
        theirs, ours = flatten(values.get("fingerprint", {})), flatten(self.fingerprint)
        if theirs != ours:
            diff = [f"{k}={theirs.get(k)!r} there, {ours.get(k)!r} here" for k in sorted(set(theirs) | set(ours))
                    if theirs.get(k) != ours.get(k)]
            raise CheckpointMismatch(f"the checkpoint {paths[-1]} was made with other settings ({'; '.join(diff)}); "
                                     f"resume with the settings in {self.path / 'config.yaml'} or start a new run")
        return arrays, values

    def save_best(self, arrays: dict, values: dict) -> None:
        save_npz(self.path / "best_policy.npz", arrays, values)

    # --- metrics ------------------------------------------------------------
    def log(self, metrics: dict, line: str | None = None) -> None:
        """Append ``metrics`` (with an ``iteration``) and print ``line``, by default ES's progress line."""
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps(metrics) + "\n")
        if self._tensorboard:
            writer = self._tensorboard_writer(metrics["iteration"])
            step = metrics.get("timesteps", metrics["iteration"])
            for key, value in metrics.items():
                if key not in ("iteration", "timesteps") and _scalar(value):
                    writer.add_scalar(key, value, global_step=step)
            writer.flush()
        self.console.print(progress_line(metrics) if line is None else line)

    def _tensorboard_writer(self, iteration: int):
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter
            # purge_step drops events a crashed run wrote after its last checkpoint
            self._writer = SummaryWriter(str(self.path / "tensorboard"), purge_step=iteration or None)
        return self._writer

    def read_metrics(self) -> list[dict]:
        if not self.metrics_path.exists():
            return []
        return [json.loads(line) for line in self.metrics_path.read_text().splitlines() if line.strip()]

    def truncate_metrics(self, after_iteration: int) -> None:
        """Forget iterations a crashed run logged after its last checkpoint."""
        kept = [m for m in self.read_metrics() if m["iteration"] <= after_iteration]
        text = "".join(json.dumps(m) + "\n" for m in kept)
        atomic_write(self.metrics_path, lambda f: f.write(text.encode()))

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def progress_line(m: dict) -> str:
    def num(key, fmt):
        value = m.get(key)
        return format(value, fmt) if isinstance(value, (int, float)) else "-"
    return (f"[bold]iter {m['iteration']:>5}[/]  steps {num('timesteps', ',')}  "
            f"reward mean {num('reward_mean', '.2f')} max {num('reward_max', '.2f')}  "
            f"eval [bold]{num('eval_reward', '.2f')}[/]  {num('iteration_s', '.2f')} s/iter  "
            f"{num('time_s', '.0f')} s")
