"""Model definition and weight loading (torch)."""
