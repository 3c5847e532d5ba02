"""A run's directory: its config, metrics, TensorBoard events, checkpoints
and best policy.

    <run>/config.yaml          the resolved config the run started with
    <run>/metrics.jsonl        one JSON object per iteration
    <run>/tensorboard/         the same scalars as TensorBoard events
    <run>/checkpoints/NNNNNN.npz  everything needed to continue exactly
    <run>/best_policy.npz      the parameters with the best eval reward so far

Files are replaced atomically (written beside, then renamed), so a run killed
at any moment leaves the last complete checkpoint readable.  What happens to
files after that (a disk that fills up, a copy cut short) is met on resume: a
damaged checkpoint is reported and the newest whole one used, a metrics line
that is not one is reported and dropped.
"""
from __future__ import annotations

import json
import math
import os
import re
import tempfile
import zipfile
from pathlib import Path

import numpy as np
from rich.console import Console

CHECKPOINT = re.compile(r"^(\d{6,})\.npz$")
# what a checkpoint's values hold and under which names; upgrade_checkpoint reads every older format as this one
CHECKPOINT_FORMAT = 2
# what atomic_write leaves beside its file when the write is cut short: .<name>.<random>.tmp
UNFINISHED_WRITE = re.compile(r"^\..+\.[A-Za-z0-9_]{8}\.tmp$")


class CheckpointMismatch(ValueError):
    pass


class DamagedFile(ValueError):
    """A run-directory file that cannot be read, or lacks what it should hold;
    the message says what is wrong, not which file (the caller knows that)."""


class NoUsableCheckpoint(ValueError):
    """Every checkpoint of a run is damaged; reported as one line."""


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


def load_npz(path: Path, values_only: bool = False) -> tuple[dict, dict]:
    """(arrays, values) as ``save_npz`` wrote them; raises DamagedFile for a file that does not hold them.
    ``values_only``: the arrays are not read (``{}``), nor checked."""
    path = Path(path)
    if path.stat().st_size == 0:
        raise DamagedFile("empty file")
    if not zipfile.is_zipfile(path):  # np.load would take it for a pickle and say so
        raise DamagedFile("not a whole npz archive (cut short, or overwritten)")
    try:
        with np.load(path, allow_pickle=False) as data:
            blob = data["__values__"] if "__values__" in data.files else None
            arrays = {} if values_only else {k: data[k] for k in data.files if k != "__values__"}
    except (OSError, EOFError, ValueError, zipfile.BadZipFile) as exc:  # a member's bytes changed (a CRC error)
        raise DamagedFile(f"unreadable ({first_line(exc)})") from None
    if blob is None:
        raise DamagedFile("no __values__ in it (not written by fiberrl)")
    try:
        values = json.loads(bytes(blob).decode())
    except ValueError as exc:
        raise DamagedFile(f"its __values__ are not JSON ({first_line(exc)})") from None
    if not isinstance(values, dict):
        raise DamagedFile("its __values__ are not a JSON object")
    return arrays, values


def require(arrays: dict, values: dict, array_names=(), value_names=()) -> None:
    """Raise DamagedFile naming what of ``array_names`` and ``value_names`` a checkpoint lacks."""
    missing = [n for n in array_names if n not in arrays] + [n for n in value_names if n not in values]
    if missing:
        raise DamagedFile(f"no {', '.join(missing)} in it")


def first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0]


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


def upgrade_checkpoint(values: dict) -> dict:
    """A checkpoint's values in today's format (``CHECKPOINT_FORMAT``), whichever fiberrl wrote them: the one
    place that knows how older formats differ.  Settings added since a checkpoint was made are not a change
    of format: its fingerprint lacks them, and ``RunDirectory`` takes each to have had its default (a setting
    is added with the default that does what fiberrl did before it)."""
    version = values.get("format", 1)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise DamagedFile(f"its format is {version!r}, not a format number")
    if version > CHECKPOINT_FORMAT:
        raise DamagedFile(f"it is of format {version}, written by a newer fiberrl than this one (which reads "
                          f"formats up to {CHECKPOINT_FORMAT}); resume it with that version")
    if version == 1:  # PPO counted env steps as global_step where the others say timesteps; POET kept no best
        values = dict(values)
        if "global_step" in values:
            values["timesteps"] = values.pop("global_step")
        values.setdefault("best", -math.inf)
    return dict(values, format=CHECKPOINT_FORMAT)


def checkpoint_files(folder: Path) -> dict[int, Path]:
    """The checkpoints in ``folder`` by iteration, oldest first (none where the folder is missing)."""
    found = sorted((int(m.group(1)), p) for p in Path(folder).glob("*.npz") if (m := CHECKPOINT.match(p.name)))
    return dict(found)


class RunDirectory:
    """``fingerprint``: the settings a checkpoint must have been made with to be
    resumed here (those that change the result), as a JSON-able dict;
    ``defaults``: each setting's default, which a checkpoint made before the
    setting existed is taken to have had; ``tunable``: the settings of the
    fingerprint (``"algo.learning_rate"``) a resume may set anew, going on
    with the new value from the checkpoint (what PBT changes), said in a line."""

    def __init__(self, path, fingerprint: dict, config_yaml: str | None = None, keep_checkpoints: int | None = 3,
                 tensorboard: bool = True, console: Console | None = None, defaults: dict | None = None,
                 tunable: set[str] | frozenset[str] = frozenset()):
        self.path = Path(path)
        self.tunable = frozenset(tunable)
        self.defaults = flatten(json.loads(json.dumps(defaults or {})))
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
        return list(checkpoint_files(self.checkpoints).values())

    def save_checkpoint(self, iteration: int, arrays: dict, values: dict) -> Path:
        path = self.checkpoints / f"{iteration:06d}.npz"
        save_npz(path, arrays, dict(values, fingerprint=self.fingerprint, format=CHECKPOINT_FORMAT))
        if self.keep_checkpoints is not None:
            for old in self.checkpoint_paths()[:-self.keep_checkpoints]:
                old.unlink()
        return path

    def resume(self, check=None) -> tuple[dict, dict] | None:
        """The checkpoint to go on from (None: start from the beginning), with the metrics
        logged after it forgotten: a run that crashed logged iterations its checkpoint does not hold."""
        self._remove_unfinished_writes()
        checkpoint = self.load_checkpoint(check)
        if checkpoint is None and self.read_metrics():
            self.note(f"no checkpoint in {self.checkpoints} yet: the run starts again from its first iteration")
        self.truncate_metrics(after_iteration=-1 if checkpoint is None else checkpoint[1]["iteration"])
        return checkpoint

    def _remove_unfinished_writes(self) -> None:
        """Temporary files of writes that were killed before their rename: nothing reads
        them, and a run resumed again and again would pile them up."""
        found = [p for folder in (self.path, self.checkpoints) for p in sorted(folder.iterdir())
                 if UNFINISHED_WRITE.match(p.name) and p.is_file()]
        for path in found:
            path.unlink()
        if found:
            names = ", ".join(str(p.relative_to(self.path)) for p in found)
            self.note(f"removed {len(found)} temporary file(s) left by writes cut short in {self.path}: {names}")

    def load_checkpoint(self, check=None) -> tuple[dict, dict] | None:
        """The newest checkpoint that is whole, or None for a fresh run; refuses one made with other
        settings.  ``check(arrays, values)`` raises DamagedFile (or KeyError, ValueError, TypeError)
        where a checkpoint lacks what resuming reads.  A damaged one is reported and the one before
        tried; if none is whole, raises NoUsableCheckpoint."""
        paths = self.checkpoint_paths()
        damaged = []
        for path in reversed(paths):
            try:
                arrays, values = self._read_checkpoint(path, check)
            except DamagedFile as exc:
                self.note(f"the checkpoint {path} is damaged: {exc}")
                damaged.append(f"{path.name}: {exc}")
                continue
            if damaged:
                self.note(f"resuming from {path}, the newest checkpoint that is whole")
            return arrays, values
        if damaged:
            raise NoUsableCheckpoint(f"none of the {len(damaged)} checkpoints in {self.checkpoints} can be read "
                                     f"({'; '.join(damaged)}); start the run again in another hydra.run.dir")
        return None

    def _read_checkpoint(self, path: Path, check) -> tuple[dict, dict]:
        arrays, values = load_npz(path)
        values = upgrade_checkpoint(values)
        require(arrays, values, value_names=("fingerprint", "iteration"))
        if not isinstance(values["iteration"], int):
            raise DamagedFile(f"its iteration is {values['iteration']!r}, not a number")
        self._check_fingerprint(path, values["fingerprint"])
        if check is not None:
            try:
                check(arrays, values)
            except DamagedFile:
                raise
            except KeyError as exc:
                raise DamagedFile(f"no {exc.args[0] if exc.args else exc} in it") from None
            except (ValueError, TypeError) as exc:
                raise DamagedFile(first_line(exc)) from None
        return arrays, values

    def _check_fingerprint(self, path: Path, fingerprint) -> None:
        theirs, ours = flatten(fingerprint if isinstance(fingerprint, dict) else {}), flatten(self.fingerprint)
        for key in ours.keys() - theirs.keys():  # settings newer than the checkpoint: it ran as their defaults do
            if key in self.defaults:
                theirs[key] = self.defaults[key]
        retuned = [f"{k}={ours[k]!r} (it ran with {theirs[k]!r})" for k in sorted(self.tunable & theirs.keys())
                   if k in ours and theirs[k] != ours[k]]
        for key in self.tunable:
            theirs.pop(key, None)
            ours.pop(key, None)
        if theirs != ours:
            diff = [f"{k}={theirs.get(k)!r} there, {ours.get(k)!r} here" for k in sorted(set(theirs) | set(ours))
                    if theirs.get(k) != ours.get(k)]
            raise CheckpointMismatch(f"the checkpoint {path} was made with other settings ({'; '.join(diff)}); "
                                     f"resume with the settings in {self.path / 'config.yaml'} or start a new run")
        if retuned:
            self.note(f"going on from {path} with {', '.join(retuned)}")

    def save_best(self, arrays: dict, values: dict) -> None:
        save_npz(self.path / "best_policy.npz", arrays, values)

    # --- metrics ------------------------------------------------------------
    def log(self, metrics: dict, line: str | None = None) -> None:
        """Append ``metrics`` (with an ``iteration``), and print ``line`` when given."""
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps(metrics) + "\n")
        if self._tensorboard:
            writer = self._tensorboard_writer(metrics["iteration"])
            step = metrics.get("timesteps", metrics["iteration"])
            for key, value in metrics.items():  # an event holds its own wall time
                if key not in ("iteration", "timesteps", "wall_time") and _scalar(value):
                    writer.add_scalar(key, value, global_step=step)
            writer.flush()
        if line is not None:
            self.console.print(line)

    def _tensorboard_writer(self, iteration: int):
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter
            # purge_step drops events a crashed run wrote after its last checkpoint
            self._writer = SummaryWriter(str(self.path / "tensorboard"), purge_step=iteration or None)
        return self._writer

    def read_metrics(self) -> list[dict]:
        """The rows of metrics.jsonl, leaving out lines that are not one (``truncate_metrics`` reports them)."""
        return self._parse_metrics()[0]

    def _parse_metrics(self) -> tuple[list[dict], list[str]]:
        """(the rows, a note on each line that is not one)."""
        if not self.metrics_path.exists():
            return [], []
        text = self.metrics_path.read_text(errors="replace")
        lines = text.split("\n")  # not splitlines(): a garbage byte must not split a line, nor shift the numbers
        rows, notes = [], []
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            row = metrics_row(line)
            if row is not None:
                rows.append(row)
            elif number == len(lines):  # no newline after it: cut short by a kill mid-write
                notes.append(f"{self.metrics_path}: dropped its partial last line (line {number}), "
                             f"cut short when the run stopped")
            else:
                notes.append(f"{self.metrics_path}: dropped line {number}, which is not a metrics row")
        return rows, notes

    def truncate_metrics(self, after_iteration: int) -> None:
        """Forget iterations a crashed run logged after its last checkpoint, and lines that are not rows."""
        if not self.metrics_path.exists():
            return
        rows, notes = self._parse_metrics()
        for note in notes:
            self.note(note)
        text = "".join(json.dumps(m) + "\n" for m in rows if m["iteration"] <= after_iteration)
        atomic_write(self.metrics_path, lambda f: f.write(text.encode()))

    def note(self, text: str) -> None:
        """One line on the run's console, taken as it is (a path may hold brackets, which rich reads as markup)."""
        self.console.print(text, markup=False)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def metrics_row(line: str) -> dict | None:
    """The row a metrics.jsonl line holds, or None for one that holds none."""
    try:
        row = json.loads(line)
    except ValueError:
        return None
    iteration = row.get("iteration") if isinstance(row, dict) else None
    return row if isinstance(iteration, int) and not isinstance(iteration, bool) else None

