"""The reference order stream of the contract (docs/orders-stream.md): its generator, the producer
that sends it, and the demo."""
