"""PyTorch datasets of features: constructors, map and iterable forms, order, resumable positions, shards, prefetch, local compute and cache."""
