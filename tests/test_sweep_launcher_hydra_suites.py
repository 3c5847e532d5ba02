"""Hydra's own test suites for launcher plugins (``hydra.test_utils.launcher_common_tests``), run
against ``hydra/launcher=fiberrl``: each run a job-backed process of the local backend."""
import pytest
from hydra.core.singleton import Singleton
from hydra.test_utils.launcher_common_tests import (BatchedSweeperTestSuite, IntegrationTestSuite,
                                                     LauncherTestSuite)
from hydra.version import VersionBase

pytestmark = pytest.mark.slow  # the tests here start processes


@pytest.fixture(autouse=True)
def hydras_default_version_base():
    """The suites expect Hydra as a fresh process has it; the app's tests before them leave its
    version base set (``compose(version_base=None)`` is process-wide), which changes ``hydra.job.chdir``."""
    Singleton._instances.pop(VersionBase, None)
    yield


@pytest.mark.parametrize("launcher_name, overrides", [("fiberrl", [])])
class TestFiberrlLauncher(LauncherTestSuite):
    pass


@pytest.mark.parametrize("launcher_name, overrides", [("fiberrl", ["hydra.sweeper.max_batch_size=2"])])
class TestFiberrlLauncherBatched(BatchedSweeperTestSuite):
    pass


@pytest.mark.parametrize("task_launcher_cfg, extra_flags",
                         [({"defaults": [{"override hydra/launcher": "fiberrl"}]}, ["-m"])])
class TestFiberrlLauncherIntegration(IntegrationTestSuite):
    pass
