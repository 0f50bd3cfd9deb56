#!/usr/bin/env bash
# One-shot initialisation of the compose stack (service airflow-init), run before any component
# starts. Every step is idempotent, so `docker compose up` may run it again at every start.
#   1. migrate the metadata database (Airflow's and the auth manager's tables);
#   2. create the admin user (FAB auth manager) unless it exists;
#   3. create or resize the Airflow pools avsim schedules phases into, from the capacity file;
#   4. create the artifact bucket(s) and prove a component can write there.
set -euo pipefail

: "${AVSIM_ADMIN_USER:?set AVSIM_ADMIN_USER (docker/new-env.sh writes it to .env)}"
: "${AVSIM_ADMIN_PASSWORD:?set AVSIM_ADMIN_PASSWORD (docker/new-env.sh writes it to .env)}"
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

step "pools from ${capacity}"
if [[ ! -f "${capacity}" ]]; then
  echo "avsim init: no capacity file at ${capacity}; mount the repository's dags/ at the DAGs folder" \
    "or set AVSIM_CAPACITY_FILE" >&2
  exit 1
fi
avsim pools sync "${capacity}"

step "artifact store"
python /opt/avsim/docker/ensure_artifact_store.py

step "done"
