"""Attribute types of a data manifest (seed 001): the seed's own names, and the JDK classes Joda-Convert converts
from strings out of the box, each as the column type lakefeed gives it (daemon/batch/joda.py reads the cells).

Nothing here runs a JVM: a class is known by its name, so a class outside this table cannot be loaded and is
refused at its line of the manifest.
"""

from __future__ import annotations

from typing import Literal

ColumnType = Literal["int8", "int16", "int32", "int64", "float32", "float64", "bool", "char", "string", "decimal",
                     "biginteger", "instant", "date", "local_datetime", "offset_datetime", "zoned_datetime",
                     "duration", "uuid"]

# The seed's names (and Java's primitive and java.lang names), taken in any case as before.
_SHORT: dict[str, ColumnType] = {
    "byte": "int8", "short": "int16", "int": "int32", "integer": "int32", "long": "int64", "float": "float32",
    "double": "float64", "real": "float64", "boolean": "bool", "char": "char", "character": "char",
    "string": "string",
}
# Class names, exactly as Java spells them.
CLASSES: dict[str, ColumnType] = {
    "java.lang.Byte": "int8", "java.lang.Short": "int16", "java.lang.Integer": "int32", "java.lang.Long": "int64",
    "java.lang.Float": "float32", "java.lang.Double": "float64", "java.lang.Boolean": "bool",
    "java.lang.Character": "char", "java.lang.String": "string",
    "java.math.BigDecimal": "decimal", "java.math.BigInteger": "biginteger",
    "java.time.Instant": "instant", "java.time.LocalDate": "date", "java.time.LocalDateTime": "local_datetime",
    "java.time.OffsetDateTime": "offset_datetime", "java.time.ZonedDateTime": "zoned_datetime",
    "java.time.Duration": "duration", "java.util.UUID": "uuid",
}


def column_type(name: str) -> ColumnType | None:
    """The column type an attribute type name gives, or None when lakefeed does not know it."""
    return CLASSES.get(name) if "." in name else _SHORT.get(name.lower())


def known() -> str:
    """The names lakefeed takes, for an error message."""
    packages: dict[str, list[str]] = {}
    for name in CLASSES:
        package, _, simple = name.rpartition(".")
        packages.setdefault(package, []).append(simple)
    classes = ", ".join(f"{p}.{{{','.join(names)}}}" if len(names) > 1 else f"{p}.{names[0]}"
                        for p, names in packages.items())
    return (f"int/Integer, long/Long, double/real/Double, string/String, short, byte, float, boolean, char, or one "
            f"of the JDK classes Joda-Convert converts out of the box: {classes}")
