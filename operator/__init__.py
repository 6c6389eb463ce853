"""kvloop operator: kopf handlers and pure rendering functions."""
