"""Front ends: protocol adapters between clients and the core (they know nothing of workers)."""
