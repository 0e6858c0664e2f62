"""An entity's micro-batch end to end: a batch of inbox records, frames or messages in; the
Delta commits (quarantine, changelog, table) and the manifests out, exactly once. verify checks the result.
"""
