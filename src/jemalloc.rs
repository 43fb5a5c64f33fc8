//! jemalloc's tuning, for the binaries that make it their global allocator (the service's
//! and the benchmarks', so that what a benchmark measures is what the service keeps).

/// How long freed pages stay mapped for reuse before they go back to the kernel.
pub const FREED_MEMORY_DECAY_MS: isize = 1_000;

/// Turns on jemalloc's background purging thread and the decay above, for the arena that
/// exists at start (arena 0, the main thread's) and for those created later.
pub fn return_freed_memory_promptly() -> Result<(), tikv_jemalloc_ctl::Error> {
    use tikv_jemalloc_ctl::{Access, AsName};
    b"arenas.dirty_decay_ms\0"
        .name()
        .write(FREED_MEMORY_DECAY_MS)?;
    b"arenas.muzzy_decay_ms\0".name().write(0_isize)?;
    b"arena.0.dirty_decay_ms\0"
        .name()
        .write(FREED_MEMORY_DECAY_MS)?;
    b"arena.0.muzzy_decay_ms\0".name().write(0_isize)?;
    tikv_jemalloc_ctl::background_thread::write(true)
}
