"""The records around a graph: config, environment, system and failure."""
