"""Whether another interpreter (a peer's own environment) can run a benchmark's peer."""
from __future__ import annotations

import subprocess


def missing_imports(python: str, modules: list[str]) -> str | None:
    """None when ``python`` imports every one of ``modules``, else a line saying why not."""
    try:
        done = subprocess.run([python, "-c", f"import {', '.join(modules)}"], capture_output=True, text=True,
                              timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{python} could not be run: {exc}"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no error text)"])[-1]
        return f"{python} cannot import {' and '.join(modules)}: {last}"
    return None
