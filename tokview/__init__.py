"""tokview: token-exact training data for speculative-decoding drafters."""

__version__ = "0.1.0"
