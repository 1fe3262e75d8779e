"""The two-tier testbed: network namespaces and shaped links, the storage and compute tiers, the data, the clients and the split sweep (`hapi bench`)."""
