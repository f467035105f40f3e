"""Core <-> worker transport: ZeroMQ multipart messages and a shared-memory pool for large tensors."""
