"""The reference order stream of the spec: its generator, the producer that sends it, and the demo."""
