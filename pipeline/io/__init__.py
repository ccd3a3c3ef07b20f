"""Where documents come from and where tables go: shard sources (files, TFDS), table sinks and BigQuery.
Import from the module itself (pipeline.io.sources, ...); this package re-exports nothing."""
