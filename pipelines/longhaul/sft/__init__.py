"""SFT warm start: teacher trajectory collection, Render-Twice-Diff datasets and veRL SFT overrides."""
