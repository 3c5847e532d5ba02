"""How a sweep is going: one table of its runs, refreshed in place on a terminal (plain lines
otherwise), read from each run's ``metrics.jsonl``; written as ``sweep.csv`` at the end."""
from __future__ import annotations

import csv
import json
import math
import sys
import time
from pathlib import Path

COLUMNS = ("job", "overrides", "state", "tries", "iteration", "env_steps", "eval_reward", "best_eval_reward",
           "steps_per_s", "folder", "why")
# seconds between plain progress lines of the running runs (state changes are printed at once)
PLAIN_EVERY = 30.0


class MetricsTail:
    """The last line of a run's ``metrics.jsonl`` and what the lines so far add up to."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0
        self.partial = b""
        self.values = {}
        self.best = None
        self.rate = None
        self._previous = None

    def read(self) -> dict:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                chunk = fh.read()
        except FileNotFoundError:
            return self.values
        self.offset += len(chunk)
        lines = (self.partial + chunk).split(b"\n")
        self.partial = lines.pop()  # a line still being written
        for line in lines:
            try:
                self._take(json.loads(line))
            except ValueError:
                continue
        return self.values

    def _take(self, metrics: dict) -> None:
        steps = metrics.get("timesteps")
        iteration = metrics.get("iteration", metrics.get("update"))
        reward = metrics.get("eval_reward")
        if _number(reward):
            self.best = reward if self.best is None else max(self.best, reward)
        else:
            reward = self.values.get("eval_reward")
        seconds = metrics.get("time_s")
        if _number(steps) and _number(seconds) and self._previous is not None and seconds > self._previous[1]:
            self.rate = (steps - self._previous[0]) / (seconds - self._previous[1])
        if _number(steps) and _number(seconds):
            self._previous = (steps, seconds)
        self.values = {"iteration": iteration, "env_steps": steps, "eval_reward": reward,
                       "best_eval_reward": self.best, "steps_per_s": self.rate}


class SweepTable:
    def __init__(self, runs: list, sweep_dir: Path, mode: str = "auto"):
        self.runs = runs
        self.sweep_dir = sweep_dir
        self.tails = {}
        self.mode = "off" if mode == "off" else ("live" if mode == "auto" and sys.stdout.isatty() else "plain")
        self.live = None
        self.last_plain = time.monotonic()
        if self.mode == "live":
            from rich.live import Live
            self.live = Live(self._render(), refresh_per_second=2, transient=False)
            self.live.start()

    def rows(self) -> list[dict]:
        rows = []
        for run in self.runs:
            tail = self.tails.setdefault(run.num, MetricsTail(run.folder / "metrics.jsonl"))
            rows.append({"job": run.num, "overrides": run.label,
                         "state": run.state + (" (resumed)" if run.resumed and run.state == "running" else ""),
                         "tries": run.tries, **tail.read(), "folder": str(run.folder), "why": run.why})
        return rows

    def changed(self, run) -> None:
        if self.mode == "plain":
            text = f"#{run.num} {run.label}: {run.state}"
            print(text + (f" ({run.why})" if run.why and run.state in ("retrying", "failed") else ""), flush=True)

    def refresh(self) -> None:
        if self.mode == "live":
            self.live.update(self._render())
        elif self.mode == "plain" and time.monotonic() - self.last_plain >= PLAIN_EVERY:
            self.last_plain = time.monotonic()
            for row in self.rows():
                if row["state"].startswith("running"):
                    print(f"#{row['job']} {row['overrides']}: " + _progress(row), flush=True)

    def close(self) -> None:
        rows = self.rows()
        if self.live is not None:
            self.live.update(self._render(rows))
            self.live.stop()
        if not rows:  # a sweep refused before its first run: the folder may be another sweep's, table and all
            return
        with open(self.sweep_dir / "sweep.csv", "w", newline="") as fh:
            writer = csv.DictWriter(fh, COLUMNS, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)

    def _render(self, rows=None):
        from rich.table import Table
        table = Table(title=f"sweep {self.sweep_dir}", title_justify="left")
        for name in ("#", "overrides", "state", "iteration", "env steps", "eval", "best eval", "steps/s"):
            table.add_column(name, justify="left" if name in ("overrides", "state") else "right")
        style = {"done": "green", "failed": "red", "retrying": "yellow", "running": "cyan"}
        for row in rows if rows is not None else self.rows():
            state = row["state"]
            table.add_row(str(row["job"]), row["overrides"], f"[{style.get(state.split()[0], '')}]{state}[/]",
                          _format(row.get("iteration")), _format(row.get("env_steps"), ","),
                          _format(row.get("eval_reward"), ".1f"), _format(row.get("best_eval_reward"), ".1f"),
                          _format(row.get("steps_per_s"), ",.0f"))
        return table


def _progress(row: dict) -> str:
    return (f"iteration {_format(row.get('iteration'))}, {_format(row.get('env_steps'), ',')} steps, "
            f"eval {_format(row.get('eval_reward'), '.1f')} (best {_format(row.get('best_eval_reward'), '.1f')}), "
            f"{_format(row.get('steps_per_s'), ',.0f')} steps/s")


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _format(value, spec: str = "") -> str:
    return format(value, spec) if _number(value) else "-"
