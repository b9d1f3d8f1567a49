"""Django settings for tests/integrations/test_django.py: two PostgreSQL databases named by the
environment (the test creates them), and the pylease app."""

from __future__ import annotations

import os

from psycopg.conninfo import conninfo_to_dict


def _database(variable: str) -> dict[str, object]:
    params = conninfo_to_dict(os.environ[variable])
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": params["dbname"],
        "USER": params.get("user", ""),
        "PASSWORD": params.get("password", ""),
        "HOST": params.get("host", ""),
        "PORT": params.get("port", ""),
    }


SECRET_KEY = "pylease-tests"
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "pylease.contrib.django"]
DATABASES = {
    "default": _database("INTEG_DJANGO_DEFAULT_DSN"),
    "other": _database("INTEG_DJANGO_OTHER_DSN"),
}
