"""Everything that runs the lakehouse: configuration, Spark, Kafka, I/O, jobs and the CLI."""
