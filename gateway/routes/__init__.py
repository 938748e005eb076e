"""The HTTP routes (each a recipe over the pipeline) and the app-state container they read."""
