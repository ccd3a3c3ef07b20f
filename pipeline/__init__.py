"""docscore pipeline: Beam sources, preprocessing, inference, scoring and sinks."""
