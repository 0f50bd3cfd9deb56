#!/usr/bin/env bash
# Write the .env file docker-compose.yml reads its secrets from: random keys and passwords,
# generated once. Usage: docker/new-env.sh [PATH]   (default: .env next to docker-compose.yml)
#
# Refuses to overwrite an existing file: the fernet key encrypts the connections and variables
# stored in the metadata database, so a new key makes them unreadable. Rotate keys as
# docs/deployment.md says.
set -euo pipefail

out="${1:-$(cd "$(dirname "$0")/.." && pwd)/.env}"
if [[ -e "${out}" ]]; then
  echo "${out} exists; not overwriting it (a new AIRFLOW_FERNET_KEY would make stored secrets unreadable)" >&2
  exit 1
fi

umask 077
python3 - "${out}" <<'PY'
import base64
import datetime
import os
import secrets
import sys

token = lambda: secrets.token_urlsafe(32)  # URL- and JSON-safe: it goes into a URL and a JSON connection
values = {
    "POSTGRES_PASSWORD": token(),
    "AIRFLOW_FERNET_KEY": base64.urlsafe_b64encode(os.urandom(32)).decode(),
    "AIRFLOW_JWT_SECRET": token(),
    "AIRFLOW_API_SECRET_KEY": token(),
    "AVSIM_S3_ACCESS_KEY": "avsim",
    "AVSIM_S3_SECRET_KEY": token(),
    "AVSIM_ADMIN_USER": "admin",
    "AVSIM_ADMIN_PASSWORD": token(),
    "AVSIM_SERVICE_USER": "avsim-service",
    "AVSIM_SERVICE_PASSWORD": token(),
}
now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
with open(sys.argv[1], "x") as f:
    f.write(f"# Secrets of the avsim compose stack, written by docker/new-env.sh at {now}.\n")
    f.write("# Keep this file out of version control.\n")
    f.writelines(f"{k}={v}\n" for k, v in values.items())
PY
echo "wrote ${out}; the admin password is AVSIM_ADMIN_PASSWORD in it"
