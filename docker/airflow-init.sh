#!/usr/bin/env bash
# One-shot initialisation of the compose stack (service airflow-init), run before any component
# starts. Every step is idempotent, so `docker compose up` may run it again at every start.
#   1. migrate the metadata database (Airflow's and the auth manager's tables);
#   2. create the admin user (FAB auth manager) unless it exists;
#   3. create or update the role avsim-service (exactly what avsim's own REST calls need) and the
#      service account with it, whose login the connection avsim_airflow_api holds;
#   4. create or resize the Airflow pools avsim schedules phases into, from the capacity file;
#   5. create the artifact bucket(s) and prove a component can write there.
# The distributed integration stack (tests/support/distributed.py) runs this script too.
set -euo pipefail

: "${AVSIM_ADMIN_USER:?set AVSIM_ADMIN_USER (docker/new-env.sh writes it to .env)}"
: "${AVSIM_ADMIN_PASSWORD:?set AVSIM_ADMIN_PASSWORD (docker/new-env.sh writes it to .env)}"
: "${AVSIM_SERVICE_USER:?set AVSIM_SERVICE_USER (the login of the connection avsim_airflow_api)}"
: "${AVSIM_SERVICE_PASSWORD:?set AVSIM_SERVICE_PASSWORD (docker/new-env.sh writes it to .env)}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
capacity="${AVSIM_CAPACITY_FILE:-${AIRFLOW__CORE__DAGS_FOLDER:-/opt/airflow/dags}/avsim_capacity.yaml}"

step() { printf '\n== avsim init: %s\n' "$*"; }

step "metadata database"
airflow db migrate

step "admin user ${AVSIM_ADMIN_USER}"
airflow users create \
  --username "${AVSIM_ADMIN_USER}" \
  --password "${AVSIM_ADMIN_PASSWORD}" \
  --firstname avsim --lastname admin \
  --email "${AVSIM_ADMIN_EMAIL:-${AVSIM_ADMIN_USER}@example.com}" \
  --role Admin

step "service account ${AVSIM_SERVICE_USER} (role avsim-service)"
avsim service-role sync --role avsim-service
airflow users create \
  --username "${AVSIM_SERVICE_USER}" \
  --password "${AVSIM_SERVICE_PASSWORD}" \
  --firstname avsim --lastname service \
  --email "${AVSIM_SERVICE_USER}@example.com" \
  --role avsim-service
# A password changed in .env since the account was made: the connection logs in with the new one.
airflow users reset-password --username "${AVSIM_SERVICE_USER}" --password "${AVSIM_SERVICE_PASSWORD}"

step "pools from ${capacity}"
if [[ ! -f "${capacity}" ]]; then
  echo "avsim init: no capacity file at ${capacity}; mount docker/avsim_capacity.yaml there" \
    "(docker-compose.yml does) or set AVSIM_CAPACITY_FILE" >&2
  exit 1
fi
avsim pools sync "${capacity}"

step "artifact store"
python "${here}/ensure_artifact_store.py"

step "done"
