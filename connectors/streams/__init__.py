"""Stream readers: the inbox and the spool in; Spark micro-batches of their records out, with the
read position kept in Spark's checkpoint.
"""
