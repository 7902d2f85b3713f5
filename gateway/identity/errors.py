"""Errors of the identity package that several of its modules raise."""


class ConfigurationError(RuntimeError):
    """The identity settings cannot work; the gateway must not start."""
