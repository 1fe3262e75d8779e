"""Training epochs through hapi against the raw-object baseline, with the feature cache (`hapi bench --epochs`)."""
