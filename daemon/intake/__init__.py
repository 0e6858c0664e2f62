"""The HTTP port: push requests and S3 webhooks in; validated frames durably in the spool and
202s out (the intake process), other routes passed to the daemon.
"""
