"""The ready-made algorithms as the package ``fiberrl.algos``, in a checkout: the
repository keeps them in its own ``algos/`` folder (one readable file each), which
a wheel installs as ``fiberrl/algos/``, a package Python then imports before this
module.  From the source tree (or an editable install) this module is that package,
its submodules found in the folder."""
from pathlib import Path

__path__ = [str(Path(__file__).resolve().parent.parent / "algos")]
