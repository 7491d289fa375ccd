"""Helpers the tests share: waiting with deadlines, child processes that hold locks,
throwaway Redis topologies, the chaos library."""
