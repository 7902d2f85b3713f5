"""The HTTP API: one module per area, each an APIRouter that validates, calls the services
below and shapes the answer (the top layer with the app; docs/architecture.md)."""
