"""Hooks: avsim's clients of external services, with credentials from Airflow connections."""
