"""Install pylease's SQL schema (the same migrations ``pylease migrate`` applies).

Apps whose own migrations use leases depend on ``("pylease", "0001_install")``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import migrations


def install(apps: Any, schema_editor: Any) -> None:
    from pylease.contrib.django import install as install_schema

    install_schema()


class Migration(migrations.Migration):  # type: ignore[misc]  # Django has no types
    # pylease's migrations run on connections of their own, under their own lock.
    atomic = False
    dependencies: ClassVar[list[tuple[str, str]]] = []
    operations: ClassVar[list[Any]] = [
        migrations.RunPython(install, migrations.RunPython.noop, elidable=False)
    ]
