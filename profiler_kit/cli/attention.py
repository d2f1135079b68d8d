"""Commands of this area (being written)."""

COMMANDS: list = []
