"""The lake's manifests: committed table history in; manifest files (CDM today) out, written
atomically and derived from committed state only.
"""
