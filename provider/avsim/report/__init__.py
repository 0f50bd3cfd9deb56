"""The weekly report: built from the shard summaries of the ledger, written as JSON and HTML."""
