"""fl package."""
