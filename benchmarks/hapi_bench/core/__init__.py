"""What every benchmark shares: its errors and the host's CPU figures (model, busy seconds)."""
