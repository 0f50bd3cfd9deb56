"""The run ledger: a record per attempt and one committed outcome per (case, phase), in the artifact store."""
