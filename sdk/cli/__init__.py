"""The SDK's commands: hapi plan, hapi cache and hapi materialize."""
