"""Choosing the split: the gateway's view and this machine's figures, the link learnt from the job's own transfers, the epoch's report."""
