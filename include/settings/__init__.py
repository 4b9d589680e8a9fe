"""Settings: what a run does (run settings) apart from what runs where (deployment settings).

``RunSettings.from_mapping(params)`` is the only way in for a run: it refuses a wrong setting
before any work with a message naming the setting, the value it got and what is accepted, and
binds the run to the ``DeploymentSettings`` read from the environment when the task runs.
"""

from include.settings.deployment import DeploymentSettings, GpuHost, env_name
from include.settings.errors import SettingsError
from include.settings.run import (
    PREPARATION_SETTINGS,
    REPO_ROOT,
    SAMPLE_DATA_DIR,
    RunSettings,
    SourceSettings,
)

__all__ = [
    "PREPARATION_SETTINGS",
    "REPO_ROOT",
    "SAMPLE_DATA_DIR",
    "DeploymentSettings",
    "GpuHost",
    "RunSettings",
    "SettingsError",
    "SourceSettings",
    "env_name",
]
