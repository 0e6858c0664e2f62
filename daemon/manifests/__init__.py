"""The lake's manifests: committed table history and the inbox in; manifest files out (CDM, multi-storage-client,
Kartothek), written atomically and derived from committed state only, behind one interface (`base.LakeManifest`).
"""
