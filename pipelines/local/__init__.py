"""Local infrastructure for development and tests: the Kafka broker, the Spark standalone cluster,
the JVM jars, and the processes they run as."""
