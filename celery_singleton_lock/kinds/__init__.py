"""The lock kinds, on top of the core: the exclusive lease, multi-key leases, and the interval
engine under reader-writer and range locks. Each imports only the core, the errors and the
kinds below it (tests/project/test_layers.py checks)."""
