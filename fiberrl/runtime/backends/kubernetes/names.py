"""The names the backend and the pods it starts agree on: environment
variables, labels, the container and the run's Secret."""
from __future__ import annotations

import re

from ... import env_names

POD_NAME_ENV = env_names.POD_NAME
POD_NAMESPACE_ENV = env_names.POD_NAMESPACE
POD_IP_ENV = env_names.POD_IP
SECRET_ENV = env_names.RUN_SECRET
SECRET_FILE_ENV = env_names.RUN_SECRET_FILE
# set in every pod by the backend itself, never copied from the parent's environment
POD_SET_ENV = {SECRET_ENV, SECRET_FILE_ENV, POD_NAME_ENV, POD_NAMESPACE_ENV, POD_IP_ENV}
CONFIG_ENV = env_names.RESOLVED_CONFIG

RUN_LABEL = "fiberrl.run"
OWNER_LABEL = "fiberrl.owner"
PROCESS_LABEL = "fiberrl/process"
SUBMITTED_LABEL = "fiberrl.submitted"
CONTAINER = "fiberrl"
SECRET_KEY = "secret"


def secret_name(run: str) -> str:
    return f"fiberrl-{run}"


def label_value(text: str) -> str:
    """``text`` as a label value: at most 63 of [A-Za-z0-9._-], alphanumeric at both ends."""
    value = re.sub(r"[^A-Za-z0-9._-]+", "-", text)[:63]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", value)
