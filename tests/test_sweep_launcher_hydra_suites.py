"""Hydra's own test suites for launcher plugins (``hydra.test_utils.launcher_common_tests``), run
against ``hydra/launcher=fiberrl``: each run a job-backed process of the local backend."""
import pytest
from hydra.test_utils.launcher_common_tests import (BatchedSweeperTestSuite, IntegrationTestSuite,
                                                     LauncherTestSuite)


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
