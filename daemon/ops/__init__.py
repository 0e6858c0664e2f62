"""Running the daemon: the CLI and config in; Spark queries per entity, the intake process,
metrics, /status and the page, systemd notifications and reloads out.
"""
