"""kvloop sidecar: the feedback coordinator."""
