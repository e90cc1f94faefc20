"""cmdc agents on a Ray cluster (extra `ray`). The entry point is `cmdc.ray` (`open_cluster`);
importing this package imports ray, and `import cmdc` never does."""
