"""The durable logs: file and object events in (inbox), pushed frames in (spool); ordered records
with dense offsets out, for the stream readers. storage reaches local folders and buckets.
"""
