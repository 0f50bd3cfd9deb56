"""docker-compose.yml as the one source of the production settings, read the way Compose reads it.

The distributed stack (:mod:`tests.support.distributed`) takes its Airflow and avsim settings from
here and nowhere else: the ``x-airflow-env`` block every Airflow service shares, interpolated with
the stack's own secrets (as ``.env`` gives them in Compose), then *localized*: the services' names
and ports (``postgres:5432``, ``redis:6379``, ``s3:9000``, ``airflow-api-server:8080``) become
loopback addresses, and the metadata database's URL names the test server's database. Nothing else
changes; ``tests/unit/test_distributed_settings.py`` checks that.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
#: The services every Airflow component's settings point at, as Compose names them.
SERVICE_ADDRESSES = ("postgres:5432", "redis:6379", "s3:9000", "airflow-api-server:8080")
DB_KEY = "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"

_VAR = re.compile(r"\$\$|\$\{(?P<name>\w+)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}|\$(?P<bare>\w+)")


def interpolate(text: str, env: Mapping[str, str]) -> str:
    """Compose's variable substitution: ${X}, ${X:-default}, ${X-default}, ${X:?error}, $$."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group("name") or m.group("bare")
        op, arg = m.group("op"), m.group("arg")
        value = env.get(name)
        missing = value is None or (value == "" and op is not None and op.startswith(":"))
        if missing and op in ("-", ":-"):
            return arg
        if missing and op in ("?", ":?"):
            raise KeyError(f"{name}: {arg}")
        return value or ""

    return _VAR.sub(sub, text)


def load(variables: Mapping[str, str]) -> dict[str, Any]:
    """docker-compose.yml, interpolated with ``variables`` (what ``.env`` holds in a deployment)."""
    return dict(yaml.safe_load(interpolate(COMPOSE.read_text(), variables)))


def service_env(cfg: Mapping[str, Any], service: str) -> dict[str, str]:
    env = cfg["services"][service].get("environment", {})
    return {k: str(v) for k, v in env.items()}


def shared_env(cfg: Mapping[str, Any]) -> dict[str, str]:
    """The ``x-airflow-env`` block: the settings every Airflow component has."""
    return {k: str(v) for k, v in cfg["x-airflow-env"].items()}


def worker_queues(cfg: Mapping[str, Any]) -> tuple[str, ...]:
    """The queues the compose worker takes (``celery worker --queues a,b,c``)."""
    command = str(cfg["services"]["airflow-worker"]["command"])
    m = re.fullmatch(r"celery worker --queues (\S+)", command)
    if not m:
        raise ValueError(f"airflow-worker's command {command!r} names no --queues")
    return tuple(m.group(1).split(","))


def mounts(cfg: Mapping[str, Any], service: str) -> dict[str, Path]:
    """Container path -> the repository folder mounted there (``./dags:/opt/airflow/dags:ro``)."""
    out = {}
    for volume in cfg["services"][service].get("volumes", []):
        source, target = str(volume).split(":")[:2]
        if source.startswith("./"):
            out[target] = ROOT / source[2:]
    return out


@dataclass(frozen=True)
class Loopback:
    """Where the stack's services listen on this machine."""

    #: The test server's database (any driver: the compose file's driver is kept).
    database_url: str
    redis: str  # host:port
    s3: str  # host:port
    api: str  # host:port

    def address(self, service: str) -> str:
        return {
            "redis:6379": self.redis,
            "s3:9000": self.s3,
            "airflow-api-server:8080": self.api,
        }[service]


def localize_database(url: str, test_url: str) -> str:
    """The compose database URL with the test server's host, port, user, password and database; the
    driver stays compose's."""
    from sqlalchemy.engine import make_url

    ours, theirs = make_url(url), make_url(test_url)
    local = ours.set(
        host=theirs.host,
        port=theirs.port,
        username=theirs.username,
        password=theirs.password,
        database=theirs.database,
    )
    return local.render_as_string(hide_password=False)


def localize(env: Mapping[str, str], loopback: Loopback) -> dict[str, str]:
    """Compose's settings with loopback addresses: every ``//service:port`` becomes
    ``//127.0.0.1:port``, and the database URL names the test server's database."""
    out = {}
    for key, value in env.items():
        if key == DB_KEY:
            value = localize_database(value, loopback.database_url)
        else:
            for service in SERVICE_ADDRESSES[1:]:
                value = value.replace(f"//{service}", f"//{loopback.address(service)}")
        out[key] = value
    return out
