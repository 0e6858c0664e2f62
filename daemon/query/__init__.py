"""Reads of what the lake holds (docs/bitemporal.md): in comes an entity's changelog; out goes its state as at a
system time and as of an event time."""
