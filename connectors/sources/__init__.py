"""Sources: landing folders, buckets and their notifications in; inbox records out. Kafka topics
are read as a Spark Python data source (kafka_source) whose fetches kafka_records decodes to Arrow.
"""
