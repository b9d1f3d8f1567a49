"""The Django app config: every ``manage.py migrate`` brings pylease's schema up to date."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate


class PyleaseConfig(AppConfig):  # type: ignore[misc]  # Django has no types
    name = "pylease.contrib.django"
    label = "pylease"
    verbose_name = "pylease"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Migration 0001 installs the schema once; this applies the SQL migrations a
        # later pylease brings, on every migrate, as `pylease migrate` would.
        post_migrate.connect(_upgrade, sender=self, dispatch_uid="pylease-upgrade")


def _upgrade(sender: Any, *, verbosity: int = 1, stdout: Any = None, **kwargs: Any) -> None:
    if "plan" not in kwargs:
        return  # flush (between tests) sends post_migrate too; nothing was migrated
    from pylease.contrib.django import install

    def say(line: str) -> None:
        if verbosity >= 1 and stdout is not None and line.startswith("applied"):
            stdout.write(f"  pylease: {line}")

    install(say)
