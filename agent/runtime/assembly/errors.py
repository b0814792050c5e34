"""The runtime's own configuration error."""
from __future__ import annotations

from agent.settings import SettingsError


class RuntimeConfigError(SettingsError):
    """The settings are valid one by one but cannot be put together (names the key)."""


__all__ = ["RuntimeConfigError"]
