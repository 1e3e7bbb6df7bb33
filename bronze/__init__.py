"""Bronze layer: raw Kafka records as Delta rows, byte for byte."""
