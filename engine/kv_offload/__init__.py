"""The KV memory hierarchy below the device pool: a host tier indexed by the device prefix cache's
block hashes, the cost model that decides reload against recompute, and the block copies a step
runs before its forward pass (docs/engine.md "KV memory hierarchy")."""
