"""Generated code of spark.allocator.v1 (see regenerate.sh); do not edit."""
