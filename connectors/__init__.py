"""Everything that speaks to the outside: sources, the inbox stream, Delta and manifest writers."""
