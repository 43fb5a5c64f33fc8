//! Executor ids reserved in blocks: the id record (driver-pod annotation or ConfigMap)
//! says "ids up to X may be in use", and is written once per block instead of before every
//! round's creates. A restarted service starts above X, so an id is never handed out
//! twice even after a kill -9 in the middle of a block; the ids left unused in the block
//! are skipped, which costs nothing but numbers.
//!
//! A block reaches no further than the executors the targets still lack, and doubles
//! with each reservation, from [`MIN_ID_BLOCK`] to [`MAX_ID_BLOCK`], so a
//! small application writes rarely and a large scale-up writes a handful of times
//! (10,000 executors: 7 writes), while a restart skips at most [`MAX_ID_BLOCK`] ids.

/// The first block: at most one record write per 100 executors.
pub const MIN_ID_BLOCK: u64 = 100;
/// The largest block.
pub const MAX_ID_BLOCK: u64 = 10_000;

/// The ids reserved for one application.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdBlocks {
    /// The highest id the record covers (written and acknowledged).
    reserved: u64,
    /// The next block's size.
    next_block: u64,
}

impl IdBlocks {
    /// Blocks after `recorded`, the id record as read at Start (0 when none).
    pub fn new(recorded: u64) -> Self {
        Self {
            reserved: recorded,
            next_block: MIN_ID_BLOCK,
        }
    }

    /// The highest id the record covers.
    pub fn reserved(&self) -> u64 {
        self.reserved
    }

    /// What the record must say before creates up to `highest` are sent: `None` when
    /// it covers them already, else the end of a new block. The block reaches no further
    /// than the `still_wanted` executors the targets lack (an application at its target
    /// records exactly its highest id) and never beyond `max_executors` (ids past the
    /// lifetime cap are never handed out, so reserving them would only under-report to a
    /// resumed application).
    pub fn to_record(
        &self,
        highest: u64,
        still_wanted: u64,
        max_executors: Option<u64>,
    ) -> Option<u64> {
        if highest <= self.reserved {
            return None;
        }
        let end = highest.saturating_add((self.next_block - 1).min(still_wanted));
        Some(max_executors.map_or(end, |cap| end.min(cap)).max(highest))
    }

    /// The record now says `up_to`: the next block is twice as large.
    pub fn recorded(&mut self, up_to: u64) {
        if up_to > self.reserved {
            self.reserved = up_to;
            self.next_block = self.next_block.saturating_mul(2).min(MAX_ID_BLOCK);
        }
    }
}
