"""Workers: run instances of models, fed batches by the core over ZeroMQ."""
