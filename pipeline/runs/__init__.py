"""A finished run's outputs: publishing, summary.json, the history row, the HTML report and run comparison.
Import from the module itself (pipeline.runs.publish, ...); this package re-exports nothing."""
