"""Everything that speaks to the outside: sources (into the inbox), stream readers (inbox, spool
and Kafka to Spark) and sinks (Delta tables, manifest files), each behind its room's base contract.
"""
