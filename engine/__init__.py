"""kvloop inference engine. Kept light: the sidecar imports engine.control without torch."""
