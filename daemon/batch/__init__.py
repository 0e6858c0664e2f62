"""One micro-batch's rows: landed files, push frames and Kafka values in; discovered partitions,
conformed rows with event time, CDC kinds and quarantine rows out.
"""
