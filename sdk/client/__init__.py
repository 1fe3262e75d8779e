"""Talking to gateways: the boto3 client with pushdown requests, endpoints and failover, placement, the control-plane probe, the errors."""
