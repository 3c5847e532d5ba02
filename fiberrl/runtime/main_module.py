"""What a job needs to import its parent's main module, as multiprocessing's
spawn hands it over (the main script's path or module name, sys.path, the
working directory)."""
from __future__ import annotations

import multiprocessing.spawn
import os


def preparation_data(name: str) -> dict:
    prep = multiprocessing.spawn.get_preparation_data(name)
    prep.pop("authkey", None)  # jobs authenticate with the run's secret, not this
    path = prep.get("init_main_from_path")
    if path is not None and not os.path.isfile(path):
        # a script read from stdin ("<stdin>") has no file to import again; its
        # functions travel by value (cloudpickle), so the job can do without it
        del prep["init_main_from_path"]
    return prep
