"""What a run measures about itself: stage timing, progress, memory, device time, profiles, run stats, CPU tuning.
Import from the module itself (pipeline.telemetry.stats, ...); this package re-exports nothing."""
