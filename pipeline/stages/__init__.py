"""The job's stages in data order: preprocess -> packing/batching -> inference (and its shadow kernel) -> postprocess/scoring.
Import from the module itself (pipeline.stages.inference, ...); this package re-exports nothing."""
