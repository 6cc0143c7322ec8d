"""Errors that reach the user: each names where the problem is and what was expected."""

from __future__ import annotations


class JigsawError(Exception):
    """Base class of every error jigsaw reports to a user (never shown as a traceback)."""


class ConfigError(JigsawError):
    """A configuration file is wrong: names the file, the field and what was expected."""

    def __init__(self, path: str, field: str, message: str) -> None:
        self.path = str(path)
        self.field = field
        self.message = message
        super().__init__(f"{self.path}: {field}: {message}")


class PlanError(JigsawError):
    """The planner was asked something it cannot answer (not: the demand is too high)."""
