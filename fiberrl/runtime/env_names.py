"""The ``FIBERRL_*`` environment variables that are not settings: what a parent
hands its children (and a cluster backend its jobs), each defined once here.
The settings themselves are ``FIBERRL_<KEY>`` (``runtime.config``), which
takes none of these for one."""
PREFIX = "FIBERRL_"
CONFIG_FILE = "FIBERRL_CONFIG_FILE"                 # the TOML file of settings, instead of ./fiberrl.toml
RUN_SECRET = "FIBERRL_RUN_SECRET"                   # the run's secret (runtime.auth)
RUN_SECRET_FILE = "FIBERRL_RUN_SECRET_FILE"         # or a file that holds it (Slurm, Kubernetes)
RUN_ID = "FIBERRL_RUN_ID"                           # the run's public id, a hash of the secret
PARENT_ADDRESS = "FIBERRL_PARENT_ADDRESS"           # where a job's parent listens
PROCESS_ID = "FIBERRL_PROCESS_ID"                   # the job's id at its parent
RESOLVED_CONFIG = "FIBERRL_RESOLVED_CONFIG"         # the parent's resolved settings, which the job takes
FORWARD_OUTPUT = "FIBERRL_FORWARD_OUTPUT"           # a cluster job sends its stdout/stderr to its parent
RESOURCE_TRACKER = "FIBERRL_RESOURCE_TRACKER"       # the parent's multiprocessing resource tracker
FORK_SERVER_FD = "FIBERRL_FORK_SERVER_FD"           # the local fork server's end of its socket
FORK_SERVER_WITHOUT_MAIN = "FIBERRL_FORK_SERVER_WITHOUT_MAIN"  # the fork server did not import __main__
POD_NAME = "FIBERRL_POD_NAME"                       # a Kubernetes job's own pod, namespace and address
POD_NAMESPACE = "FIBERRL_POD_NAMESPACE"
POD_IP = "FIBERRL_POD_IP"
HOME = "FIBERRL_HOME"                               # fiberrl submit's records (default ~/.fiberrl)

RESERVED = frozenset({CONFIG_FILE, RUN_SECRET, RUN_SECRET_FILE, RUN_ID, PARENT_ADDRESS, PROCESS_ID, RESOLVED_CONFIG,
                      FORWARD_OUTPUT, RESOURCE_TRACKER, FORK_SERVER_FD, FORK_SERVER_WITHOUT_MAIN, POD_NAME,
                      POD_NAMESPACE, POD_IP, HOME})
