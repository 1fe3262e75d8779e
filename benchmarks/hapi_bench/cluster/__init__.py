"""The multi-node store: gateways per storage node, placement and locality, failover."""
