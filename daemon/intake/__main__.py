"""`python -m lakefeed.intake <fd> <daemon pid>`: the intake process (daemon/intake/process.py), without pandas."""

from __future__ import annotations

import sys


class _NoPandas:
    """An import finder that has pandas missing in this process. pyarrow imports pandas the first time it converts
    Python values (lakefeed's constants at import, a JSON push's rows), only to ask whether they are pandas objects:
    36 MiB PSS the intake never uses. Missing, it is taken as not installed. (A None in `sys.modules` would not do:
    pyarrow's compiled import takes what it finds there.)"""

    @staticmethod
    def find_spec(name: str, path: object = None, target: object = None) -> None:
        if name.partition(".")[0] == "pandas":
            raise ModuleNotFoundError(f"No module named {name!r} in the intake process", name=name)


def _run() -> int:
    sys.meta_path.insert(0, _NoPandas)  # before lakefeed's modules are imported
    from lakefeed.intake.process import main

    return main()


if __name__ == "__main__":
    raise SystemExit(_run())
