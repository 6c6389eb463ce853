"""The ground floor: types and facts every layer shares (sequences, batches, sampling parameters, policies,
the engine snapshot, KV statistics, the CPU's capabilities, cache folders). Imports nothing above it and no
torch, so the scheduler, the KV manager, the sidecar and the operator can all stand on it."""
