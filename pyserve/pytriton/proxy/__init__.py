"""PyTriton's ``pytriton.proxy``: only its ``types`` module is part of the user's API."""
