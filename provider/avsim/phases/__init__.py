"""The phase contract, one attempt of a phase, and the fake simulator that honours the contract."""
