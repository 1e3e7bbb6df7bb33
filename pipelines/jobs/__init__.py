"""Entry points for spark-submit, one per layer."""
