"""lakefeed: keep a data lake current from the files that land in it."""

__version__ = "0.1.0"
