"""The pure decision core (issue #28): rules as functions of plain values.

No SQLAlchemy, no FastAPI, no HTTP client: a module here imports only the standard library,
`gateway.kit`, `adapters.base` and other modules of this package (tests/unit/test_domain_is_pure.py).
"""
